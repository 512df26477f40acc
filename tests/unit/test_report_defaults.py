"""The single-run report's defaults fit the run and say what its clock is."""
from __future__ import annotations


def test_a_simulated_runs_curve_is_labelled_virtual_time():
    from experiments.tensorboard import smoothing_window
    from plots.curves import time_label

    assert time_label({"backend": "sim"}).startswith("virtual time")
    assert time_label({"backend": "mpi"}) == "wall time (s)"
    assert smoothing_window(1, 160) == 8 and smoothing_window(8, 10_000) == 400  # fits the run
