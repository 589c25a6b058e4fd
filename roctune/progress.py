"""Progress of a long phase (training steps, reference scoring, evaluation, merging, export, data checks) with a
count and an ETA: a rich bar on a terminal, plain log lines otherwise (CI, pipes, the web UI's log)."""
from __future__ import annotations

import sys
import time

from roctune.interrupts import check

EVERY = 5.0  # seconds before a phase's first line, and between lines (tests set 0 to see every line)


def eta_text(seconds: float) -> str:
    return f"eta {int(seconds // 60)}:{int(seconds % 60):02d}"


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
        check()  # a progress point is a safe point to stop at (roctune.interrupts)
        if self.bar is not None:
            self.bar.update(self.task, completed=done, info=info)
            return
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / max(1, done - self.start) * (self.total - done)
        text = f" {info} " if info else " "
        log(f"{self.label} {done}/{self.total} {text} {eta_text(eta)}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def counted(items, label: str, say, every: float | None = None):
    """Yield from `items` (anything with len and iter); once the phase has run for `every` seconds (default
    EVERY), one line per `every` seconds with the count done and an ETA: `tokenizing 1200/5000  eta 0:41`.
    Phases shorter than that stay silent."""
    every = EVERY if every is None else every
    total = len(items)
    t0 = last = time.perf_counter()
    for i, x in enumerate(items, 1):
        yield x
        check()
        now = time.perf_counter()
        if now - last >= every and i < total:
            last = now
            say(f"{label} {i}/{total}  {eta_text((now - t0) / i * (total - i))}")


class Counted:
    """`items` with len() kept, reporting through `counted` while iterated."""

    def __init__(self, items, label: str, say, every: float | None = None):
        self.items, self.label, self.say, self.every = items, label, say, every

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return counted(self.items, self.label, self.say, self.every)


class Meter:
    """`counted` for work measured apart from the items iterated, such as the bytes of a file read while its
    records stream: call `update(done)` as it goes; the same lines, `checking 310.0/1200.0 MiB  eta 0:41`.
    A hot loop may skip the call while `done < meter.due` (the next thousandth of the total)."""

    def __init__(self, total: int, label: str, say, every: float | None = None, in_bytes: bool = False):
        self.total, self.label, self.say, self.in_bytes = total, label, say, in_bytes
        self.every = EVERY if every is None else every
        self.t0 = self.last = time.perf_counter()
        self.step, self.due = max(1, total // 1000), 0

    def update(self, done: int) -> None:
        check()
        self.due = done + self.step
        now = time.perf_counter()
        if now - self.last < self.every or not 0 < done < self.total:
            return
        self.last = now
        self.say(f"{self.label} {self.amount(done)}  {eta_text((now - self.t0) / done * (self.total - done))}")

    def amount(self, done: int) -> str:
        if not self.in_bytes:
            return f"{done}/{self.total}"
        unit, scale = ("MiB", 2**20) if self.total >= 2**20 else ("KiB", 2**10)
        return f"{done / scale:.1f}/{self.total / scale:.1f} {unit}"
