"""The bench's one way to compare (bench/trials.py): both sides in turn, trial
by trial, summarised by the median of per-trial ratios; an impossible ratio is flagged."""
from __future__ import annotations

import pytest

from bench.trials import ERROR, interleave, ratio_cell, summarise


def test_sides_take_turns_after_the_warm_up_and_the_ratio_is_per_trial():
    calls = []

    def side(name, values):
        values = iter(values)
        return lambda: calls.append(name) or next(values)

    # A machine that slows 10x between trials: each trial's ratio is still 2.
    summary = interleave(side("a", [99, 2, 20, 200]), side("b", [1, 1, 10, 100]), trials=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert summary["ratios"] == [2, 2, 2] and summary["ratio"] == 2
    assert summary["ours"] == [2, 20, 200] and summary["other_median"] == 10
    assert not summary["below_bound"]
    with pytest.raises(ValueError):
        interleave(lambda: 1, lambda: 1, trials=0)


def test_a_median_below_a_lower_bound_is_a_measurement_error():
    impossible = summarise([0.9, 0.95, 1.1], [1.0, 1.0, 1.0], lower_bound=True)
    assert impossible["below_bound"] and ratio_cell(impossible) == f"0.95 ({ERROR})"
    plain = summarise([0.9, 0.95, 1.1], [1.0, 1.0, 1.0])  # a peer is no bound: 0.95 is a result
    assert not plain["below_bound"] and ratio_cell(plain) == "0.95 (0.93-1.02)"


def bench_run(date: str, wire: float, vs_rpc: float, sim: float) -> dict:
    """The parts of an `asgd bench` JSON that carry ratios."""
    return {"machine": {"date": date},
            "wire": [{"floats": 1e6, "vs_bound": summarise([wire], [1.0], True), "apply_vs_copy": summarise([1.5], [1.0])}],
            "server_bound": {"rows": [{"floats": 206922, "clients": 1, "vs_rpc_ps": summarise([vs_rpc], [1.0])}]},
            "peers": [{"system": "ours: async, n_sync 1", "samples_per_s": 3000.0},
                      {"system": "torch DDP (gloo)", "samples_per_s": 3000.0}],
            "simulator": [{"clients": 8, "overhead": summarise([sim], [1.0], True)}]}


def test_compare_lists_every_ratio_of_two_runs_and_the_largest_difference(tmp_path):
    import json

    from bench.compare import compare, read_results
    from asgd.command import main

    first, second = bench_run("day 1", 1.20, 2.0, 1.10), bench_run("day 2", 1.26, 2.6, 1.10)
    text = compare(first, second)
    assert "| wire 1e+06: push+pull / bound | 1.20 | 1.26 | 5% |" in text
    assert "| server-bound 2.07e+05 floats, 1 clients: ours / RPC PS | 2.00 | 2.60 | 30% |" in text
    assert "| peers: ours async n_sync 1 / torch DDP (gloo) | 1.00 | 1.00 | 0% |" in text
    assert text.endswith("4 of 5 ratios within 15%; the largest difference: 30% "
                         "(server-bound 2.07e+05 floats, 1 clients: ours / RPC PS); median 0%.")
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, run in zip(paths, (first, second)):
        path.write_text(json.dumps(run))
    assert read_results(paths[1]) == second
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["bench", "--compare", str(paths[0]), str(tmp_path / "bad.json")]) == 2
