"""Dynamic local updates in the simulator: asynchronous DiLoCo (AdamW clients, the
`nesterov` rule) with one client three times slower. The slow client's pushes carry
fewer minibatches while the fast ones run, every minibatch is still run and logged once,
and the measured speeds go through a checkpoint."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from clients.client import Client, Replica
from clients.data import load_dataset
from clients.loop import ClientLoop, ClientPlan
from clients.models import build_model
from clients.sampling import ShardSampler
from experiments.cli import main
from paramserver.wire.protocol import Tag, Weights
from rundir.durable import load_arrays
from tests.conftest import assert_logged_once
from tests.sim.test_sim import TIMED, rows

H, STEPS = 8, 48
DILOCO = ["--clients", "3", "--steps", str(STEPS), "--n-sync", str(H), "--rule", "nesterov", "--optimizer", "adamw",
          "--dylu", "--slow-clients", "1", "--slow-factor", "3", "--budget", "client",  # each client's steps
          "--nesterov-reply", "now"]  # every push answered at once: the versions counted below are Algorithm 3's


def train(*flags: str) -> int:
    return main(["train", "--backend", "sim", *TIMED, *flags])


def windows(run: Path, client: int) -> list[tuple[float, int]]:
    """(time, minibatches) of each of the client's pushes, from clients.jsonl: a push's
    rows end with the one that carries its staleness."""
    pushes, count = [], 0
    for row in rows(run, "clients"):
        if row["client"] == client:
            count += 1
            if "staleness" in row:
                pushes.append((row["time"], count))
                count = 0
    return pushes


def test_a_slow_client_pushes_fewer_minibatches_as_often_as_the_fast_ones(tmp_path, tiny_npz):
    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), *DILOCO) == 0
    versions = len([r for r in rows(run, "server") if "version" in r])
    assert assert_logged_once(run, clients=3, steps=STEPS, versions=versions) == [STEPS] * 3
    fast, slow = windows(run, 0), windows(run, 2)
    assert [n for _, n in fast] == [H] * (STEPS // H) == [n for _, n in windows(run, 1)]
    fast_end = max(fast[-1][0], windows(run, 1)[-1][0])
    while_fast = [(t, n) for t, n in slow if t <= fast_end]
    assert while_fast[0][1] == H  # measured from its first push on
    assert [n for _, n in while_fast[1:]] == [H // 3] * (len(while_fast) - 1) and len(while_fast) >= 4
    # as often as a fast client, over the same stretch of virtual time
    first = while_fast[0][0]
    assert len(while_fast) - 1 >= len([t for t, _ in fast if first < t <= while_fast[-1][0]])
    assert H in [n for t, n in slow if t > fast_end]  # alone: the fastest client left
    assert len(slow) > STEPS // H


def test_a_dylu_run_resumes_with_its_measured_speeds(tmp_path, tiny_npz):
    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), *DILOCO, "--eval-every", "6",
                 "--inject-fault", "0:14") == 1
    checkpoint = load_arrays(run / "checkpoint" / "latest.npz", checksummed=True)
    speeds, steps = checkpoint["dylu.speeds"], checkpoint["tally.client_steps"]
    assert int(checkpoint["version"]) == 12 and (speeds > 0).all() and speeds[2] < speeds[0] / 2
    assert train("--resume", str(run)) == 0
    versions = len([r for r in rows(run, "server") if "version" in r])
    assert assert_logged_once(run, clients=3, steps=STEPS, versions=versions) == [STEPS] * 3
    after = [n for t, n in windows(run, 2)]
    pushed = np.cumsum(after)
    resumed_at = list(pushed).index(steps[2])
    assert after[resumed_at + 1] == H // 3  # its first window after the resume, from the checkpoint's speeds


def test_the_client_pushes_after_the_window_each_reply_gives_and_fetches_with_every_push(tiny_npz):
    dataset = load_dataset(str(tiny_npz))
    replica = Replica(build_model("cnn", dataset.shape, dataset.num_classes, seed=0), lr=0.01, momentum=0.0,
                      weight_decay=0.0)
    client = Client(replica, dataset.train, ShardSampler(np.arange(len(dataset.train)), 8, 0, 0))
    loop = ClientLoop(client, ClientPlan(0, 10, 4, 4, timeout=1.0, dylu=True), clock=lambda: 0.0)
    points = []
    for window in (3, 1, 5, 5):
        message, fetch = loop.advance()
        points.append((message.tag, message.header.step, fetch))
        if fetch:
            loop.take_weights(client.weights.numpy().copy(), Weights(0, client.size, window=window))
    assert points == [(Tag.PUSH, 4, True), (Tag.PUSH, 7, True), (Tag.PUSH, 8, True), (Tag.PUSH, 10, False)]
    assert loop.advance()[0].tag == Tag.STOP and loop.done
