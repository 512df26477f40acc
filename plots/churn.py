"""The churn figure (bench/studies/churn_efficiency.py): training efficiency over a
client's mean time between failures, a line a method, its failure-free efficiency at the
right and the cap the down time alone leaves the default dotted beside it: how much of
what the failures take the method itself adds, by waiting or losing work."""
from __future__ import annotations

import math
from pathlib import Path

from plots.backend import plt
from plots.figures import save


def churn_figure(rows: list[dict], down: float, path: Path) -> list[Path]:
    """`rows`: method, mtbf (inf: no failures), efficiency, low, high, cap (the study's)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    methods = list(dict.fromkeys(row["method"] for row in rows))
    failing = sorted({row["mtbf"] for row in rows if math.isfinite(row["mtbf"])})
    free_x = failing[-1] * 2.5 if failing else 1.0  # where "no failures" stands, right of the longest MTBF
    for i, method in enumerate(methods):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["mtbf"])
        xs = [r["mtbf"] if math.isfinite(r["mtbf"]) else free_x for r in mine]
        ys = [r["efficiency"] for r in mine]
        errors = [[y - r["low"] for y, r in zip(ys, mine)], [r["high"] - y for y, r in zip(ys, mine)]]
        ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=method, color=f"C{i}")
        if i == 0:
            capped = [r for r in mine if math.isfinite(r["mtbf"])]
            ax.plot([r["mtbf"] for r in capped], [r["cap"] for r in capped], ":", color="C0",
                    label=f"{method}: cap from {down:g} down alone")
    ax.set_xscale("log")
    ax.set_xticks([*failing, free_x], [*(f"{m:g}" for m in failing), "none"])
    ax.minorticks_off()
    ax.set_xlabel("a client's mean time between failures (minibatch times)")
    ax.set_ylabel("training efficiency")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, path.with_suffix(""))
