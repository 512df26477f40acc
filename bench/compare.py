"""`asgd bench --compare A.json B.json`: how far two bench runs' ratios are apart.

Whether a ratio repeats is the question every reader of a benchmark has; this answers it
for two runs of `asgd bench` (the same commit twice, on one machine, says how much the
machine alone moves them; two commits, on a quiet machine, whether a change shows).
Every ratio the tables print is listed with both runs' values and their difference
relative to the first; the last line is the largest. Only medians of per-trial ratios
(and the peers' throughput ratios) are compared: a rate alone drifts with the machine.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runconfig.settings import ConfigError


def ratios(results: dict[str, Any]) -> dict[str, float]:
    """Every ratio a bench run reports, by a name that says where it is."""
    found = {}
    for w in results.get("wire", []):
        found[f"wire {w['floats']:.0e}: push+pull / bound"] = w["vs_bound"]["ratio"]
        found[f"wire {w['floats']:.0e}: apply / memcpy"] = w["apply_vs_copy"]["ratio"]
    for x in results.get("server_bound", {}).get("rows", []):
        found[f"server-bound {x['floats']:.3g} floats, {x['clients']} clients: ours / RPC PS"] = x["vs_rpc_ps"]["ratio"]
    peers = [p for p in results.get("peers", []) if "samples_per_s" in p]
    ours = next((p["samples_per_s"] for p in peers if p["system"] == "ours: async, n_sync 1"), None)
    for p in peers:  # the per-trial ratios' median; a run from before the trials were interleaved had one each
        if p["system"] != "ours: async, n_sync 1" and ("vs" in p or ours is not None):
            found[f"peers: ours async n_sync 1 / {p['system']}"] = (p["vs"]["ratio"] if "vs" in p
                                                                     else ours / p["samples_per_s"])
    for x in results.get("simulator", []):
        found[f"simulator {x['clients']} clients: sim / compute"] = x["overhead"]["ratio"]
    return found


def read_results(path: Path) -> dict[str, Any]:
    """A bench run's JSON (`asgd bench --out`); ConfigError, one line, when it is not one."""
    try:
        results = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"bench --compare: cannot read {path} ({error})") from None
    if not isinstance(results, dict) or "machine" not in results:
        raise ConfigError(f"bench --compare: {path} is not the JSON of an asgd bench run")
    return results


def compare(first: dict[str, Any], second: dict[str, Any]) -> str:
    """A Markdown table of every ratio in both runs and how far apart they are."""
    a, b = ratios(first), ratios(second)
    common = [name for name in a if name in b]
    if not common:
        raise ConfigError("bench --compare: the two runs have no ratio in common")
    apart = {name: abs(b[name] - a[name]) / a[name] for name in common}
    lines = [f"| ratio | first ({first['machine']['date']}) | second ({second['machine']['date']}) | apart |",
             "|---|---:|---:|---:|"]
    lines += [f"| {name} | {a[name]:.2f} | {b[name]:.2f} | {apart[name]:.0%} |" for name in common]
    worst = max(common, key=apart.get)
    within = sum(apart[name] <= 0.15 for name in common)
    lines += ["", f"{within} of {len(common)} ratios within 15%; the largest difference: {apart[worst]:.0%} ({worst}); "
                  f"median {sorted(apart.values())[len(common) // 2]:.0%}."]
    return "\n".join(lines)
