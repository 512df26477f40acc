"""One progress bar, drawn by the server's rank on the launching terminal."""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """A text bar over minibatches, redrawn at most twice a second; silent when quiet."""

    def __init__(self, total: int, quiet: bool = False, stream: TextIO = sys.stderr, label: str = "train"):
        self.total, self.quiet, self.stream, self.label = total, quiet, stream, label
        self.start = time.monotonic()
        self._last_draw = 0.0
        self.done = 0

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if not self.quiet and (now - self._last_draw >= 0.5 or done >= self.total):
            self._last_draw = now
            self.stream.write("\r" + self.line(now - self.start))
            self.stream.flush()

    def line(self, elapsed: float) -> str:
        fraction = min(self.done / self.total, 1.0) if self.total else 1.0
        bar = "#" * int(30 * fraction)
        eta = elapsed * (1 - fraction) / fraction if fraction else float("nan")
        return (f"{self.label} [{bar:<30}] {100 * fraction:3.0f}% {self.done}/{self.total} minibatches"
                f"  {elapsed:5.0f} s  ETA {eta:4.0f} s ")

    def close(self, note: str = "") -> None:
        if not self.quiet:
            self.update(self.done)
            self.stream.write(f"\n{note}\n" if note else "\n")
            self.stream.flush()
