"""What a run hands back to the Python that started it (experiments.api.train); imports
nothing, so that a rank's or a script's import of it costs nothing."""
from __future__ import annotations

from typing import Any


class TrainResult(int):
    """What `train` hands back, read-only. An int, the exit status (0: complete, 1: failed,
    2: bad input, said in one line, 3: diverged, 130: interrupted), because `raise
    SystemExit(result)` must exit with it: SystemExit given any other object prints it and exits 1. `run_dir`:
    the run directory, absolute (None when the input was refused before one was chosen);
    `summary`: its summary.json on the process that recorded the run, else None."""

    run_dir: str | None
    summary: dict[str, Any] | None

    def __new__(cls, exit_status: int, run_dir: str | None = None,
                summary: dict[str, Any] | None = None) -> TrainResult:
        result = super().__new__(cls, exit_status)
        object.__setattr__(result, "run_dir", run_dir)
        object.__setattr__(result, "summary", summary)
        return result

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"TrainResult is read-only: cannot set {name}")

    @property
    def exit_status(self) -> int:
        return int(self)

    @property
    def status(self) -> str | None:
        """The summary's status word: `complete`, `failed: why`, `diverged: why`, ..."""
        return self._recorded("status")

    @property
    def final_test_error(self) -> float | None:
        return self._recorded("final_test_error")

    @property
    def final_test_loss(self) -> float | None:
        return self._recorded("final_test_loss")

    def _recorded(self, key: str) -> Any:
        return None if self.summary is None else self.summary.get(key)

    def __repr__(self) -> str:
        return f"TrainResult(exit_status={int(self)}, status={self.status!r}, run_dir={self.run_dir!r})"
