"""TensorBoard: `--tensorboard` writes scalars as the run goes; `asgd tensorboard` writes the
same from the run directory, and HParams for a sweep. Read back with tensorboard's reader."""
from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from experiments.cli import main

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData  # noqa: E402

QUICK = ["--backend", "sim", "--rule", "easgd", "--lr", "0.01",
         "--sim-step-time", "0.01", "--sim-apply-time", "0.001", "--batch-size", "32",
         "--eval-samples", "100", "--quiet", "--threads", "1"]
TAGS = {"train/loss", "train/error", "train/lr", "test/error", "test/loss", "server/staleness", "server/pushes_per_s",
        "server/busy"}


def scalars(folder: Path) -> dict[str, list[tuple[int, float, float]]]:
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, round(e.value, 5), e.wall_time) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


@pytest.fixture(scope="module")
def board_run(tmp_path_factory, tiny_npz) -> Path:
    out = tmp_path_factory.mktemp("board") / "run"
    assert main(["train", *QUICK, "--data", str(tiny_npz), "--clients", "2", "--steps", "10", "--eval-every", "10",
                 "--lr-warmup", "320", "--tensorboard", "--out", str(out)]) == 0
    return out


def test_the_run_writes_its_scalars_as_it_goes(board_run):
    written = scalars(board_run / "tensorboard")
    assert TAGS <= set(written)
    assert [step for step, _, _ in written["train/error"]] == list(range(1, 21))
    assert [step for step, _, _ in written["test/error"]] == [0, 10, 20]
    assert [value for _, value, _ in written["server/staleness"]][2:] == [1.0] * 18  # two equal clients
    lrs = [value for _, value, _ in written["train/lr"]]
    assert lrs[0] == 0.001 and lrs[-1] == 0.01 and lrs == sorted(lrs)  # the warmup: 32 / 320 of lr, then lr
    assert all(0 < value <= 1 for _, value, _ in written["server/busy"])


def hparams(folder: Path) -> dict[str, bytes]:
    events = EventAccumulator(str(folder))
    events.Reload()
    return events.PluginTagToContent("hparams")


def record(run: Path, name: str) -> dict:
    return json.loads((run / f"{name}.json").read_text())


def test_asgd_tensorboard_writes_the_same_from_the_run_directory(board_run, tmp_path):
    assert main(["tensorboard", str(board_run), "--out", str(tmp_path / "again")]) == 0
    assert scalars(tmp_path / "again") == scalars(board_run / "tensorboard")
    assert hparams(tmp_path / "again") == hparams(board_run / "tensorboard")


def test_wall_times_are_the_runs_start_on_the_wall_clock_plus_its_time(board_run):
    start = datetime.strptime(record(board_run, "config")["provenance"]["start_time"], "%Y-%m-%dT%H:%M:%S%z")
    times = [json.loads(line)["time"] for line in (board_run / "clients.jsonl").read_text().splitlines()]
    walls = [wall for _, _, wall in scalars(board_run / "tensorboard")["train/error"]]
    assert walls == pytest.approx([start.timestamp() + time for time in times], abs=1e-6)


def test_a_run_recorded_without_a_start_time_keeps_its_relative_times(board_run, tmp_path):
    old = Path(shutil.copytree(board_run, tmp_path / "old", ignore=shutil.ignore_patterns("tensorboard")))
    config = record(old, "config")
    del config["provenance"]["start_time"]
    (old / "config.json").write_text(json.dumps(config))
    assert main(["tensorboard", str(old)]) == 0
    times = [json.loads(line)["time"] for line in (old / "clients.jsonl").read_text().splitlines()]
    assert [wall for _, _, wall in scalars(old / "tensorboard")["train/error"]] == pytest.approx(times, abs=1e-6)


def test_a_run_gets_its_settings_as_hparams_with_its_final_error_as_a_metric(board_run):
    start = HParamsPluginData.FromString(hparams(board_run / "tensorboard")["_hparams_/session_start_info"])
    settings = start.session_start_info.hparams
    assert settings["clients"].number_value == 2 and settings["rule"].string_value == "easgd"
    assert settings["lr_warmup"].number_value == 320 and "provenance" not in settings
    [(_, error, _)] = scalars(board_run / "tensorboard")["hparam/final_test_error"]
    assert error == round(record(board_run, "summary")["final_test_error"], 5)


def test_a_sweep_gets_hparams(tmp_path, tiny_npz):
    spec = tmp_path / "tiny.toml"
    spec.write_text(f'name = "tiny"\nbackend = "sim"\ntimeout = 120\n[base]\nsteps = 4\ndata = "{tiny_npz}"\n'
                    f'batch_size = 32\neval_samples = 50\nsim_step_time = 0.01\nsim_apply_time = 0.001\n'
                    f'[grid]\nclients = [1, 2]\n')
    assert main(["sweep", str(spec), "--out", str(tmp_path / "sweep"), "--quiet"]) == 0
    assert main(["tensorboard", str(tmp_path / "sweep")]) == 0
    runs = sorted(p.name for p in (tmp_path / "sweep" / "tensorboard").iterdir())
    assert len(runs) == 2
    for run in runs:
        folder = tmp_path / "sweep" / "tensorboard" / run
        assert "train/error" in scalars(folder)
        plugins = EventAccumulator(str(folder))
        plugins.Reload()
        assert set(plugins.PluginTagToContent("hparams")) >= {"_hparams_/experiment", "_hparams_/session_start_info"}
