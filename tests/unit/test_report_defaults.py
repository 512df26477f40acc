"""The single-run report's defaults fit the run and say what its clock is."""
from __future__ import annotations


def test_a_simulated_runs_curve_is_labelled_virtual_time():
    from plots.curves import time_label
    from rundir.smoothing import window_for

    assert time_label({"backend": "sim"}).startswith("virtual time")
    assert time_label({"backend": "mpi"}) == "wall time (s)"
    assert window_for(1, 160) == 8 and window_for(8, 10_000) == 400  # fits the run


def test_a_summary_says_when_its_seconds_are_virtual_and_an_old_one_reads_as_wall():
    from rundir.summary import clock_of, seconds

    assert seconds(2.5, clock_of({"time_s": 2.5, "clock": "virtual"})) == "2.5 s (virtual)"
    assert seconds(2.5, clock_of({"time_s": 2.5})) == "2.5 s"  # written before the field was kept


def test_a_notebook_reads_a_sweep_as_the_report_does(tmp_path, monkeypatch):
    import json

    import pytest

    from plots import analysis
    from rundir.lock import RunDirError

    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / "index.json").write_text(json.dumps({"window": 40, "points": []}))
    monkeypatch.setattr(analysis, "ROOT", tmp_path)
    monkeypatch.chdir(tmp_path / "sw")  # Jupyter started somewhere else than the repository root
    monkeypatch.setenv("ASGD_SWEEP", "sw")
    monkeypatch.delenv("ASGD_WINDOW", raising=False)
    sweep, window = analysis.notebook_sweep("results/sweeps/none")
    assert sweep.path == (tmp_path / "sw").resolve() and window == 40  # the spec's window, as the report's
    (tmp_path / "sw" / "index.json").write_text('{"points": [')
    with pytest.raises(RunDirError, match="cannot read the sweep index"):
        analysis.load_sweep(tmp_path / "sw")
