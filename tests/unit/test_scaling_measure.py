"""The scaling study reads each run's own measure (plots/scaling.py): a language model's
targets are test losses or its metric, a classifier's test errors; and the speed models
a point ran under name its panel."""
from __future__ import annotations

import json
import math
from pathlib import Path

from plots.analysis import SweepRun
from plots.scaling import final, reached, speeds


def run_dir(path: Path, config: dict, points: list[dict], summary: dict) -> SweepRun:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    (path / "eval.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    (path / "summary.json").write_text(json.dumps(summary))
    return SweepRun("p", "async", 2, 1, "cold", 0, path, "complete")


def curve(column: str, values: list[float]) -> list[dict]:
    return [{"time": float(i), "minibatches": 10 * i, "test_error": math.nan, column: v} for i, v in enumerate(values)]


def test_a_loss_only_run_reaches_its_target_in_loss(tmp_path):
    point = run_dir(tmp_path / "lm", {}, curve("test_loss", [3.0, 2.5, 2.0, 1.9, 1.8, 1.7]),
                    {"final_test_error": math.nan, "final_test_loss": 1.7})
    assert reached(point, 1.95) == (4.0, 40)  # the mean of the last 3: 2.0, 1.9, 1.8
    assert reached(point, 1.5) is None
    assert final(point) == 1.7


def test_a_metric_whose_higher_is_better_is_reached_from_below(tmp_path):
    config = {"metric": "acc.py", "metric_name": "accuracy", "metric_higher_is_better": True}
    point = run_dir(tmp_path / "m", config, curve("test_metric", [0.1, 0.5, 0.7, 0.8, 0.9]),
                    {"final_test_metric": 0.9})
    assert reached(point, 0.65) == (3.0, 30)  # (0.5 + 0.7 + 0.8) / 3
    assert final(point) == 0.9


def test_a_classifier_is_read_in_error_and_a_diverged_final_is_none(tmp_path):
    points = [{"time": float(i), "minibatches": i, "test_error": e, "test_loss": 9.0} for i, e in
              enumerate([0.9, 0.5, 0.3, 0.2])]
    point = run_dir(tmp_path / "c", {}, points, {"final_test_error": None})
    assert reached(point, 0.34) == (3.0, 3)
    assert final(point) is None


def test_speed_models_name_the_panel():
    def point(**settings) -> SweepRun:
        return SweepRun("p", "async", 8, 1, "cold", 0, Path("."), "complete", settings=settings)

    assert speeds(point()) == "equal"
    assert speeds(point(step_sigma=0.5, slow_clients=1)) == "stragglers"
    assert speeds(point(speed_spread=0.1)) == "spread"
    assert speeds(point(client_speeds="1,0.5")) == "spread"
    assert speeds(point(mtbf=100.0)) == "failures"
    assert speeds(point(step_sigma=0.5, mtbf=100.0)) == "stragglers+failures"


def test_a_report_compares_points_whose_drawn_speeds_differ(tmp_path):
    """Each seed draws its clients' speeds (config.json's `speeds_used`, a record, not a
    setting): points of one spec are still one setting; a real setting that differs is not."""
    import pytest

    from experiments.sweep.folder import refuse_mixed
    from rundir.lock import RunDirError

    points = [run_dir(tmp_path / f"s{seed}", {"speed_spread": 0.1, "lr": 0.03, "speeds_used": [1.0, 0.1 + seed / 10]},
                      [], {}) for seed in (0, 1)]
    refuse_mixed(points)
    (tmp_path / "s1" / "config.json").write_text(json.dumps({"speed_spread": 0.1, "lr": 0.05}))
    with pytest.raises(RunDirError, match="the points differ in lr"):
        refuse_mixed(points)



def test_a_report_compares_one_data_module_found_in_two_checkouts(tmp_path):
    """A folder grown from two checkouts records one data file at two absolute paths: the
    same file name, function and fingerprint of what it loaded is one setting; another
    fingerprint, or another file, is not."""
    import pytest

    from experiments.sweep.folder import refuse_mixed
    from rundir.lock import RunDirError

    def config(checkout: str, name: str = "glyphs.py", sha: str = "ec2c") -> dict:
        return {"data": f"/work/{checkout}/examples/{name}:make_data", "model": f"/work/{checkout}/net.py:Net",
                "data_fingerprint": {"train": 60000, "test": 10000, "sample_sha256": sha}}

    points = [run_dir(tmp_path / checkout, config(checkout), [], {}) for checkout in ("a", "b")]
    refuse_mixed(points)
    for other, key in ((config("b", sha="ffff"), "data"), (config("b", name="glyphs2.py"), "data"),
                       ({**config("b"), "model": "/work/b/net2.py:Net"}, "model")):
        (tmp_path / "b" / "config.json").write_text(json.dumps(other))
        with pytest.raises(RunDirError, match=f"the points differ in {key}"):
            refuse_mixed(points)

def test_a_report_compares_points_whose_auto_servers_resolved_apart(tmp_path):
    """`servers = auto` picks each simulated point's count from its costs and K (and records
    a slice's push cost where it picks several): not compared for points that asked auto;
    points that asked counts of their own still are."""
    import pytest

    from experiments.sweep.folder import refuse_mixed
    from rundir.lock import RunDirError

    def config(servers, apply_time, asked="auto") -> dict:
        return {"lr": 0.03, "servers": servers, "sim_apply_time": apply_time,
                "provenance": {"sim": {"servers_asked": asked}}}

    points = [run_dir(tmp_path / "k1", config(1, 0.004), [], {}), run_dir(tmp_path / "k4", config(4, 0.001), [], {})]
    refuse_mixed(points)
    for run, servers in (("k1", 1), ("k4", 4)):
        (tmp_path / run / "config.json").write_text(json.dumps(config(servers, 0.004, asked=servers)))
    with pytest.raises(RunDirError, match="the points differ in servers"):
        refuse_mixed(points)


def test_tuned_sync_is_the_best_lr_and_the_best_backup_count():
    from plots.scaling import _tuned, method

    times = {("spread", "sync, lr 0.08", 16): [10.0, 12.0, 11.0], ("spread", "sync, lr 0.16", 16): [9.0, None, 9.5],
             ("spread", "sync, linear rule", 16): [1.0], ("spread", "sync, lr 0.08, 1 backup", 16): [8.0],
             ("spread", "sync, lr 0.08, 2 backup", 16): [7.0, 7.5], ("equal", "sync, lr 0.08", 16): [2.0]}
    assert _tuned(times, "spread", 16, backup=False) == 9.5  # lr 0.16's median (a miss counts as slowest)
    assert _tuned(times, "spread", 16, backup=True) == 7.25
    assert _tuned(times, "spread", 8, backup=False) is None
    kept_apart = {("spread", "sync, lr 0.08, 1 backup, lr_warmup 0", 16): [5.0]}  # named on by _apart
    assert _tuned(kept_apart, "spread", 16, backup=False) is None
    assert _tuned(kept_apart, "spread", 16, backup=True) == 5.0
    point = SweepRun("sync-c16-n1-cold-s0-backup_workers2-lr0.08", "sync", 16, 1, "cold", 0, Path("."), "complete",
                     settings={"lr": 0.08, "backup_workers": 2})
    assert method(point) == "sync, lr 0.08, 2 backup"


def test_an_empty_table_is_a_sentence():
    from plots.analysis import markdown_table

    assert markdown_table([]) == "(none in this sweep)\n"
    assert markdown_table([{"a": 1, "b": None}]) == "| a | b |\n|---|---|\n| 1 | – |\n"


def test_points_that_differ_in_a_setting_the_name_omits_are_rows_of_their_own():
    """The default's seeds and the same rule at max_staleness 1 share a method name: one
    median over both would mix two methods, so each gets its own row, named by the key."""
    from plots.scaling import _apart

    def point(seed: int, **axes) -> SweepRun:
        settings = {"id": f"p{seed}{axes}", "seed": seed, "rule": "fresh", **axes,
                    "config": {"max_staleness": 0, "rule": "fresh"}}
        return SweepRun(settings["id"], "async", 16, 1, "cold", seed, Path("."), "complete", settings=settings)

    group = {("spread", "async fresh, lr 0.03", 16): [point(0), point(1), point(0, max_staleness=1),
                                                      point(1, max_staleness=1)]}
    rows = _apart(group)
    assert sorted(rows) == [("spread", "async fresh, lr 0.03, max_staleness 0", 16),
                            ("spread", "async fresh, lr 0.03, max_staleness 1", 16)]
    assert all(len(points) == 2 for points in rows.values())
    alike = {("equal", "async fresh", 8): [point(0), point(1)]}
    assert _apart(alike) == alike  # seeds alone: one row, its name unchanged
    # the value the method holds at its other K keeps the plain name (its line goes on)
    group[("spread", "async fresh, lr 0.03", 8)] = [point(2), point(3), point(4)]
    assert sorted(_apart(group)) == [("spread", "async fresh, lr 0.03", 8), ("spread", "async fresh, lr 0.03", 16),
                                     ("spread", "async fresh, lr 0.03, max_staleness 1", 16)]


def test_an_outer_step_the_user_set_names_another_method(tmp_path):
    """Synchronous and asynchronous DiLoCo at the published outer step are rows of their
    own, apart from the tool's default outer step (which sets none)."""
    from plots.scaling import method

    def point(mode, rule, **config):
        return SweepRun("p", mode, 4, 16, "cold", 0, tmp_path, "complete", rule=rule, settings={"config": config})
    assert method(point("local-sgd", "add")) == "local-sgd n16"
    assert method(point("local-sgd", "add", outer_lr=0.7, nesterov_momentum=0.9)) == "local-sgd n16, outer lr 0.7 momentum 0.9"
    assert method(point("async", "nesterov", outer_lr=None, nesterov_momentum=None)) == "async nesterov n16"
    assert method(point("async", "nesterov", nesterov_momentum=0.5)) == "async nesterov n16, outer momentum 0.5"
