"""One progress bar: drawn by the server's rank on the launching terminal, or by a sweep."""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """A text bar over minibatches, redrawn at most twice a second; silent when quiet."""

    def __init__(self, total: int, quiet: bool = False, stream: TextIO | None = None, label: str = "train",
                 unit: str = "minibatches"):
        # sys.stderr as it is now (not when this module was imported: a test's capture, long closed)
        self.total, self.quiet, self.stream, self.label, self.unit = total, quiet, stream or sys.stderr, label, unit
        self.start = time.monotonic()
        self._last_draw = 0.0
        self.done = 0
        self.closed = False

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
        eta = f"{elapsed * (1 - fraction) / fraction:4.0f} s" if fraction else "   ? s"
        return (f"{self.label} [{bar:<30}] {100 * fraction:3.0f}% {self.done}/{self.total} {self.unit}"
                f"  {elapsed:5.0f} s  ETA {eta} ")

    def close(self, note: str = "") -> None:
        """The bar's last line; a second close draws nothing."""
        if not self.quiet and not self.closed:
            self.closed = True
            self.update(self.done)
            self.stream.write(f"\n{note}\n" if note else "\n")
            self.stream.flush()
