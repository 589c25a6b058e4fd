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
