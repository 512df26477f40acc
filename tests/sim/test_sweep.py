"""Sweeps: a grid of runs in subprocesses, an index, resumable after a kill, failures kept."""
from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.parent.tree import descendants, kill_tree
from rundir.layout import RunDir
from rundir.status import finished
from tests.conftest import BIN, start


def spec(tmp_path: Path, data: Path, grid: str, base: str = "", name: str = "s", steps: int = 8) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nbackend = "sim"\ntimeout = 120\nwarm_start = 10\n'
                    f'[base]\nsteps = {steps}\ndata = "{data}"\nbatch_size = 32\neval_samples = 50\n{base}\n'
                    f"[grid]\n{grid}\n")
    return path


def index(out: Path) -> dict:
    return json.loads((out / "index.json").read_text())


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "clients.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("grid,base,expected", [
    ("clients = [1]\nbogus = [1]", "", "unknown key 'bogus'"),
    ("clients = [1]", "clients = 3", "[base] may not set 'clients'"),
    ("clients = 2", "", "must be a non-empty list"),
    ('start = ["tepid"]', "", "start must be cold or warm"),
    ("n_sync = [0]", "", "n_sync: must be at least 1"),
    ('rule = ["magic"]', "", "rule: unknown rule 'magic'"),
    ('momentum = ["lots"]', "", "momentum: expected float"),
])
def test_bad_specs_exit_2_with_one_line(tmp_path, tiny_npz, capsys, grid, base, expected):
    assert main(["sweep", str(spec(tmp_path, tiny_npz, grid, base)), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err


def test_grid_runs_every_point_once_and_indexes_them(small_sweep):
    out = small_sweep
    points = index(out)["points"]
    assert len(points) == 12  # sync ignores n_sync: 2 x 2 x 2 async + 2 x 2 sync
    assert all(finished(p["status"]) for p in points)  # complete, or untrained after 8 steps
    for p in points:
        run = out / p["run"]
        config = json.loads((run / "config.json").read_text())
        assert (config["clients"], config["mode"], config["warm_start"] > 0) == \
            (p["clients"], p["mode"], p["start"] == "warm")
        assert len(rows(run)) == 8 * p["clients"]
    steps = {json.loads((out / p["run"] / "config.json").read_text())["sim_step_time"] for p in points}
    assert steps == {index(out)["sim_step_time"]}  # one measured step time for every point


def test_a_killed_sweep_finishes_only_what_is_missing(tmp_path, tiny_npz):
    out = tmp_path / "out"
    path = spec(tmp_path, tiny_npz, "clients = [1, 2]\nn_sync = [1, 2]", base="eval_every = 5", steps=40)
    command = [str(BIN / "asgd"), "sweep", str(path), "--out", str(out), "--quiet", "--jobs", "2"]
    first = start(command)
    deadline = time.monotonic() + 120
    while not (out / "index.json").exists() or \
            sum(finished(p["status"]) for p in index(out)["points"]) < 2:
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    killed = descendants(first.pid)
    kill_tree(first.pid)
    first.wait()
    done_before = {p["id"]: (out / p["run"] / "summary.json").stat().st_mtime
                   for p in index(out)["points"] if finished(p["status"])}
    assert 2 <= len(done_before) < 4
    # seen once: a point of the killed sweep wrote on; who, and whether it was in the tree
    assert main(["sweep", str(path), "--out", str(out), "--quiet"]) == 0, \
        (f"the sweep's processes at the kill: {killed}; its points' locks now: "
         f"{[RunDir(out / p['run']).lock().holder() for p in index(out)['points']]}")
    for p in index(out)["points"]:
        assert finished(p["status"])
        assert sorted((r["client"], r["step"]) for r in rows(out / p["run"])) == \
            [(c, s) for c in range(p["clients"]) for s in range(1, 41)]  # no minibatch twice
        if p["id"] in done_before:  # finished points were not run again
            assert (out / p["run"] / "summary.json").stat().st_mtime == done_before[p["id"]]


def test_only_runs_its_slice_and_the_same_folder_goes_on_with_the_rest(tmp_path, tiny_npz, capsys):
    out = tmp_path / "out"
    path = spec(tmp_path, tiny_npz, 'clients = [1, 2]\nn_sync = [1, 2]\nmode = ["async", "sync"]', steps=4)
    assert main(["sweep", str(path), "--out", str(out), "--quiet", "--only", "clients=2",
                 "--only", "mode=async"]) == 0
    ran = {(p["clients"], p["n_sync"], p["mode"]) for p in index(out)["points"] if finished(p["status"])}
    assert ran == {(2, 1, "async"), (2, 2, "async")}
    assert {p["status"] for p in index(out)["points"] if p["clients"] == 1 or p["mode"] == "sync"} == {"pending"}
    assert main(["sweep", str(path), "--out", str(out), "--quiet", "--only", "n_sync=2.0,9"]) == 0  # numbers as numbers
    assert sum(finished(p["status"]) for p in index(out)["points"]) == 3  # and (1, 2, async): sync plans n_sync 1 only
    elsewhere = tmp_path / "elsewhere"  # a point run in another folder, its run moved in:
    assert main(["sweep", str(path), "--out", str(elsewhere), "--quiet", "--only", "mode=sync",
                 "--only", "clients=1"]) == 0
    [moved] = [p["run"] for p in index(elsewhere)["points"] if finished(p["status"])]
    (elsewhere / moved).rename(out / moved)
    assert main(["sweep", str(path), "--out", str(out), "--quiet", "--only", "clients=2"]) == 0
    assert [p["run"] for p in index(out)["points"] if finished(p["status"]) and p["clients"] == 1 and
            p["mode"] == "sync"] == [moved]  # indexed as finished, though not of this slice
    assert main(["sweep", str(path), "--out", str(out), "--quiet"]) == 0
    assert all(finished(p["status"]) for p in index(out)["points"])
    capsys.readouterr()
    for bad, said in [("clients", "is not KEY=VALUES"), ("colour=red", "no point has a key 'colour'"),
                      ("clients=3", "no point of the spec's 6 matches clients=3")]:
        assert main(["sweep", str(path), "--out", str(tmp_path / "other"), "--only", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
    assert not (tmp_path / "other").exists()  # refused before the folder was made


def test_a_failed_point_keeps_its_reason_and_is_retried_only_on_request(tmp_path, tiny_npz):
    out = tmp_path / "out"
    failing = spec(tmp_path, tiny_npz, "clients = [2]", base='eval_every = 2\ninject_fault = "0:5"')
    assert main(["sweep", str(failing), "--out", str(out), "--quiet"]) == 1
    [point] = index(out)["points"]
    assert point["status"].startswith("failed: exit 1") and "InjectedFault" in point["status"]
    said = (out / "configs" / f"{point['id']}.stderr").read_text()  # the point's whole stderr, kept
    assert said.startswith(f"asgd: run {out / point['run']} failed: InjectedFault") and "--resume" in said
    fixed = spec(tmp_path, tiny_npz, "clients = [2]", base="eval_every = 2", name="s2")
    assert main(["sweep", str(fixed), "--out", str(out), "--quiet"]) == 1  # not retried
    assert index(out)["points"][0]["status"] == point["status"]
    assert main(["sweep", str(fixed), "--out", str(out), "--quiet", "--retry-failed"]) == 0
    assert len(rows(out / point["run"])) == 16  # resumed from its checkpoint, nothing twice


def test_a_diverged_point_is_finished_not_failed(tmp_path, tiny_npz):
    """Its run exits non-zero (3), as a diverged run does; the sweep records its status."""
    out = tmp_path / "out"
    assert main(["sweep", str(spec(tmp_path, tiny_npz, "clients = [1]", base="lr = 1e9")), "--out", str(out),
                 "--quiet"]) == 0
    [point] = index(out)["points"]
    assert point["status"].startswith("diverged: "), point


def test_report_of_a_sweep_writes_tables_findings_and_figures(small_sweep, tmp_path, capsys):
    assert main(["report", str(small_sweep), "--figures", str(tmp_path / "fig"), "--window", "8"]) == 0
    written = {p.name for p in (tmp_path / "fig").iterdir()}
    assert {"speedups.csv", "speedups.md", "staleness.csv", "findings.json"} <= written
    for stem in ("fig1_single_client", "fig2_cold_start", "fig3_warm_start", "fig4_speedup", "staleness", "modes"):
        assert {f"{stem}.png", f"{stem}.pdf"} <= written
    assert set(json.loads((tmp_path / "fig" / "findings.json").read_text())) == \
        {"cold_start_slowdown", "n_sync_hurts", "warm_start_helps", "speedup_grows"}


def test_grid_tables_name_their_variants_once(tmp_path, tiny_npz, capsys):
    """[[grid]] tables: their union, a point reached by two of them run once, its id naming
    only what departs from the defaults; steps / sqrt(K) each."""
    path = tmp_path / "rules.toml"
    path.write_text(f'name = "rules"\nbackend = "sim"\ntimeout = 120\nwindow = 4\nsteps_per_client = "sqrt"\n'
                    f'[base]\nsteps = 8\ndata = "{tiny_npz}"\nbatch_size = 32\neval_samples = 50\n'
                    f'sim_step_time = 0.01\nrule = "add"\n'
                    f'[[grid]]\nclients = [1, 4]\nrule = ["add", "scaled"]\n'
                    f'[[grid]]\nclients = [4]\nrule = ["scaled"]\nmomentum = [0.9, "auto"]\n'
                    f'[[grid]]\nclients = [4]\nmode = ["sync"]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--quiet"]) == 0
    ids = sorted(p["id"] for p in index(out)["points"])
    assert ids == ["async-c1-n1-cold-s0", "async-c1-n1-cold-s0-scaled", "async-c4-n1-cold-s0",
                   "async-c4-n1-cold-s0-scaled", "async-c4-n1-cold-s0-scaled-mauto", "sync-c4-n1-cold-s0"]
    assert len(rows(out / "runs" / "async-c4-n1-cold-s0-scaled")) == 4 * 4  # ceil(8 / sqrt(4)) each
    config = json.loads((out / "runs" / "async-c4-n1-cold-s0-scaled-mauto" / "config.json").read_text())
    assert config["momentum"] == "auto" and config["momentum_used"] == pytest.approx(0.6)


def test_a_scaling_study_budgets_in_samples_and_reports_against_the_ceiling(tmp_path, tiny_npz):
    """Any config key is an axis; every point's steps come from its budget in samples by
    client count (one process at batch K x b counts as K); the report's tables hold the
    ceiling, the baselines and every method at the spec's own targets."""
    path = tmp_path / "scaling.toml"
    path.write_text(f'name = "scaling"\nbackend = "sim"\ntimeout = 300\nstudy = "scaling"\n'
                    f'targets = [0.7, 0.6]\nevaluations = 6\nsamples = {{ 1 = 1024, 2 = 1536 }}\n'
                    f'[base]\ndata = "{tiny_npz}"\nbatch_size = 32\neval_samples = 76\nrule = "add"\nlr = 0.05\n'
                    f'sim_step_time = 0.01\nsim_apply_time = 0.0001\n'
                    f'[[grid]]\nclients = [1]\nlr = [0.05, 0.1]\n'
                    f'[[grid]]\nclients = [1]\nbatch_size = [64]\nlr = [0.1]\nlr_warmup = [128]\n'
                    f'[[grid]]\nclients = [2]\nmode = ["sync"]\nlr_scaling = ["linear"]\n'
                    f'[[grid]]\nclients = [2]\nmode = ["sync"]\nbackup_workers = [1]\nstep_sigma = [0.5]\n'
                    f'slow_clients = [1]\n'
                    f'[[grid]]\nclients = [2]\nrule = ["add", "easgd"]\nstep_sigma = [0.5]\nslow_clients = [1]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--quiet"]) == 0
    points = {p["id"]: p for p in index(out)["points"]}
    assert sorted(points) == sorted([
        "async-c1-n1-cold-s0", "async-c1-n1-cold-s0-lr0.1", "async-c1-n1-cold-s0-batch_size64-lr0.1-lr_warmup128",
        "sync-c2-n1-cold-s0-lr_scalinglinear", "sync-c2-n1-cold-s0-backup_workers1-slow_clients1-step_sigma0.5",
        "async-c2-n1-cold-s0-slow_clients1-step_sigma0.5", "async-c2-n1-cold-s0-easgd-slow_clients1-step_sigma0.5"])
    config = json.loads((out / "runs" / "async-c1-n1-cold-s0-batch_size64-lr0.1-lr_warmup128" / "config.json")
                        .read_text())
    assert (config["steps"], config["eval_every"]) == (1536 // 64, 4)  # batch 64 of base 32: K = 2's budget
    sync = json.loads((out / "runs" / "sync-c2-n1-cold-s0-lr_scalinglinear" / "config.json").read_text())
    assert (sync["steps"], sync["eval_every"]) == (1536 // 64, 4)
    assert len(rows(out / "runs" / "async-c1-n1-cold-s0")) == 1024 // 32
    figures = tmp_path / "fig"
    assert main(["report", str(out), "--figures", str(figures)]) == 0
    table = list(csv.DictReader((figures / "scaling.csv").open()))
    assert {(r["target"], r["speeds"], r["method"]) for r in table} == {
        (t, s, m) for t in ("0.7", "0.6") for s, m in [("equal", "sync, linear rule"), ("stragglers", "sync, 1 backup"),
                                                      ("stragglers", "async add"), ("stragglers", "async easgd")]}
    assert {"speedup", "of_ceiling", "vs_sync", "vs_sync_backup", "diverged", "server_bound", "wire_mb"} <= set(table[0])
    assert all(float(r["wire_mb"]) > 0 for r in table)  # pushes and pulls, or the allreduce's
    ceiling = list(csv.DictReader((figures / "ceiling.csv").open()))
    assert [(r["target"], r["K"], r["tried"]) for r in ceiling] == [("0.7", "2", "1"), ("0.6", "2", "1")]
    assert (figures / "scaling.png").exists() and (figures / "baselines.md").exists()


def test_a_kept_sweep_reports_as_the_original_and_goes_on_running_only_what_it_lacks(small_sweep, tmp_path):
    """scripts/keep_sweep.py: finished runs' config, summary and curve points, nothing
    else; a point unfinished when kept is pending in the copy, and the one point `asgd
    sweep` runs on a copy of it."""
    import shutil
    import subprocess
    import sys

    from plots.analysis import load_sweep
    from tests.conftest import ROOT

    work, kept, again = tmp_path / "work", tmp_path / "kept", tmp_path / "again"
    shutil.copytree(small_sweep, work)
    unfinished = index(work)["points"][3]
    (work / unfinished["run"] / "summary.json").unlink()
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "keep_sweep.py"), str(work), str(kept)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "kept 11 finished runs of 12 points" in done.stdout, done.stderr
    assert {p.name for p in (kept / "runs").iterdir()} == {p["id"] for p in index(work)["points"]} - {unfinished["id"]}
    assert {f.name for f in (kept / "runs" / index(work)["points"][0]["id"]).iterdir()} == \
        {"config.json", "summary.json", "eval.jsonl"}
    original = {p.id: RunDir(p.run).summary() for p in load_sweep(work).points if p.id != unfinished["id"]}
    assert {p.id: RunDir(p.run).summary() for p in load_sweep(kept).points} == original
    assert [p["status"] for p in index(kept)["points"] if p["id"] == unfinished["id"]] == ["pending"]
    (work / index(work)["points"][0]["run"] / "summary.json").unlink()  # a folder that does not hold it
    again_kept = subprocess.run([sys.executable, str(ROOT / "scripts" / "keep_sweep.py"), str(work), str(kept)],
                                capture_output=True, text=True, timeout=60)
    assert "kept 11 finished runs of 12 points" in again_kept.stdout, again_kept.stderr  # the kept run stays
    shutil.copytree(kept, again)
    assert main(["sweep", str(small_sweep.parent / "small.toml"), "--out", str(again), "--quiet"]) == 0
    assert all(finished(p["status"]) for p in index(again)["points"])
    assert {p.name for p in (again / "runs").iterdir() if (p / "clients.jsonl").exists()} == {unfinished["id"]}
