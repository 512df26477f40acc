"""Commands forked from the preloaded forkserver (experiments/parent/forked.py), as a
sweep starts its points: from several threads at once."""
from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from experiments.parent.forked import Forked


def test_forks_started_and_awaited_from_threads_at_once_each_report_their_exit_status(tmp_path):
    """Without the status lock, 3 of 200 such forks read exit 255 (a sweep's point that
    completed was recorded `failed: exit 255: no message`)."""
    def refused(i: int) -> int:
        command = Forked("experiments.cli", ["train", "--backend", "sim", "--lr", "-1"], tmp_path / f"{i}.stderr")
        return command.wait(timeout=60)

    with ThreadPoolExecutor(4) as pool:
        statuses = Counter(pool.map(refused, range(120)))
    assert statuses == {2: 120}
    assert (tmp_path / "0.stderr").read_text() == "asgd: error: lr: must be positive, got -1.0\n"
