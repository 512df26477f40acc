"""A sweep with backend = "mpi": `asgd sweep` launches one real MPI job per point."""
from __future__ import annotations

import json

import pytest

from experiments.cli import main

pytestmark = pytest.mark.mpi


@pytest.mark.long
def test_an_mpi_sweep_launches_mpiexec_per_point(tmp_path, tiny_npz):
    """An async point (a server rank more) and a sync one, each a real job of its size."""
    path = tmp_path / "mpi.toml"
    path.write_text(f'name = "m"\nbackend = "mpi"\ntimeout = 120\n[base]\nsteps = 4\ndata = "{tiny_npz}"\n'
                    f'batch_size = 32\neval_samples = 50\n[grid]\nclients = [2]\nmode = ["async", "sync"]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--quiet"]) == 0
    points = json.loads((out / "index.json").read_text())["points"]
    assert sorted(p["mode"] for p in points) == ["async", "sync"]
    for p in points:
        run = out / p["run"]
        ranks = json.loads((run / "config.json").read_text())["provenance"]["ranks"]
        assert len(ranks) == p["clients"] + (p["mode"] == "async")  # a real MPI job of the right size
        assert len((run / "clients.jsonl").read_text().splitlines()) == 4 * p["clients"]
