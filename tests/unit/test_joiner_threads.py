"""A joiner's share of its node's cores (`asgd join` with `threads` 0): the run's client
ranks recorded on its host and the joiners launched with it, as a client rank shares
its node's cores with the other client ranks there."""
from __future__ import annotations

import json

import pytest

from experiments.rank.joiner import LOCAL_SIZE, _sharing
from rundir.layout import RunDir

RANKS = [{"rank": 0, "role": "server", "host": "a"}, {"rank": 1, "role": "client", "host": "a"},
         {"rank": 2, "role": "client", "host": "b"}, {"rank": 3, "role": "spare", "host": "a"}]


@pytest.fixture
def run(tmp_path, monkeypatch):
    for name in LOCAL_SIZE:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "config.json").write_text(json.dumps({"provenance": {"ranks": RANKS}}))
    return RunDir(tmp_path)


@pytest.mark.parametrize("host, launched, sharing", [("a", None, 3), ("b", None, 2), ("c", None, 1), ("a", "4", 6),
                                                     ("c", "2(x3)", 1)])
def test_a_joiner_shares_its_hosts_cores_with_the_runs_clients_there_and_its_fellow_joiners(run, monkeypatch, host,
                                                                                          launched, sharing):
    """Rank 0, the server, takes no share; a spare computes once admitted; a launcher's
    local size counts the joiners started together (Slurm's "2(x3)" form is not a count)."""
    if launched is not None:
        monkeypatch.setenv("SLURM_NTASKS_PER_NODE", launched)
    assert _sharing(run, host) == sharing
