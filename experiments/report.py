"""`asgd report PATH`: a run's summary and curve, or a sweep's tables, findings and figures.

    asgd report runs/<name>                      summary line + training_error.png (in the run's measure)
    asgd report results/sweeps/<name> [--figures DIR] [--window 400] [--target 0.2] [--docs PAGE.md]

For a sweep it writes, into DIR (default: the sweep folder's figures/): the speedup
table (time to a target error, speedup against 1 client, efficiency) and the staleness
table as CSV and Markdown, findings.json (which of the paper's findings the sweep
shows, with the numbers), and every figure the sweep has the points for, as PNG and PDF.
A scaling study (a spec with `study = "scaling"`, `make scaling`) gets its own tables
and figure instead: every method's speedup to the spec's fixed targets against the
tuned single client, beside the measured ceiling (plots/scaling.py). A links map (`study
= "links"`, `make scaling-links`) gets its maps: each variant's time to each task's
targets over link bandwidth, against the default on the fastest link (plots/links.py).
A paired sweep (`study = "paired"`, `make codecs`) gets each setting's end against a
reference setting's, seed by seed (plots/paired.py).

With --docs, the same tables (and the findings as a table) also go to one Markdown page
that says which runs they come from: when and where they were measured, at which
commit. The make targets write docs/results/<scale>/<figure>.md, the pages the docs
link to, so no measured number in the docs is copied by hand.
"""
from __future__ import annotations

import sys
from pathlib import Path

from experiments.sweep.folder import refuse_mixed
from plots.curves import plot_run
from plots.rundata import load_json
from rundir.durable import write_json_atomic, write_text_atomic
from rundir.lock import RunDirError
from rundir.measure import recorded_measure
from rundir.smoothing import window_for
from rundir.summary import clock_of, seconds


def report(path: str, window: int | None = None, figures: str | None = None, target: float | None = None,
           docs: str | None = None) -> int:
    """`window` defaults to the sweep spec's (for a single run, a twentieth of its minibatches,
    at most 400); `docs` is a sweep's page."""
    if (Path(path) / "index.json").exists():
        from plots import analysis
        window = window or analysis.load_sweep(path).window
        page = (Path(docs), f"asgd report {path} --docs {docs}") if docs else None
        return _sweep_report(Path(path), window, Path(figures) if figures else Path(path) / "figures", target, page)
    if docs:
        print(f"asgd: error: docs: {path} is a run, not a sweep; --docs writes a sweep's tables", file=sys.stderr)
        return 2
    summary = load_json(path, "summary")
    if not summary:
        print(f"asgd: error: run_dir: {path} has no summary.json (not a finished run?)", file=sys.stderr)
        return 2
    if not isinstance(summary.get("status"), str):
        raise RunDirError(f"{Path(path) / 'summary.json'} is not a run's summary (it has no status)")
    measure = recorded_measure(path)
    minibatches, time_s, final = (_number(summary, key) for key in ("minibatches", "time_s", f"final_{measure.key}"))
    window = window or window_for(1, int(minibatches or 1))  # fits the run, as TensorBoard's
    png = plot_run(path, Path(path) / "training_error.png", window)
    print(f"{path}: {summary['status']}; {measure.name} {final if final is None else f'{final:.4f}'}"
          + ("" if minibatches is None or time_s is None else
             f"; {minibatches} minibatches in {seconds(time_s, clock_of(summary))}"))
    print(f"figure: {png}")
    return 0


def _number(summary: dict, key: str) -> float | None:
    """A summary's number (a failed run's summary may lack it: None)."""
    value = summary.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _sweep_report(sweep_dir: Path, window: int, out: Path, target: float | None,
                  page: tuple[Path, str] | None = None) -> int:
    from plots import analysis, figures, links, paired, scaling

    sweep = analysis.load_sweep(sweep_dir)
    refuse_mixed(sweep.points)
    out.mkdir(parents=True, exist_ok=True)
    if scaling.is_scaling_sweep(sweep):
        return _scaling_report(sweep, window, out, page)
    if links.is_links_sweep(sweep):
        return _links_report(sweep, window, out, page)
    if paired.is_paired_sweep(sweep):
        return _paired_report(sweep, window, out, page)
    start = analysis.default_start(sweep)
    sections = {}
    try:
        rows = analysis.speedups(sweep, target=target, start=start, window=window)
        analysis.write_table(rows, out / "speedups.csv", out / "speedups.md")
        print((out / "speedups.md").read_text())
        sections[f"Speedups ({start} start)"] = analysis.markdown_table(rows)
    except ValueError as missing:  # no 1-client run to measure speedup against
        print(f"speedups: skipped ({missing})")
    staleness = analysis.staleness_table(sweep)
    analysis.write_table(staleness, out / "staleness.csv", out / "staleness.md")
    sections["Staleness"] = analysis.markdown_table(staleness)
    found = analysis.findings(sweep, window)
    write_json_atomic(out / "findings.json", found)
    sections["The paper's findings"] = analysis.markdown_table(
        [{"finding": e.get("claim", key), "holds": _VERDICT[e["holds"]], "evidence": e["evidence"]}
         for key, e in found.items()])
    if page:
        write_docs_page(page[0], sweep, window, sections, page[1])
    written = [page[0]] if page else []
    for stem, draw in _figures(sweep, window, target, start).items():
        try:
            written += figures.save(draw(), out / stem)
        except ValueError as missing:  # the sweep lacks the points this figure needs
            print(f"{stem}: skipped ({missing})")
    for key, entry in found.items():
        print(f"- {entry.get('claim', key)}: {_VERDICT[entry['holds']]}. {entry['evidence']}")
    print("written:", ", ".join(str(p) for p in written))
    return 0


def _scaling_report(sweep, window: int, out: Path, page: tuple[Path, str] | None = None) -> int:
    """The scaling study: the ceiling and the single client's grid, the table of every
    method, and the speedup figure."""
    from plots import analysis, figures, scaling

    rows, base = scaling.scaling_table(sweep), scaling.baselines(sweep)
    caps = [{"target": t, "K": k, **v} for t in scaling.targets(sweep) for k, v in scaling.ceiling(sweep, t).items()]
    equal = scaling.equal_samples_table(sweep)
    tables = {"ceiling": caps, "baselines": base, "scaling": rows, "equal_samples": equal}
    for stem, table in tables.items():
        analysis.write_table(table, out / f"{stem}.csv", out / f"{stem}.md")
    print((out / "ceiling.md").read_text())
    print((out / "scaling.md").read_text())
    written = [out / f"{stem}.md" for stem in tables]
    if page:
        written.append(write_docs_page(page[0], sweep, window, {
            "The ceiling C(K)": analysis.markdown_table(caps),
            "The single client and the ceiling's runs": analysis.markdown_table(base),
            "Every method": analysis.markdown_table(rows),
            "At equal samples": analysis.markdown_table(equal)}, page[1],
            columns="plots/scaling.py (module docstring, `scaling_table`, `ceiling`, `baselines`, "
                    "`equal_samples_table`)"))
    try:
        written += figures.save(scaling.fig_scaling(sweep, rows), out / "scaling")
    except ValueError as missing:
        print(f"scaling: skipped ({missing})")
    print("written:", ", ".join(str(p) for p in written))
    return 0


RAN = "The runs (those that ran; a variant, task or K not listed did not)"


def _links_report(sweep, window: int, out: Path, page: tuple[Path, str] | None = None) -> int:
    """The links map: per task and K, the maps, the bytes, every cell's numbers and the
    runs they come from (plots/links.py), as CSV and Markdown, and on the page."""
    from plots import analysis, links

    sections = {**{f"Map: {name}": rows for name, rows in links.map_tables(sweep).items()},
                **{f"Bytes: {name}": rows for name, rows in links.bytes_tables(sweep).items()},
                "The variants": links.variants_table(sweep), "Every cell": links.cell_table(sweep),
                RAN: links.runs_table(sweep)}
    analysis.write_table(sections["Every cell"], out / "cells.csv", out / "cells.md")
    analysis.write_table(sections[RAN], out / "runs.csv", out / "runs.md")
    return _sections_report(sweep, window, out, page, sections, out / "maps.md", [out / "cells.md", out / "runs.md"],
                            "plots/links.py (module docstring, `map_tables`, `cell_table`)")


def _sections_report(sweep, window: int, out: Path, page: tuple[Path, str] | None, sections: dict[str, list[dict]],
                     markdown: Path, also: list[Path], columns: str) -> int:
    """A study's tables under their headings: one Markdown file of them all (printed), and
    the page."""
    from plots import analysis

    text = {heading: analysis.markdown_table(rows) for heading, rows in sections.items()}
    markdown.write_text("".join(f"## {heading}\n\n{table}\n" for heading, table in text.items()), encoding="utf-8")
    print(markdown.read_text())
    written = [markdown, *also]
    if page:
        written.append(write_docs_page(page[0], sweep, window, text, page[1], columns=columns))
    print("written:", ", ".join(str(p) for p in written))
    return 0


_VERDICT = {True: "holds", False: "does not hold", None: "not tested"}


def write_docs_page(path: Path, sweep, window: int, sections: dict[str, str], command: str,
                    columns: str = "plots/analysis.py (`speedups`, `staleness_table`, `findings`)") -> Path:
    """One Markdown page of a sweep's tables, headed by where its numbers come from; written
    atomically, its folder made first."""
    times = "virtual seconds (the simulator)" if sweep.meta.get("backend") == "sim" else "wall seconds"
    text = [f"# {sweep.name}: the tables", "",
            f"Written by `{command}`; do not edit: rerun it to regenerate. {_measured(sweep)} "
            f"Scale: {sweep.meta.get('scale', 'not recorded')}; smoothing window {window} minibatches; "
            f"times in {times}. The columns are defined in {columns}."]
    for heading, table in sections.items():
        text += ["", f"## {heading}", "", table.rstrip("\n")]
    write_text_atomic(path, "\n".join(text) + "\n")
    return path


def _measured(sweep) -> str:
    """When, where and from which commit the sweep's complete points ran (their provenance)."""
    starts, hosts, commits = [], set(), set()
    for point in sweep.points:
        provenance = load_json(point.run, "config").get("provenance", {})
        starts += [provenance["start_time"]] if provenance.get("start_time") else []
        hosts.update(provenance.get("hosts", []))
        commits.update([str(provenance["git_commit"])[:7]] if provenance.get("git_commit") else [])
    parts = [f"started {_stamp(min(starts))} to {_stamp(max(starts))}"] if starts else []
    parts += [f"on {', '.join(sorted(hosts))}"] if hosts else []
    parts += [f"code at commit {', '.join(sorted(commits))}"] if commits else []
    where = ", ".join(parts or ["provenance not recorded"])
    return f"{len(sweep.points)} complete runs of `{sweep.path.name}`, {where}."


def _stamp(start_time: str) -> str:
    """A provenance start time, YYYY-MM-DDTHH:MM:SS+HHMM (local time and offset), as YYYY-MM-DD HH:MM +HHMM."""
    return f"{start_time[:10]} {start_time[11:16]} {start_time[19:]}".rstrip()


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


def _paired_report(sweep, window: int, out: Path, page: tuple[Path, str] | None = None) -> int:
    """A paired sweep: each setting against the reference, seed by seed (plots/paired.py)."""
    from plots import paired

    return _sections_report(sweep, window, out, page, paired.sections(sweep), out / "paired.md", [],
                            "plots/paired.py (module docstring, `paired_table`, `display`)")
