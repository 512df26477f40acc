"""One client against the real server handler, driven by the simulator's event loop (the
one in-process driver of a ClientLoop): async reduces to SGD."""
from __future__ import annotations

import json

import numpy as np
import pytest

from clients.client import Client, Replica
from clients.data import ShardSampler, load_dataset, shard_indices
from clients.loop import ClientLoop, ClientPlan
from clients.models import build_model, flat_weights
from experiments.simulator import Simulation, SimTiming, StepClock
from paramserver.config import RunConfig
from paramserver.handler import ServerState
from paramserver.inprocess import InProcess
from paramserver.recorder import Recorder
from paramserver.rules import make_rule, rule_class
from paramserver.rundir.layout import RunDir
from paramserver.store import Store
from tests.reference import plain_sgd

LR, MOMENTUM, WD, BATCH, STEPS = 0.05, 0.9, 5e-4, 32, 12


@pytest.fixture(scope="module")
def dataset(tiny_npz):
    return load_dataset(str(tiny_npz))


def one_client(run_path, dataset, n_push, n_fetch, rule="add", server_momentum=0.0, **rule_settings):
    def model():
        return build_model("cnn", dataset.shape, dataset.num_classes, seed=0)

    settings = RunConfig(lr=LR, server_momentum=server_momentum, weight_decay=WD, **rule_settings)
    state = ServerState(Store(flat_weights(model()), make_rule(rule, settings)), [1])
    run = RunDir(run_path)
    run.create()
    recorder = Recorder(run, state, clock=lambda: 0.0)
    sampler = ShardSampler(shard_indices(len(dataset.train), 1, 0, 0), BATCH, 0, 0)
    replica = Replica(model(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    client = Client(replica, dataset.train, sampler, pushes=rule_class(rule).pushes)
    clock = StepClock(1.0)
    loop = ClientLoop(client, ClientPlan(0, STEPS, n_push, n_fetch, timeout=1.0), clock)
    Simulation([loop], [clock], SimTiming(1.0, 0.0, 1e9, 0.0)).run(InProcess(state, recorder))
    recorder.close()
    assert loop.done and state.tally.stops
    return state.store, run


def test_one_client_n_sync_1_equals_plain_sgd(tmp_path, dataset):
    store, run = one_client(tmp_path / "run", dataset, 1, 1)
    np.testing.assert_allclose(store.weights, plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR), atol=1e-6, rtol=0)
    assert store.version == STEPS and store.staleness == {0: STEPS}


@pytest.mark.parametrize("n_push,n_fetch", [(3, 3), (5, 5), (12, 12), (2, 3), (4, 1)])
def test_one_client_result_does_not_depend_on_sync_periods(tmp_path, dataset, n_push, n_fetch):
    store, run = one_client(tmp_path / "run", dataset, n_push, n_fetch)
    np.testing.assert_allclose(store.weights, plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR), atol=1e-6, rtol=0)
    rows = [json.loads(line) for line in (run.path / "clients.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # each minibatch logged once
    pushes = [json.loads(line) for line in (run.path / "server.jsonl").read_text().splitlines()]
    assert len(pushes) == -(-STEPS // n_push) == store.version


def test_sgd_rule_with_server_momentum_equals_plain_sgd(tmp_path, dataset):
    store, _ = one_client(tmp_path / "run", dataset, 1, 1, rule="sgd", server_momentum=MOMENTUM)
    np.testing.assert_allclose(store.weights, plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR), atol=1e-6, rtol=0)


@pytest.mark.parametrize("rule", ["scaled", "staleness", "dcasgd"])
def test_one_client_rules_reduce_to_plain_sgd(tmp_path, dataset, rule):
    """With one client and n_sync 1 every push is fresh: scaled and staleness take the
    whole step, and DC-ASGD has nothing to compensate (the weights are those pulled)."""
    store, _ = one_client(tmp_path / "run", dataset, 1, 1, rule=rule)
    np.testing.assert_allclose(store.weights, plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR), atol=1e-6, rtol=0)


@pytest.mark.parametrize("rule,settings", [("fresh", {"server_momentum": MOMENTUM}),
                                           ("nesterov", {"nesterov_momentum": 0.0})])
def test_new_rules_with_one_client_reduce_to_plain_sgd(tmp_path, dataset, rule, settings):
    """fresh: S = K = 1 and every push fresh, so each is one step of the server's SGD with
    the clients' momentum; nesterov: N = K = 1 without momentum is add."""
    store, _ = one_client(tmp_path / "run", dataset, 1, 1, rule=rule, **settings)
    np.testing.assert_allclose(store.weights, plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR), atol=1e-6, rtol=0)
    assert store.version == STEPS and store.dropped == {}


def test_adagrad_rule_with_one_client_equals_torch_adagrad(tmp_path, dataset):
    store, _ = one_client(tmp_path / "run", dataset, 1, 1, rule="adagrad")
    expected = plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR, optimizer="Adagrad")
    np.testing.assert_allclose(store.weights, expected, atol=1e-6, rtol=0)


def test_easgd_client_and_center_move_by_the_same_elastic_step(tmp_path, dataset):
    """The center moves alpha (x - center) towards the pushed x; the client, given the
    moved center back, moves alpha (x - old center) towards it: x - center shrinks by
    1 - 2 alpha, as in EASGD."""
    alpha = 0.3
    replica = Replica(build_model("cnn", dataset.shape, dataset.num_classes, seed=0), lr=LR, momentum=MOMENTUM,
                      weight_decay=WD)
    client = Client(replica, dataset.train, ShardSampler(np.arange(len(dataset.train)), BATCH, 0, 0),
                    pushes="weights", elastic=alpha)
    center = flat_weights(build_model("cnn", dataset.shape, dataset.num_classes, seed=1))
    client.sync(center)  # the first pull: the client takes the center as it is
    np.testing.assert_array_equal(client.weights.numpy(), center)
    for _ in range(3):
        client.step()
    x = client.weights.numpy().astype(np.float64).copy()
    push = client.take_push()
    np.testing.assert_array_equal(push, x.astype(np.float32))
    moved = center + alpha * (push - center)  # what the easgd rule returns
    client.sync(moved.astype(np.float32))
    np.testing.assert_allclose(client.weights.numpy(), x - alpha * (x - center), atol=1e-6)
    np.testing.assert_allclose(client.weights.numpy() - moved, (1 - 2 * alpha) * (x - center), atol=1e-6)


def test_loss_falls_on_the_tiny_dataset(tmp_path, dataset):
    one_client(tmp_path / "run", dataset, 1, 1)
    rows = [json.loads(line) for line in (tmp_path / "run" / "clients.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows]
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3])


def test_paper_scale_convnet_builds_and_runs_a_step():
    import torch

    from clients.models import MODELS

    model = build_model("convnet", (3, 224, 224), 1000, seed=0)
    assert sum(p.numel() for p in model.parameters()) > 50_000_000 and "convnet" in MODELS
    logits = model(torch.zeros(2, 3, 224, 224))
    assert logits.shape == (2, 1000)
