"""`asgd bench`'s Markdown page (docs/results/bench.md under `make bench`): the tables it
prints, headed by when and where they were measured, written whole or not at all into a
folder it makes. No benchmark runs here: the sections are stand-ins with fixed numbers."""
from __future__ import annotations

import json
import sys
import types

import pytest

import paramserver.runlog
from experiments.bench import suite

SECTIONS = {
    "wire": [{"floats": 1e6, "mbytes": 4.0, "raw_one_way_ms": 0.271, "round_trip_ms": 0.801, "apply_ms": 0.114,
              "apply_vs_copy": 1.79, "ratio": 1.22}],
    "load": [{"servers": 1, "clients": 4, "floats": 1e6, "pushes_per_s": 574.4, "mbytes_per_s": 4594.2,
              "server_busy": 0.95}],
    "idle": {"blocking_cpu_s": 1.38, "polled_cpu_s": 0.03, "speedup": 1.52},
    "server_peers": [{"clients": 2, "floats": 10**6, "ours": {"pushes_per_s": 1101}, "rpc_ps": {"pushes_per_s": 463}}],
    "peers": [{"system": "ours: async, n_sync 1", "samples_per_s": 8657.0, "rule": "easgd"},
              {"system": "torch DDP (gloo)", "samples_per_s": 9957.0}],
    "simulator": [{"clients": 8, "minibatches": 960, "sim_wall_s": 8.41, "compute_s": 8.30, "overhead": 1.013}],
}


def results(quick: bool = False) -> dict:
    return {"machine": {"cores": 2, "mpi": "MPICH Version: 5.0.2", "quick": quick, "date": "2026-11-30 12:00 UTC",
                        "bench_s": 300.0}, **SECTIONS}


def test_the_page_holds_every_table_under_where_and_when(tmp_path):
    page = suite.write_markdown(tmp_path / "docs" / "results" / "bench.md", results())
    text = page.read_text()
    assert text.startswith("# Benchmarks, as measured\n\nWritten by `asgd bench` (`make bench`) on "
                           "2026-11-30 12:00 UTC in 5 min; do not edit")
    assert "2 cores, MPICH Version: 5.0.2" in text and "smoke run" not in text
    assert suite.tables(results()) + "\n" in text  # exactly what the bench prints
    for row in ("| 1e+06 | 4.0 | 0.271 | 0.801 | 0.114 | 1.79 | 1.22 |", "| 1 | 4 | 1e+06 | 574 | 4594 | 95% |",
                "| 2 | 1101 | 463 | 2.38 |", "| torch DDP (gloo) | 9957 | 0.87 |", "| 8 | 960 | 8.41 | 8.30 | 1.01 |"):
        assert row in text
    assert "ours with --rule easgd" in text  # which server rule the throughput rows measured
    assert [p.name for p in page.parent.iterdir()] == ["bench.md"]  # no temporary file left
    assert "smoke run" in suite.write_markdown(tmp_path / "quick.md", results(quick=True)).read_text()


def test_a_failed_write_leaves_the_previous_page(tmp_path, monkeypatch):
    page = suite.write_markdown(tmp_path / "bench.md", results())
    before = page.read_text()

    def crash(*args):
        raise OSError("killed before the rename")
    monkeypatch.setattr(paramserver.runlog.os, "replace", crash)
    changed = {**results(), "simulator": [{**SECTIONS["simulator"][0], "overhead": 9.99}]}
    with pytest.raises(OSError, match="killed"):
        suite.write_markdown(page, changed)
    assert page.read_text() == before


@pytest.fixture
def stand_ins(monkeypatch):
    """Every section returns its fixed numbers; mpi4py is a stand-in that only names the library."""
    for name in ("wire", "load", "server_peers", "peers", "simulator"):
        monkeypatch.setattr(suite, name, lambda quick, name=name: SECTIONS[name])
    monkeypatch.setattr(suite, "idle", lambda: SECTIONS["idle"])
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
    assert set(json.loads(out.read_text())) == {"machine", "wire", "load", "idle", "server_peers"}
    assert not page.exists()
