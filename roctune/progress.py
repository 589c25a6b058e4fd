"""Progress of a long phase (training steps, reference scoring, evaluation) with a count and an ETA: a rich bar
on a terminal, plain log lines otherwise (CI, pipes, the web UI's log)."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, start: int = 0, enabled: bool = True, label: str = "step"):
        self.total = total
        self.t0 = time.perf_counter()
        self.start = start
        self.label = label
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            self.bar = RichProgress(TextColumn(label + " {task.completed}/{task.total}"), BarColumn(),
                                    TextColumn("{task.fields[info]}"), TimeRemainingColumn())
            self.bar.start()
            self.task = self.bar.add_task(label, total=total, completed=start, info="")

    def update(self, done: int, info: str, log) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done, info=info)
            return
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / max(1, done - self.start) * (self.total - done)
        text = f" {info} " if info else " "
        log(f"{self.label} {done}/{self.total} {text} eta {int(eta // 60)}:{int(eta % 60):02d}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def counted(items, label: str, say, every: float = 5.0):
    """Yield from `items` (anything with len and iter); once the phase has run for `every` seconds, one line per
    `every` seconds with the count done and an ETA: `tokenizing 1200/5000  eta 0:41`. Phases shorter than that
    stay silent."""
    total = len(items)
    t0 = last = time.perf_counter()
    for i, x in enumerate(items, 1):
        yield x
        now = time.perf_counter()
        if now - last >= every and i < total:
            last = now
            eta = (now - t0) / i * (total - i)
            say(f"{label} {i}/{total}  eta {int(eta // 60)}:{int(eta % 60):02d}")


class Counted:
    """`items` with len() kept, reporting through `counted` while iterated."""

    def __init__(self, items, label: str, say, every: float = 5.0):
        self.items, self.label, self.say, self.every = items, label, say, every

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return counted(self.items, self.label, self.say, self.every)
