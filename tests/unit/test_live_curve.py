"""The test-error curve: its items read once a run, its points measured while the run trains."""
from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from clients.evaluate import RECALIBRATE_SAMPLES, EvalItems, LiveCurve, curve_samples, final_measurement
from clients.models import flat_weights
from clients.user.code import TorchSplit
from rundir.layout import RunDir


class Counting(Dataset):
    """A user's map-style Dataset that counts its __getitem__ calls."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y, self.reads = torch.randn(n, 5, generator=g), torch.arange(n) % 3, 0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        self.reads += 1
        return self.x[i], self.y[i]


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


@pytest.fixture
def parts(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    train, test = Counting(1500, 0), Counting(300, 1)
    net = model()
    samples = curve_samples(len(test), 100, seed=0)
    items = EvalItems.read(net, TorchSplit(test), samples, TorchSplit(train), seed=0)
    return run, net, items, train, test


def snapshot(run: RunDir, net: nn.Module, version: int, scale: float) -> None:
    run.save_snapshot(flat_weights(net) * scale, version, float(version), version * 10)


def test_the_items_a_point_needs_are_read_once_a_run(parts):
    """Five points read 100 test items and RECALIBRATE_SAMPLES training items (BatchNorm's), once."""
    run, net, items, train, test = parts
    for version in range(5):
        snapshot(run, net, version, 1.0 + version)
    curve = LiveCurve(run, net, lambda: items, loss=None)
    items = curve.finish()
    assert (test.reads, train.reads) == (100, RECALIBRATE_SAMPLES)
    assert [row["version"] for row in run.rows("eval")] == list(range(5))
    final = final_measurement(run, items, net, TorchSplit(test), loss=None, keep=False)
    assert test.reads == 400 and final["samples"] == 300  # the whole split once, for the final weights
    assert run.snapshots() == []


def test_a_point_is_measured_while_the_run_trains_and_never_twice(parts):
    run, net, items, _, _ = parts
    snapshot(run, net, 0, 1.0)
    curve = LiveCurve(run, net, lambda: items, loss=None)
    deadline = time.monotonic() + 60  # a hang guard, not a timing
    # the thread writes the point's row, then counts it: wait for both (under load the test
    # could read the row first)
    while (len(run.rows("eval")) < 1 or curve.live < 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [row["version"] for row in run.rows("eval")] == [0] and curve.live == 1
    snapshot(run, net, 7, 2.0)
    curve.finish()
    rows = run.rows("eval")
    assert [row["version"] for row in rows] == [0, 7] and rows[0]["test_loss"] != rows[1]["test_loss"]
    again = LiveCurve(run, net, lambda: items, loss=None)  # a resumed run's: its points are on record
    again.finish()
    assert len(run.rows("eval")) == 2


def test_a_slow_metric_never_holds_up_the_run(parts):
    """A metric of the user's that takes 0.3 s a batch: the curve is handed its work and
    the run goes on at once, with no point measured yet; finish measures them all."""
    run, net, items, _, _ = parts
    for version in range(2):
        snapshot(run, net, version, 1.0 + version)

    def slow(outputs, targets):
        time.sleep(0.3)
        return (outputs.argmax(1) == targets).float().mean()

    curve = LiveCurve(run, net, lambda: items, loss=None, metric=slow)
    assert run.rows("eval") == [] and curve.live == 0
    curve.finish()
    curve_rows = run.rows("eval")
    assert len(curve_rows) == 2 and all(r["test_metric"] == pytest.approx(1 - r["test_error"]) for r in curve_rows)


def test_a_failure_of_the_thread_is_raised_when_the_run_finishes(parts):
    run, net, _, _, _ = parts
    snapshot(run, net, 0, 1.0)

    def broken():
        raise RuntimeError("the test split cannot be read")

    with pytest.raises(RuntimeError, match="cannot be read"):
        LiveCurve(run, net, broken, loss=None).finish()


def test_without_live_every_point_is_measured_after_training(parts):
    run, net, items, _, _ = parts
    for version in range(3):
        snapshot(run, net, version, 1.0 + version)
    curve = LiveCurve(run, net, lambda: items, loss=None, share=0)
    assert curve.thread is None
    curve.finish()
    assert curve.live == 0 and [row["version"] for row in run.rows("eval")] == [0, 1, 2]


def test_auto_is_live_everywhere_at_a_trickle_where_the_ranks_fill_the_cores(monkeypatch):
    import socket

    from experiments.run import record as runrecord
    from runconfig.settings import RunConfig

    host = socket.gethostname()
    monkeypatch.setattr(runrecord.os, "cpu_count", lambda: 2)
    ranks = [{"rank": r, "host": host} for r in range(3)]
    assert not runrecord.spare_core({"ranks": ranks})      # a server and two clients on two cores
    assert runrecord.spare_core({"ranks": ranks[:1]})       # the simulator
    assert runrecord.spare_core({"ranks": ranks[:1] + [{"rank": 1, "host": "elsewhere"}] * 4})

    def share(ranks_on_host: list, **settings) -> float:
        return runrecord.live_share(RunConfig(**settings), {"ranks": ranks_on_host})

    assert share(ranks) == LiveCurve.SHARED_CORE_SHARE < LiveCurve.LIVE_SHARE
    assert share(ranks[:1]) == share(ranks, eval_live="on") == share(ranks, stop_at_error=0.2) == LiveCurve.LIVE_SHARE
    assert share(ranks[:1], eval_live="off") == share(ranks[:1], backend="sim", stop_at_error=0.2) == 0


def test_a_short_run_gets_fewer_points_of_the_curve_than_a_long_one():
    """About 20 points, fewer where 20 would cost more than a quarter of training's
    forward passes; an eval_every set is kept."""
    from types import SimpleNamespace

    from experiments.run.record import RecordSettings, eval_every
    from runconfig.settings import RunConfig

    def every(steps: int, net: nn.Module, **settings) -> int:
        record = RecordSettings.from_config(RunConfig(steps=steps, batch_size=32, **settings), "run", 2, {})
        setup = SimpleNamespace(record=record, model=net, dataset=SimpleNamespace(test=range(2000)))
        return eval_every(setup, events=2 * steps)

    with_bn, without = model(), nn.Sequential(nn.Linear(5, 3))
    assert every(300, with_bn) == 600 // 11   # 2 x 300 x 32 x 3 / 4 forward passes, 1,256 a point: 11 points
    assert every(300, without) == 600 // 14   # 1,000 a point: 14
    assert every(3000, with_bn) == 6000 // 20  # long enough for all 20
    assert every(300, with_bn, eval_every=7) == 7
