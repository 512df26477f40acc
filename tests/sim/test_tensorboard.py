"""TensorBoard: `--tensorboard` writes scalars as the run goes; `asgd tensorboard` writes the
same from the run directory, and HParams for a sweep. Read back with tensorboard's reader."""
from __future__ import annotations

from pathlib import Path

import pytest

from experiments.cli import main

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

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


def test_asgd_tensorboard_writes_the_same_from_the_run_directory(board_run, tmp_path):
    assert main(["tensorboard", str(board_run), "--out", str(tmp_path / "again")]) == 0
    assert scalars(tmp_path / "again") == scalars(board_run / "tensorboard")


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
