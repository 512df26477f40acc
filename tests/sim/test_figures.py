"""Sweep analysis and figures on synthetic run directories: exact numbers on hand-made curves,
the paper's findings on sweeps built to show (or contradict) them, and every figure written."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from plots import analysis, figures
from plots.analysis import curve, default_target, findings, load_sweep, speedups, time_to_target

DT = 0.01  # virtual seconds per client minibatch


def write_run(run: Path, config: dict, rows: list[dict], staleness: dict | None = None) -> None:
    """A run directory as the trainer leaves it, from client rows already made."""
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"batch_size": 64, "data": "synthetic", "model": "cnn",
                                                 "backend": "sim", "seed": 0, **config}))
    (run / "clients.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pushes = [{"time": r["time"], "client": r["client"], "version": i + 1, "staleness": r["staleness"],
               "apply_s": 1e-4} for i, r in enumerate(r for r in rows if "staleness" in r)]
    (run / "server.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pushes))
    hist: dict[str, int] = {}
    for p in pushes:
        hist[str(p["staleness"])] = hist.get(str(p["staleness"]), 0) + 1
    values = [p["staleness"] for p in pushes] or [0]
    stats = staleness or {"mean": float(np.mean(values)), "max": max(values), "p50": 0.0, "p90": 0.0,
                          "histogram": hist}
    evals = [{"version": 0, "time": 0.0, "minibatches": m, "test_error": 0.9 - m / (2 * len(rows)),
              "test_loss": 1.0} for m in range(0, len(rows) + 1, max(1, len(rows) // 4))]
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (run / "summary.json").write_text(json.dumps({"status": "complete", "final_test_error": 0.1,
                                                  "time_s": rows[-1]["time"], "minibatches": len(rows),
                                                  "samples": 64 * len(rows), "staleness": stats}))


def write_index(root: Path, points: list[dict], **meta) -> Path:
    index = {"name": root.name, "scale": "proxy", "backend": "sim", "train_size": 60000, **meta, "points": points}
    (root / "index.json").write_text(json.dumps(index))
    return root


def point(mode: str, clients: int, n_sync: int, start: str = "cold", seed: int = 0, status: str = "complete") -> dict:
    pid = f"{mode}-c{clients}-n{n_sync}-{start}-s{seed}"
    return {"id": pid, "mode": mode, "clients": clients, "n_sync": n_sync, "start": start, "seed": seed,
            "run": f"runs/{pid}", "status": status}


def synthetic_error(m: np.ndarray, p: dict, flip: bool) -> np.ndarray:
    """Error decaying with total minibatches m: more clients slow the decay (much less so warm),
    and a larger n_sync raises the floor (lowers it when `flip`)."""
    k, n, warm = p["clients"], p["n_sync"], p["start"] == "warm"
    tau = 40 * (1 + (0.02 if warm else 0.15) * (k - 1)) * (1.1 if p["mode"] != "async" else 1.0)
    floor = 0.1 + (-0.01 if flip else 0.01) * (n - 1) * (k > 1) * (p["mode"] == "async")
    noise = np.random.default_rng(p["seed"] * 100 + k).uniform(-0.01, 0.01, m.size)
    return floor + ((0.4 if warm else 0.9) - floor) * np.exp(-m / tau) + noise


def synthetic_rows(p: dict, flip: bool) -> list[dict]:
    k, n = p["clients"], p["n_sync"]
    steps = math.ceil(200 * (1 + 0.15 * (k - 1)) * 1.3 / k)
    step, client = np.divmod(np.arange(steps * k), k)
    errors = synthetic_error(np.arange(1, steps * k + 1), p, flip)
    rows = []
    for s, c, e in zip(step + 1, client, errors):
        row = {"client": int(c), "step": int(s), "time": s * DT + c * 1e-5, "loss": 2 * e, "error": float(e),
               "samples": 64}
        if p["mode"] == "async" and s % n == 0:
            row.update(version_pulled=int((s // n - 1) * k), staleness=min(int(c), k - 1) if s == n else k - 1)
        rows.append(row)
    return rows


def make_sweep(root: Path, specs: list[dict], flip: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for p in specs:
        if p["status"] == "complete":
            write_run(root / p["run"], {"mode": p["mode"], "clients": p["clients"], "n_sync": p["n_sync"],
                                        "seed": p["seed"], "warm_start": 20 * (p["start"] == "warm")},
                      synthetic_rows(p, flip))
    return write_index(root, specs)


def full_specs() -> list[dict]:
    specs = [point("async", k, n, "cold", s) for k in (1, 2, 4, 8) for n in (1, 4)
             for s in ((0, 1) if n == 1 else (0,))]
    specs += [point("async", k, 1, "warm") for k in (1, 2, 4, 8)]
    specs += [point("sync", 4, 1), point("local-sgd", 4, 4)]
    return specs + [point("async", 16, 1, status="pending"), point("async", 32, 1, status="failed: out of memory")]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return load_sweep(make_sweep(tmp_path_factory.mktemp("full"), full_specs()))


def hand_run(root: Path, p: dict, times: list[float], errors: list[float], batch_size: int = 64) -> None:
    rows = [{"client": 0, "step": i + 1, "time": t, "loss": e, "error": e, "samples": batch_size}
            for i, (t, e) in enumerate(zip(times, errors))]
    write_run(root / p["run"], {"mode": p["mode"], "clients": p["clients"], "n_sync": p["n_sync"],
                                "batch_size": batch_size}, rows)


def test_load_sweep_keeps_complete_points_with_absolute_runs(sweep):
    assert len(sweep.points) == len(full_specs()) - 2
    assert all(p.status == "complete" and p.run.is_absolute() and p.run.is_dir() for p in sweep.points)
    assert sweep.meta["scale"] == "proxy" and "points" not in sweep.meta
    assert [p.seed for p in sweep.select(mode="async", clients=2, n_sync=1, start="cold")] == [0, 1]
    assert sweep.values("clients", mode="async") == [1, 2, 4, 8]


def test_smoothing_and_time_to_target_on_a_known_curve(tmp_path):
    p = point("async", 1, 1)
    hand_run(tmp_path, p, [0.5 * i for i in range(1, 9)], [1, 1, 1, 1, 0.5, 0.2, 0.2, 0.2], batch_size=7500)
    s = load_sweep(write_index(tmp_path, [p]))
    c = curve(s.points[0], window=2)
    np.testing.assert_allclose(c.error, [1, 1, 1, 1, 0.75, 0.35, 0.2, 0.2])
    np.testing.assert_allclose(c.epochs, np.arange(1, 9) / 8)
    assert time_to_target(c, 0.8) == 2.5
    assert time_to_target(c, 0.4) == 3.0
    assert time_to_target(c, 0.1) is None
    assert default_target(s, window=2) == pytest.approx(0.21)


def test_speedup_is_ratio_of_times_to_target(tmp_path):
    specs = [point("async", 1, 1), point("async", 4, 1), point("async", 4, 1, seed=1), point("async", 8, 1)]
    hand_run(tmp_path, specs[0], [0.5 * i for i in range(1, 13)], [1.0] * 5 + [0.0] * 7)
    for p in specs[1:3]:
        hand_run(tmp_path, p, [0.25 * i for i in range(1, 13)], [1.0] * 3 + [0.0] * 9)
    hand_run(tmp_path, specs[3], [0.25 * i for i in range(1, 13)], [1.0] * 12)
    rows = {r["clients"]: r for r in speedups(load_sweep(write_index(tmp_path, specs)), target=0.5, window=1)}
    assert rows[1]["time_to_target"] == 3.0 and rows[1]["speedup"] == 1.0
    assert rows[4]["time_to_target"] == 1.0 and rows[4]["seeds"] == 2 and rows[4]["reached"] == 1.0
    assert rows[4]["speedup"] == pytest.approx(3.0) and rows[4]["efficiency"] == pytest.approx(0.75)
    assert rows[8]["time_to_target"] is None and rows[8]["speedup"] is None and rows[8]["reached"] == 0.0
    no_base = speedups(load_sweep(write_index(tmp_path, specs[1:])), target=0.5, window=1)
    assert [r["speedup"] for r in no_base] == [None, None]


def test_write_table_csv_parses_back_and_markdown_has_a_header(tmp_path, sweep):
    rows = speedups(sweep, start="cold", window=20) + [{"mode": "x", "speedup": None}]
    csv_path, md_path = analysis.write_table(rows, tmp_path / "t.csv", tmp_path / "t.md")
    with csv_path.open(newline="") as f:
        back = list(csv.DictReader(f))
    assert len(back) == len(rows) and float(back[0]["speedup"]) == rows[0]["speedup"]
    assert back[-1]["speedup"] == ""
    lines = md_path.read_text().splitlines()
    assert lines[0].startswith("| mode | n_sync | clients |") and set(lines[1]) <= set("|-")
    assert lines[-1].split(" | ")[0] == "| x" and "–" in lines[-1]
    table = analysis.staleness_table(sweep)
    analysis.write_table(table, tmp_path / "s.csv", tmp_path / "s.md")
    row8 = next(r for r in table if (r["clients"], r["n_sync"]) == (8, 1))
    assert row8["max"] == 7 and row8["runs"] == 3 and sum(row8["histogram"].values()) == row8["pushes"]
    assert "7:" in (tmp_path / "s.md").read_text()


def test_findings_hold_on_a_sweep_built_to_show_them(sweep):
    result = findings(sweep, window=20)
    assert {k: v["holds"] for k, v in result.items()} == dict.fromkeys(analysis.CLAIMS, True), result
    assert all(v["evidence"] and v["claim"] for v in result.values())


def test_n_sync_finding_fails_when_larger_n_sync_is_better(tmp_path):
    flipped = load_sweep(make_sweep(tmp_path, [point("async", k, n) for k in (1, 8) for n in (1, 4)], flip=True))
    assert findings(flipped, window=20)["n_sync_hurts"]["holds"] is False


def test_findings_are_none_without_the_points_they_need(tmp_path):
    lone = load_sweep(make_sweep(tmp_path / "lone", [point("async", 1, 1)]))
    assert {k: v["holds"] for k, v in findings(lone, window=20).items()} == dict.fromkeys(analysis.CLAIMS)
    cold = load_sweep(make_sweep(tmp_path / "cold", [point("async", k, 1) for k in (1, 2, 4)]))
    result = findings(cold, window=20)
    assert result["warm_start_helps"]["holds"] is None and result["n_sync_hurts"]["holds"] is None
    assert result["cold_start_slowdown"]["holds"] is True and result["speedup_grows"]["holds"] is True


@pytest.mark.parametrize("make", [
    lambda s: figures.fig1_single_client(s, window=20),
    lambda s: figures.fig_start(s, "cold", window=20),
    lambda s: figures.fig_start(s, "warm", window=20),
    lambda s: figures.fig4_speedup(s, window=20),
    lambda s: figures.fig4_speedup(s, start="cold", window=20),
    figures.fig_staleness,
    lambda s: figures.fig_modes(s, window=20),
], ids=["fig1", "fig2", "fig3", "fig4", "fig4-cold", "staleness", "modes"])
def test_every_figure_is_written_as_png_and_pdf(tmp_path, sweep, make):
    paths = figures.save(make(sweep), tmp_path / "out" / "figure")  # and closed
    assert [p.suffix for p in paths] == [".png", ".pdf"] and all(p.stat().st_size > 1000 for p in paths)


def test_figures_draw_into_given_axes_without_a_caption(sweep):
    fig, axes = plt.subplots(1, 2)
    try:
        assert figures.fig_start(sweep, "cold", window=20, axes=axes) is fig
        assert figures.fig4_speedup(sweep, ax=axes[0], window=20) is fig and not fig.texts
        with pytest.raises(ValueError, match="needs 4 axes"):
            figures.fig_staleness(sweep, axes=axes)
    finally:
        plt.close(fig)


def with_provenance(sweep_dir: Path, stamps: dict[str, tuple[str, str, str]]) -> None:
    """Give runs the provenance the trainer records: start time, host, commit."""
    for run, (start, host, commit) in stamps.items():
        config = sweep_dir / "runs" / run / "config.json"
        record = json.loads(config.read_text())
        record["provenance"] = {"start_time": start, "hosts": [host], "git_commit": commit}
        config.write_text(json.dumps(record))


def test_docs_page_holds_the_tables_and_says_where_the_runs_ran(tmp_path):
    from experiments.report import report

    specs = [point("async", k, 1) for k in (1, 2, 4)]
    root = make_sweep(tmp_path / "sweep", specs)
    with_provenance(root, {specs[0]["id"]: ("1999-11-30T14:40:02+0000", "vm", "8883ec1f88"),
                           specs[1]["id"]: ("1999-11-30T13:33:58+0000", "vm", "8883ec1f88"),
                           specs[2]["id"]: ("1999-11-30T13:50:00+0000", "node2", "1f6e79e000")})
    page = tmp_path / "docs" / "results" / "proxy" / "starts.md"  # no folder yet: the writer makes it
    assert report(str(root), 20, str(tmp_path / "fig"), None, str(page)) == 0
    text = page.read_text()
    assert text.startswith("# sweep: the tables\n")
    assert f"Written by `asgd report {root} --docs {page}`" in text
    assert "3 complete runs of `sweep`, started 1999-11-30 13:33 +0000 to 1999-11-30 14:40 +0000, " \
           "on node2, vm, code at commit 1f6e79e, 8883ec1." in text
    sweep = load_sweep(root)
    assert "## Staleness\n\n" + analysis.markdown_table(analysis.staleness_table(sweep)) in text
    assert (tmp_path / "fig" / "speedups.md").read_text() in text  # the same table as in results/
    findings_table = text.split("## The paper's findings\n\n")[1]
    assert findings_table.startswith("| finding | holds | evidence |")
    assert findings_table.count("\n| ") == len(analysis.CLAIMS)  # a row per claim below the header
    assert "| time-to-target speedup grows with clients | holds |" in findings_table
    assert "| a warm start removes most of the early slowdown | not tested |" in findings_table
    assert [p.name for p in page.parent.iterdir()] == ["starts.md"]  # no temporary file left


def test_docs_page_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """A failure before the rename (a kill, a full disk) leaves the previous page as it was."""
    import rundir.durable
    from experiments.report import report

    root = make_sweep(tmp_path / "sweep", [point("async", 1, 1), point("async", 2, 1)])
    page = tmp_path / "docs" / "page.md"
    assert report(str(root), 20, str(tmp_path / "fig"), None, str(page)) == 0
    before = page.read_text()

    def crash(*args):
        raise OSError("killed before the rename")
    monkeypatch.setattr(rundir.durable.os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        report(str(root), 10, str(tmp_path / "fig"), None, str(page))
    assert page.read_text() == before and "smoothing window 20 minibatches" in before


def scaling_run(root: Path, p: dict, evals: list[tuple[float, int, float]], summary: dict | None = None) -> dict:
    """A run directory with only what the scaling study reads: its eval rows (time,
    minibatches, test error), config and summary; its index entry."""
    run = root / p["run"]
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"mode": p["mode"], "clients": p["clients"], "seed": p["seed"]}))
    (run / "eval.jsonl").write_text("".join(json.dumps({"version": m, "time": t, "minibatches": m, "test_error": e,
                                                        "test_loss": 1.0}) + "\n" for t, m, e in evals))
    (run / "summary.json").write_text(json.dumps({"status": "complete", "final_test_error": evals[-1][2],
                                                  "time_s": evals[-1][0], **(summary or {})}))
    return p


def test_the_scaling_table_by_hand(tmp_path):
    """Targets reached by the mean of 3 evaluations; the tuned single client is the fastest
    of its lr grid; C(K) in steps; speedups, fractions and ratios in time; the median of
    seeds counts one that never reached as slowest; the docs page holds the tables."""
    from experiments.report import report
    from plots import scaling

    def p(mode, clients, seed=0, **axes):
        entry = point(mode, clients, 1, seed=seed)
        tag = "".join(f"-{k}{v}" for k, v in axes.items())
        return {**entry, "id": entry["id"] + tag, "run": entry["run"] + tag, **axes}

    fall = [0.9, 0.5, 0.3, 0.2, 0.1, 0.1]  # the mean of 3 is <= 0.2 from the 5th evaluation on
    specs = [scaling_run(tmp_path, p("async", 1, lr=0.1), [(10.0 * i, 100 * i, e) for i, e in enumerate(fall)]),
             scaling_run(tmp_path, p("async", 1, lr=0.2), [(20.0 * i, 200 * i, e) for i, e in enumerate(fall)]),
             scaling_run(tmp_path, p("async", 1, batch_size=256, lr=0.4),  # K = 4 at base batch 64
                         [(5.0 * i, 25 * i, e) for i, e in enumerate(fall)]),
             scaling_run(tmp_path, p("sync", 4), [(4.0 * i, 100 * i, e) for i, e in enumerate(fall)]),
             scaling_run(tmp_path, p("sync", 4, step_sigma=0.5), [(8.0 * i, 100 * i, e) for i, e in enumerate(fall)]),
             scaling_run(tmp_path, p("async", 4, step_sigma=0.5, seed=0), [(2.0 * i, 100 * i, e) for i, e in enumerate(fall)],
                         {"server_busy_s": 9.5}),
             scaling_run(tmp_path, p("async", 4, step_sigma=0.5, seed=1), [(3.0 * i, 100 * i, e) for i, e in enumerate(fall)]),
             scaling_run(tmp_path, p("async", 4, step_sigma=0.5, seed=2), [(1.0 * i, 100 * i, 0.5) for i in range(6)])]
    for spec in specs[:3]:
        spec["batch_size"] = spec.get("batch_size", 64)
    root = write_index(tmp_path, specs, study="scaling", targets=[0.2])
    sweep = load_sweep(root)
    assert scaling.ceiling(sweep, 0.2) == {"4": {"ceiling": 4.0, "lr": 0.4, "lr_warmup": None, "steps": 100, "tried": 1}}
    rows = {(r["speeds"], r["method"]): r for r in scaling.scaling_table(sweep)}
    t1 = 40.0  # lr 0.1: the 5th evaluation (index 4) at 10 s apart
    sync = rows[("equal", "sync")]
    assert (sync["speedup"], sync["of_ceiling"]) == (t1 / 16.0, t1 / 16.0 / 4.0)
    async_ = rows[("stragglers", "async add")]
    assert async_["seeds"] == 3 and async_["reached"] == pytest.approx(2 / 3)
    assert async_["time_to_target"] == 12.0 and async_["speedup"] == t1 / 12.0  # median of 8, 12 and never
    assert async_["vs_sync"] == 32.0 / 12.0 and async_["speedup_range"] == "3.33-5.00"
    assert async_["server_bound"] and not sync["server_bound"]  # 9.5 of its 10 s busy
    page = tmp_path / "docs" / "scaling.md"
    assert report(str(root), 20, str(tmp_path / "fig"), None, str(page)) == 0
    text = page.read_text()
    assert "plots/scaling.py" in text and "## The ceiling C(K)" in text and "## Every method" in text
    assert "## At equal samples" in text
    assert (tmp_path / "fig" / "scaling.png").exists()


def test_the_equal_samples_table_by_hand(tmp_path):
    """Medians of the final loss and bytes over seeds, each against tuned sync's at the same
    K and speeds: the sync row of the lowest median loss, not the first."""
    from plots import scaling

    def p(mode, clients, seed=0, **axes):
        entry = point(mode, clients, 1, seed=seed)
        tag = "".join(f"-{k}{v}" for k, v in axes.items())
        return {**entry, "id": entry["id"] + tag, "run": entry["run"] + tag, **axes}

    evals = [(1.0, 100, 0.5), (2.0, 200, 0.2)]
    wire = {"bytes_pushed": 3e6, "bytes_pulled": 1e6}
    specs = [scaling_run(tmp_path, p("async", 1, batch_size=64, lr=0.1), evals),
             scaling_run(tmp_path, p("sync", 4, lr=0.1), evals, {"final_test_loss": 2.0, **wire}),
             scaling_run(tmp_path, p("sync", 4, lr=0.2), evals, {"final_test_loss": 1.6, **wire}),
             *[scaling_run(tmp_path, p("local-sgd", 4, seed=s), evals,
                           {"final_test_loss": loss, "bytes_pushed": b, "bytes_pulled": b})
               for s, loss, b in [(0, 2.4, 1e5), (1, 2.0, 3e5), (2, float("nan"), 2e5)]]]
    sweep = load_sweep(write_index(tmp_path, specs, study="scaling", targets=[0.2]))
    rows = {r["method"]: r for r in scaling.equal_samples_table(sweep)}
    assert set(rows) == {"sync, lr 0.1", "sync, lr 0.2", "local-sgd n1"}
    local = rows["local-sgd n1"]
    # the diverged seed (no finite loss) counts as the worst: the median of 2.0, 2.4 and it
    assert (local["seeds"], local["loss"], local["loss_range"]) == (3, 2.4, "2.000-2.400")
    assert local["x_sync_loss"] == pytest.approx(2.4 / 1.6) and local["wire_mb"] == pytest.approx(0.4)
    assert local["x_sync_bytes"] == pytest.approx(0.4 / 4) and rows["sync, lr 0.2"]["x_sync_loss"] == 1.0


def test_docs_page_is_for_sweeps_only(tmp_path, capsys):
    from experiments.cli import main

    p = point("async", 1, 1)
    hand_run(tmp_path, p, [0.5, 1.0], [1.0, 0.5])
    assert main(["report", str(tmp_path / p["run"]), "--docs", str(tmp_path / "page.md")]) == 2
    assert "--docs writes a sweep's tables" in capsys.readouterr().err and not (tmp_path / "page.md").exists()
