"""`asgd bench`'s Markdown page (docs/results/bench.md under `make bench`): the tables it
prints, headed by when and where they were measured, written whole or not at all into a
folder it makes. No benchmark runs here: the sections are stand-ins with fixed numbers."""
from __future__ import annotations

import json
import sys
import types

import pytest

import rundir.durable
from bench import suite
from bench.trials import summarise

SECTIONS = {
    "wire": [{"floats": 1e6, "mbytes": 4.0, "raw_one_way_ms": 0.271, "round_trip_ms": 0.801, "apply_ms": 0.114,
              "apply_vs_copy": summarise([1.8, 1.7, 1.9], [1.0, 1.0, 1.0], lower_bound=True),
              "vs_bound": summarise([1.2, 1.3, 1.22], [1.0, 1.0, 1.0], lower_bound=True)},
             {"floats": 1.6e7, "mbytes": 64.0, "raw_one_way_ms": 3.2, "round_trip_ms": 11.0, "apply_ms": 4.6,
              "apply_vs_copy": summarise([1.5, 1.4, 1.6], [1.0, 1.0, 1.0], lower_bound=True),
              "vs_bound": summarise([0.9, 0.93, 1.1], [1.0, 1.0, 1.0], lower_bound=True)}],
    "load": [{"servers": 1, "clients": 4, "floats": 1e6, "pushes_per_s": 574.4, "mbytes_per_s": 4594.2,
              "server_busy": 0.95},
             {"servers": 1, "clients": 1, "floats": 206922, "pushes_per_s": 4021.3, "mbytes_per_s": 6656.4,
              "server_busy": 0.38, "server_push_us": {"receive": 75.5, "check": 14.3, "apply": 42.5, "reply": 14.7,
                                                      "record": 12.0, "total": 159.0, "cpu": 150.2}}],
    "idle": {"blocking_cpu_s": 1.38, "polled_cpu_s": 0.03, "speedup": 1.52},
    "server_bound": {"proxy_floats": 206922, "rows": [
        {"clients": k, "floats": size, "ours_pushes_per_s": ours, "rpc_ps_pushes_per_s": rpc,
         "vs_rpc_ps": summarise([ours, ours], [rpc, rpc])}
        for k, size, ours, rpc in ((1, 10**4, 4000, 1000), (1, 206922, 1800, 700), (2, 206922, 1101, 463),
                                   (4, 206922, 900, 500))]},
    "peers": [{"system": "ours: async, n_sync 1", "samples_per_s": 8657.0, "trials": [8657.0, 8500.0, 8800.0],
               "vs": summarise([8657.0, 8500.0, 8800.0], [8657.0, 8500.0, 8800.0]), "rule": "easgd"},
              {"system": "torch DDP (gloo)", "samples_per_s": 9957.0, "trials": [9957.0, 9000.0, 11000.0],
               "vs": summarise([8657.0, 8500.0, 8800.0], [9957.0, 9000.0, 11000.0])}],
    "simulator": [{"clients": 8, "minibatches": 320, "sim_wall_s": 8.41, "compute_s": 8.30,
                   "overhead": summarise([8.41, 8.5, 8.3], [8.3, 8.3, 8.3], lower_bound=True)}],
}


def results(quick: bool = False) -> dict:
    return {"machine": {"cores": 2, "mpi": "MPICH Version: 5.0.2", "quick": quick, "date": "1999-11-30 12:00 UTC",
                        "bench_s": 300.0}, **SECTIONS}


def test_the_page_holds_every_table_under_where_and_when(tmp_path):
    page = suite.write_markdown(tmp_path / "docs" / "results" / "bench.md", results())
    text = page.read_text()
    assert text.startswith("# Benchmarks, as measured\n\nWritten by `asgd bench` (`make bench`) on "
                           "1999-11-30 12:00 UTC in 5 min; do not edit")
    assert "2 cores, MPICH Version: 5.0.2" in text and "smoke run" not in text
    assert suite.tables(results()) + "\n" in text  # exactly what the bench prints
    for row in ("| 1e+06 | 4.0 | 0.271 | 0.801 | 0.114 | 1.80 (1.75-1.85) | 1.22 (1.21-1.26) |",
                "| 1 | 4 | 1e+06 | 574 | 4594 | 95% |", "| 1e+04 | 0.04 | 1 | 4000 | 1000 | 4.00 (4.00-4.00) |",
                "| 2 | 1101 | 463 | 2.38 (2.38-2.38) |", "| 4 | 900 | 500 | 1.80 (1.80-1.80) |",
                "| 1 | 1 | 2.07e+05 | 4021 | 6656 | 38% | 76 + 14 + 42 + 15 + 12 = 159; 150 |",
                "| torch DDP (gloo) | 9957 | 0.87 (0.83-0.91) |", "| 8 | 320 | 8.41 | 8.30 | 1.01 (1.01-1.02) |"):
        assert row in text
    # a median ratio under a physical lower bound is flagged, not reported as a result
    assert "| 0.93 (below the lower bound: measurement error) |" in text
    assert "proxy CNN: 206922 floats" in text and "interquartile range" in text
    assert "ours with --rule easgd" in text  # which server rule the throughput rows measured
    assert [p.name for p in page.parent.iterdir()] == ["bench.md"]  # no temporary file left
    assert "smoke run" in suite.write_markdown(tmp_path / "quick.md", results(quick=True)).read_text()


def test_a_failed_write_leaves_the_previous_page(tmp_path, monkeypatch):
    page = suite.write_markdown(tmp_path / "bench.md", results())
    before = page.read_text()

    def crash(*args):
        raise OSError("killed before the rename")
    monkeypatch.setattr(rundir.durable.os, "replace", crash)
    changed = {**results(), "simulator": [{**SECTIONS["simulator"][0], "sim_wall_s": 99.9}]}
    with pytest.raises(OSError, match="killed"):
        suite.write_markdown(page, changed)
    assert page.read_text() == before


@pytest.fixture
def stand_ins(monkeypatch):
    """Every section returns its fixed numbers; mpi4py is a stand-in that only names the library."""
    for name in ("wire", "load", "server_bound", "peers", "simulator"):
        monkeypatch.setattr(suite, name, lambda quick, name=name: SECTIONS[name])
    monkeypatch.setattr(suite, "idle", lambda scale: SECTIONS["idle"])
    mpi = types.SimpleNamespace(Get_library_version=lambda: "MPICH Version: 5.0.2\nmore")
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=mpi))


def test_run_bench_writes_the_json_and_the_page_beside_it_or_where_told(tmp_path, stand_ins, capsys):
    out = tmp_path / "results" / "bench.json"
    assert suite.run_bench(str(out), quick=False) == 0
    measured = json.loads(out.read_text())
    assert measured["wire"] == SECTIONS["wire"] and measured["machine"]["cores"] and measured["machine"]["date"]
    assert (tmp_path / "results" / "bench.md").read_text().count("\n| ") > 6
    page = tmp_path / "docs" / "results" / "bench.md"
    assert suite.run_bench(str(out), quick=False, markdown=str(page)) == 0
    assert suite.tables(json.loads(out.read_text())) in page.read_text()


def test_a_section_that_fails_writes_no_page(tmp_path, stand_ins, monkeypatch):
    """The JSON keeps what was measured; the page, which the docs link to, is not touched."""
    def broken(quick):
        raise RuntimeError("peers failed")
    monkeypatch.setattr(suite, "peers", broken)
    out, page = tmp_path / "bench.json", tmp_path / "docs" / "bench.md"
    with pytest.raises(RuntimeError):
        suite.run_bench(str(out), quick=True, markdown=str(page))
    assert set(json.loads(out.read_text())) == {"machine", "wire", "load", "idle", "server_bound"}
    assert not page.exists()


def test_only_some_sections_keeps_the_others_measured_before(tmp_path, stand_ins, monkeypatch):
    """`--only`: the sections named are measured again (the one across hosts too), the
    others kept as the JSON has them, and the page shows them all."""
    out = tmp_path / "bench.json"
    assert suite.run_bench(str(out), quick=False) == 0
    before = json.loads(out.read_text())
    monkeypatch.setattr(suite, "wire", lambda quick: pytest.fail("measured a section not asked for"))
    changed = [{**SECTIONS["simulator"][0], "sim_wall_s": 99.9}]
    monkeypatch.setattr(suite, "simulator", lambda quick: changed)
    monkeypatch.setattr(suite, "measure_across", lambda quick, where: {"skipped": f"stand-in for {where}"})
    assert suite.run_bench(str(out), quick=False, across="cluster", only=("simulator", "hosts")) == 0
    after = json.loads(out.read_text())
    loads = after["machine"].pop("load_avg")  # each section's load average as it started and ended, kept
    assert loads.keys() == before["machine"].pop("load_avg").keys() | {"hosts"}
    assert after == {**before, "simulator": changed, "hosts": {"skipped": "stand-in for cluster"}}
    page = (tmp_path / "bench.md").read_text()
    assert "| 8 | 320 | 99.90 | 8.30 |" in page and "| 1e+06 | 4.0 | 0.271 | 0.801 |" in page
    assert page.rstrip().endswith("Across hosts: not measured: stand-in for cluster.")
    assert "load average (1 min) as each section started and ended: wire " in page
