"""`asgd report PATH`: a run's summary and curve, or a sweep's tables, findings and figures.

    asgd report runs/<name>                      summary line + training_error.png
    asgd report results/sweeps/<name> [--figures DIR] [--window 400] [--target 0.2]

For a sweep it writes, into DIR (default: the sweep folder's figures/): the speedup
table (time to a target error, speedup against 1 client, efficiency) and the staleness
table as CSV and Markdown, findings.json (which of the paper's findings the sweep
shows, with the numbers), and every figure the sweep has the points for, as PNG and PDF.
A sweep that varies the update rule (`make rules`) gets the rules table, its summary
per rule and the rules figure instead (plots/rules.py).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from plots.curves import plot_run
from plots.rundata import load_json


def report(path: str, window: int | None = None, figures: str | None = None, target: float | None = None) -> int:
    """`window` defaults to the sweep spec's (400 for a single run)."""
    if (Path(path) / "index.json").exists():
        window = window or json.loads((Path(path) / "index.json").read_text()).get("window", 400)
        return _sweep_report(Path(path), window, Path(figures) if figures else Path(path) / "figures", target)
    window = window or 400
    summary = load_json(path, "summary")
    if not summary:
        print(f"asgd: error: run_dir: {path} has no summary.json (not a finished run?)", file=sys.stderr)
        return 2
    png = plot_run(path, Path(path) / "training_error.png", window)
    error = summary.get("final_test_error")
    print(f"{path}: {summary['status']}; test error {error if error is None else f'{error:.4f}'}; "
          f"{summary['minibatches']} minibatches in {summary['time_s']:.1f} s")
    print(f"figure: {png}")
    return 0


def _sweep_report(sweep_dir: Path, window: int, out: Path, target: float | None) -> int:
    from plots import analysis, figures, rules

    sweep = analysis.load_sweep(sweep_dir)
    out.mkdir(parents=True, exist_ok=True)
    if rules.is_rules_sweep(sweep):
        return _rules_report(sweep, window, out)
    start = analysis.default_start(sweep)
    try:
        rows = analysis.speedups(sweep, target=target, start=start, window=window)
        analysis.write_table(rows, out / "speedups.csv", out / "speedups.md")
        print((out / "speedups.md").read_text())
    except ValueError as missing:  # no 1-client run to measure speedup against
        print(f"speedups: skipped ({missing})")
    analysis.write_table(analysis.staleness_table(sweep), out / "staleness.csv", out / "staleness.md")
    found = analysis.findings(sweep, window)
    (out / "findings.json").write_text(json.dumps(found, indent=2) + "\n")
    written = []
    for stem, draw in _figures(sweep, window, target, start).items():
        try:
            written += figures.save(draw(), out / stem)
        except ValueError as missing:  # the sweep lacks the points this figure needs
            print(f"{stem}: skipped ({missing})")
    for key, entry in found.items():
        verdict = {True: "holds", False: "does not hold", None: "not tested"}[entry["holds"]]
        print(f"- {entry.get('claim', key)}: {verdict}. {entry['evidence']}")
    print("written:", ", ".join(str(p) for p in written))
    return 0


def _rules_report(sweep, window: int, out: Path) -> int:
    """A sweep over update rules (or momentum, jitter, cost profile): the rules table, its
    summary per rule and the speedup figure; the paper's figures need one setting."""
    from plots import analysis, figures, rules

    rows = rules.rules_table(sweep, window)
    analysis.write_table(rows, out / "rules.csv", out / "rules.md")
    analysis.write_table(rules.rules_summary(rows), out / "rules_summary.csv", out / "rules_summary.md")
    print((out / "rules_summary.md").read_text())
    written = [out / "rules.md", out / "rules_summary.md"]
    try:
        written += figures.save(rules.fig_rules(sweep, window, rows), out / "rules")
    except ValueError as missing:
        print(f"rules: skipped ({missing})")
    print("written:", ", ".join(str(p) for p in written))
    return 0


def _figures(sweep, window: int, target: float | None, start: str) -> dict:
    from plots import figures

    return {
        "fig1_single_client": lambda: figures.fig1_single_client(sweep, window),
        "fig2_cold_start": lambda: figures.fig_start(sweep, "cold", window),
        "fig2_cold_start_minibatches": lambda: figures.fig_start(sweep, "cold", window, x="minibatches"),
        "fig3_warm_start": lambda: figures.fig_start(sweep, "warm", window),
        "fig3_warm_start_minibatches": lambda: figures.fig_start(sweep, "warm", window, x="minibatches"),
        "fig4_speedup": lambda: figures.fig4_speedup(sweep, target, start, window=window),
        "staleness": lambda: figures.fig_staleness(sweep),
        "modes": lambda: figures.fig_modes(sweep, window),
    }
