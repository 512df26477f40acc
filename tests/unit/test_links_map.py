"""The links map (`make scaling-links`, plots/links.py): its spec plans the grid the page
promises (tasks x K x bandwidth x variant, each point once), and `asgd report` draws the
map from a sweep folder's records. Structure only, never timings: the fake folder's
curves are written by hand."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.report import report
from experiments.sweep.spec import load_spec
from runconfig.settings import ConfigError

SPEC = Path(__file__).parents[2] / "experiments/configs/proxy/scaling-links.toml"
RATES = [1.25e10, 1.25e9, 1.25e8, 1.25e7]
VARIANTS = ["float32", "int8", "int4", "1 server", "add n4, whole", "add n4, fragments 4"]


def test_the_spec_plans_every_task_k_bandwidth_and_variant():
    spec = load_spec(str(SPEC))
    assert spec.meta["study"] == "links"
    assert spec.meta["tasks"] == {"fashion": {"targets": [0.13, 0.12]}, "glyphs": {"targets": [0.13, 0.12]},
                                  "lm": {"targets": [10.0, 6.5]}}
    cells: dict[tuple, list[str]] = {}
    for p in spec.points:
        key = (p.settings["task"], p.config.clients, p.config.sim_bandwidth)
        for variant in p.settings["variants"]:
            assert (*key, variant) not in cells, p.id
            cells[(*key, variant)] = p.id
    assert set(cells) == {(t, k, r, v) for t in ("fashion", "glyphs", "lm") for k in (8, 32) for r in RATES
                          for v in VARIANTS}
    assert len({p.id for p in spec.points}) == len(spec.points)
    # the LM clips a gathered gradient, so auto sizes one server: "1 server" is its default's point
    lm = [p for p in spec.points if p.settings["task"] == "lm" and "1 server" in p.settings["variants"]]
    assert lm and all(p.settings["variants"] == ["float32", "1 server"] for p in lm)
    fragments = [p.config for p in spec.points if "add n4, fragments 4" in p.settings["variants"]]
    assert {(c.rule, c.n_sync, c.fragments, c.servers) for c in fragments} == {("add", 4, 4, 1)}
    first = spec.points[:12]  # a cut-short sweep answers on Fashion-MNIST at 8, at both ends of the range
    assert {(p.settings["task"], p.config.clients, p.config.sim_bandwidth) for p in first} == \
        {("fashion", 8, 1.25e10), ("fashion", 8, 1.25e7)}
    glyphs = next(p for p in spec.points if p.settings["task"] == "glyphs")
    assert glyphs.id.endswith("-glyphs") and glyphs.config.data == "examples/glyphs.py:make_data"


def test_a_task_is_checked_in_its_own_measure(tmp_path):
    def spec(text: str) -> str:
        path = tmp_path / "s.toml"
        path.write_text(text)
        return str(path)

    lm = '[tasks.lm]\nmetric = "examples/char_lm.py:perplexity"\n'
    with pytest.raises(ConfigError, match="targets must be errors"):
        load_spec(spec('[tasks.a]\ntargets = [10.0]\n[grid]\nclients = [2]\n'))
    load_spec(spec(lm + 'targets = [10.0]\n[grid]\nclients = [2]\n'))
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        load_spec(spec('[tasks.a]\ncolour = 1\n[grid]\nclients = [2]\n'))
    with pytest.raises(ConfigError, match="its tasks among"):
        load_spec(spec('[tasks.a]\n[grid]\ntask = ["b"]\n'))


def _run(folder: Path, name: str, errors: list[float], servers: int, pushed: int) -> str:
    run = folder / "runs" / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"servers": servers, "lr": 0.03}))
    (run / "eval.jsonl").write_text("".join(json.dumps({"time": float(i), "minibatches": 10 * i, "test_error": e})
                                            + "\n" for i, e in enumerate(errors)))
    (run / "summary.json").write_text(json.dumps({"status": "complete", "final_test_error": errors[-1],
                                                  "bytes_pushed": pushed, "server_busy": 0.25}))
    return f"runs/{name}"


def test_the_report_draws_the_map_from_a_sweep_folder(tmp_path):
    folder = tmp_path / "sweep"
    fast, slow = [0.9, 0.4, 0.3, 0.2, 0.1], [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    points = []
    for rate, variant, errors, servers in ((1.25e10, "float32", fast, 2), (1.25e7, "float32", slow, 8),
                                           (1.25e10, "int8", fast, 2), (1.25e7, "int8", [0.9] * 5, 8)):
        name = f"c8-{variant}-{rate:g}"
        points.append({"id": name, "mode": "async", "clients": 8, "n_sync": 1, "seed": 0, "status": "complete",
                       "task": "fashion", "variants": [variant], "sim_bandwidth": rate, "servers": "auto",
                       "run": _run(folder, name, errors, servers, 10**9 if variant == "float32" else 2.5e8)})
    (folder / "index.json").write_text(json.dumps({"name": "links", "backend": "sim", "study": "links",
                                                   "tasks": {"fashion": {"targets": [0.25]}}, "points": points}))
    page = tmp_path / "page.md"
    assert report(str(folder), figures=str(tmp_path / "fig"), docs=str(page)) == 0
    text = page.read_text()
    table = text.split("## Map: fashion, K = 8, target 0.25\n\n")[1].split("\n\n")[0].splitlines()
    assert table[0] == "| bandwidth | float32 | int8 |"
    # the smoothed error reaches 0.25 at t = 4 on the fast curve, 8 on the slow one
    assert table[2:] == ["| 100 Gbps | 1 | 1 |", "| 100 Mbps | 2 | not reached |"]
    assert "## Bytes: fashion, K = 8: MB pushed a run" in text and "| 100 Gbps | 1000 | 250 |" in text
    runs = text.split("## The runs (those that ran; a variant, task or K not listed did not)\n\n")[1].splitlines()
    assert runs[0] == "| task | K | variant | runs | bandwidths | seeds |"
    assert runs[2] == "| fashion | 8 | float32 | 2 | 100 Gbps, 100 Mbps | 0 |"
    assert "| fashion | 8 | 100 Mbps | float32 | 1 | 8 | 0.1 | 8 | 0.25 | 1000 |" in text  # every cell: its servers
