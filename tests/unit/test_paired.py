"""plots/paired.py by hand: each setting's end against the reference's, seed by seed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from plots.analysis import load_sweep
from experiments.report import report
from experiments.sweep.spec import load_spec
from plots.paired import main, paired_table
from runconfig.settings import ConfigError

# (compress, compress_pulls, seed): the final test error; float32's seeds spread 0.10,
# int8 is 0.002 above it in every seed it ran; int4 has no seed 2, float32 no seed 3
FINALS = {("none", False, 0): 0.10, ("none", False, 1): 0.15, ("none", False, 2): 0.20,
          ("int8", False, 0): 0.102, ("int8", False, 1): 0.152, ("int8", False, 2): 0.202,
          ("int4", False, 0): 0.09, ("int4", False, 1): 0.16, ("int4", False, 3): 0.5,
          ("int8", True, 0): 0.12}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """A paired sweep's folder (`study = "paired"`) with a run for each of FINALS."""
    points = []
    for (codec, pulls, seed), error in FINALS.items():
        point = f"async-c4-s{seed}-{codec}-{pulls}"
        run = tmp_path / "runs" / point
        run.mkdir(parents=True)
        config = {"mode": "async", "clients": 4, "seed": seed, "lr": 0.03, "compress": codec, "compress_pulls": pulls}
        (run / "config.json").write_text(json.dumps(config))
        (run / "summary.json").write_text(json.dumps({"status": "complete", "final_test_error": error,
                                                      "final_test_loss": 10 * error}))
        (run / "eval.jsonl").write_text(json.dumps({"time": 1.0, "minibatches": 1, "test_error": error}) + "\n")
        points.append({"id": point, "mode": "async", "clients": 4, "n_sync": 1, "seed": seed, "compress": codec,
                       "compress_pulls": pulls, "config": config, "run": f"runs/{point}", "status": "complete"})
    paired = {"by": ["compress", "compress_pulls"], "reference": ["none", False]}
    (tmp_path / "index.json").write_text(json.dumps({"name": "s", "study": "paired", "paired": paired,
                                                     "points": points}))
    return tmp_path


def test_a_setting_is_compared_with_the_reference_in_the_seeds_both_ran(sweep):
    rows = paired_table(load_sweep(sweep).points, ["compress", "compress_pulls"], ("none", "False"), None)
    by = {tuple(r["setting"].values()): r for r in rows}
    assert set(by) == {("int8", "False"), ("int4", "False"), ("int8", "True")}
    int8 = by[("int8", "False")]
    assert int8["seeds"] == [0, 1, 2]
    assert int8["diffs"] == pytest.approx([0.002] * 3)  # the seeds' spread (0.10) gone from the difference
    assert int8["reference"] == pytest.approx(0.15) and int8["value"] == pytest.approx(0.152)
    assert int8["median_relative"] == pytest.approx(0.002 / 0.15)
    int4 = by[("int4", "False")]  # seed 3 has no float32 run and seed 2 no int4 run: neither pairs
    assert int4["seeds"] == [0, 1] and int4["diffs"] == pytest.approx([-0.01, 0.01])
    assert by[("int8", "True")]["seeds"] == [0]


def test_another_column_and_the_command_line(sweep, capsys):
    rows = paired_table(load_sweep(sweep).points, ["compress"], ("none",), "test_loss")
    assert {r["setting"]["compress"]: r["diffs"] for r in rows}["int8"] == pytest.approx([0.02] * 3)
    assert main([str(sweep), "--by", "compress,compress_pulls", "--reference", "none,False"]) == 0
    assert "| compress int8, compress_pulls False | test_error | 3 | 0.15 | 0.152 | +0.0020, +0.0020, +0.0020 | " \
        "0.002 | 1.33 |" in capsys.readouterr().out


def test_no_pair_or_a_reference_of_another_length_is_one_line_and_exit_2(sweep, capsys):
    assert main([str(sweep), "--by", "compress", "--reference", "fp16"]) == 2
    assert main([str(sweep), "--by", "compress,compress_pulls", "--reference", "none"]) == 2
    assert capsys.readouterr().err.count("\n") == 2


def test_asgd_report_writes_a_paired_sweep_s_page(sweep, tmp_path):
    page = tmp_path / "docs" / "paired.md"
    assert report(str(sweep), figures=str(tmp_path / "figures"), docs=str(page)) == 0
    text = page.read_text()
    assert "## Against compress none, compress_pulls False: the runs' measure" in text
    assert "| compress int8, compress_pulls False | test_error | 3 | 0.15 | 0.152 |" in text
    assert "| compress int8, compress_pulls False | test_loss | 3 | 1.5 | 1.52 | +0.0200, +0.0200, +0.0200 |" in text


@pytest.mark.parametrize("paired", ["", 'paired = { by = ["compress"] }',
                                    'paired = { by = ["compress"], reference = ["none", true] }'])
def test_a_paired_study_without_its_keys_is_refused_in_one_line(tmp_path, paired):
    spec = tmp_path / "s.toml"
    spec.write_text(f'study = "paired"\n{paired}\n[grid]\nclients = [2]\ncompress = ["none", "int8"]\n')
    with pytest.raises(ConfigError, match="paired = { by = "):
        load_spec(str(spec))
