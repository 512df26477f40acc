"""One client against the real server handler, driven by the simulator's event loop (the
one in-process driver of a ClientLoop): async reduces to SGD."""
from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch

from clients.client import Client, Replica
from clients.data import load_dataset
from clients.loop import ClientLoop, ClientPlan
from clients.models import build_model, flat_weights
from clients.sampling import ShardSampler, shard_indices
from experiments.sim.simulator import Simulation, SimTiming, StepClock
from runconfig.settings import RunConfig
from paramserver.state import ServerState
from paramserver.drivers.inprocess import InProcess
from paramserver.recorder import Recorder
from paramserver.rules import make_rule, rule_class
from paramserver.store import Store
from rundir.layout import RunDir
from tests.reference import assert_steps_close, at_run_threads, plain_sgd

LR, MOMENTUM, WD, BATCH, STEPS = 0.05, 0.9, 5e-4, 32, 12


@pytest.fixture(scope="module")
def dataset(tiny_npz):
    return load_dataset(str(tiny_npz))


@at_run_threads  # the threads plain_sgd computes with
def one_client(run_path, dataset, n_push, n_fetch, rule="add", server_momentum=0.0, **rule_settings):
    def model():
        return build_model("cnn", dataset.shape, dataset.num_classes, seed=0)

    settings = RunConfig(rule=rule, lr=LR, server_momentum=server_momentum, weight_decay=WD, **rule_settings)
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
    assert_steps_close(store.weights, plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR), STEPS)
    assert store.version == STEPS and store.staleness == {0: STEPS}


@pytest.mark.parametrize("n_push,n_fetch", [(3, 3), (5, 5), (12, 12), (2, 3), (4, 1)])
def test_one_client_result_does_not_depend_on_sync_periods(tmp_path, dataset, n_push, n_fetch):
    store, run = one_client(tmp_path / "run", dataset, n_push, n_fetch)
    assert_steps_close(store.weights, plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR), STEPS)
    rows = [json.loads(line) for line in (run.path / "clients.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # each minibatch logged once
    pushes = [json.loads(line) for line in (run.path / "server.jsonl").read_text().splitlines()]
    assert len(pushes) == -(-STEPS // n_push) == store.version


def test_sgd_rule_with_server_momentum_equals_plain_sgd(tmp_path, dataset):
    store, _ = one_client(tmp_path / "run", dataset, 1, 1, rule="sgd", server_momentum=MOMENTUM)
    assert_steps_close(store.weights, plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR), STEPS)


@pytest.mark.parametrize("rule", ["scaled", "staleness", "dcasgd"])
def test_one_client_rules_reduce_to_plain_sgd(tmp_path, dataset, rule):
    """With one client and n_sync 1 every push is fresh: scaled and staleness take the
    whole step, and DC-ASGD has nothing to compensate (the weights are those pulled)."""
    store, _ = one_client(tmp_path / "run", dataset, 1, 1, rule=rule)
    assert_steps_close(store.weights, plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR), STEPS)


@pytest.mark.parametrize("rule,settings", [("fresh", {"server_momentum": MOMENTUM}),
                                           ("nesterov", {"nesterov_momentum": 0.0})])
def test_new_rules_with_one_client_reduce_to_plain_sgd(tmp_path, dataset, rule, settings):
    """fresh: S = K = 1 and every push fresh, so each is one step of the server's SGD with
    the clients' momentum; nesterov: N = K = 1 without momentum is add."""
    store, _ = one_client(tmp_path / "run", dataset, 1, 1, rule=rule, **settings)
    assert_steps_close(store.weights, plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR), STEPS)
    assert store.version == STEPS and store.dropped == {}


def test_adagrad_rule_with_one_client_equals_torch_adagrad(tmp_path, dataset):
    store, _ = one_client(tmp_path / "run", dataset, 1, 1, rule="adagrad", server_lr=LR)
    expected = plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR, optimizer="Adagrad")
    assert_steps_close(store.weights, expected, STEPS)


def test_adagrad_at_its_defaults_is_torch_adagrad_at_torchs(tmp_path, dataset):
    """The rule's lr is its own (the run's lr is SGD's, the clients'): with none given, one
    client is torch.optim.Adagrad as torch builds it with no lr, not at the run's lr."""
    torch_lr = inspect.signature(torch.optim.Adagrad).parameters["lr"].default
    store, _ = one_client(tmp_path / "run", dataset, 1, 1, rule="adagrad")
    assert_steps_close(store.weights, plain_sgd(dataset, STEPS, batch_size=BATCH, lr=torch_lr, optimizer="Adagrad"),
                       STEPS)
    assert np.abs(store.weights - plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR, optimizer="Adagrad")).max() > 1e-3


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


@at_run_threads
def one_client_with(run_path, dataset, rule="add", **optimizer):
    """`one_client` at n_sync 1, its client stepping with `optimizer` (clients/optimizers.py)."""
    def model():
        return build_model("cnn", dataset.shape, dataset.num_classes, seed=0)

    server = RunConfig(lr=LR, server_momentum=MOMENTUM, weight_decay=WD,
                       clip_grad_norm=optimizer.get("clip_grad_norm", 0.0))  # a gradient rule's server clips
    state = ServerState(Store(flat_weights(model()), make_rule(rule, server)), [1])
    run = RunDir(run_path)
    run.create()
    recorder = Recorder(run, state, clock=lambda: 0.0)
    replica = Replica(model(), lr=LR, momentum=MOMENTUM, weight_decay=WD, **optimizer)
    client = Client(replica, dataset.train, ShardSampler(shard_indices(len(dataset.train), 1, 0, 0), BATCH, 0, 0),
                    pushes=rule_class(rule).pushes)
    clock = StepClock(1.0)
    loop = ClientLoop(client, ClientPlan(0, STEPS, 1, 1, timeout=1.0), clock)
    Simulation([loop], [clock], SimTiming(1.0, 0.0, 1e9, 0.0)).run(InProcess(state, recorder))
    recorder.close()
    return state.store.weights


@pytest.mark.parametrize("optimizer,torch_name,clip,precision", [
    ("adamw", "AdamW", 0.0, "fp32"), ("adam", "Adam", 0.0, "fp32"), ("sgd", "SGD", 0.5, "fp32"),
    ("adamw", "AdamW", 0.5, "fp32"), ("sgd", "SGD", 0.0, "bf16"), ("adamw", "AdamW", 0.5, "bf16"),
    ("sgd", "SGD", 0.5, "fp16")])
def test_one_client_with_each_optimizer_clipping_and_precision_equals_plain_torch(tmp_path, dataset, optimizer,
                                                                                 torch_name, clip, precision):
    """Clipping at 0.5 bites (the CNN's first gradients have norms near 0.65); fp16 runs
    torch's GradScaler, whose first steps overflow and are skipped, on both sides."""
    import torch

    weights = one_client_with(tmp_path / "run", dataset, name=optimizer, clip_grad_norm=clip, precision=precision)
    autocast = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    expected = plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR, momentum=MOMENTUM, weight_decay=WD,
                         optimizer=torch_name, clip_grad_norm=clip, autocast=autocast, through_server=True)
    if optimizer == "sgd" and precision != "fp16":  # clients/optimizers.py's FlatSGD: torch's arithmetic on
        assert_steps_close(weights, expected, STEPS)  # on one flat vector
    else:  # torch's own optimizer on views shaped as its parameters, the server's one rounding in the reference:
        np.testing.assert_array_equal(weights, expected)  # the same operations in the same order
    untouched = flat_weights(build_model("cnn", dataset.shape, dataset.num_classes, seed=0))
    assert np.abs(weights - untouched).max() > 1e-3  # it trained


def test_a_gradient_rule_receives_the_clipped_gradient(tmp_path, dataset):
    """The sgd rule steps the server with the pushed gradient, which the server clips
    (the client pushes what it computed): torch's SGD with clipping."""
    weights = one_client_with(tmp_path / "run", dataset, rule="sgd", clip_grad_norm=0.5)
    expected = plain_sgd(dataset, STEPS, batch_size=BATCH, lr=LR, momentum=MOMENTUM, weight_decay=WD,
                         clip_grad_norm=0.5)
    assert_steps_close(weights, expected, STEPS)


def test_clients_sharing_a_replica_keep_their_own_optimizer_state(dataset):
    """The simulator binds K clients to one replica in turn: with Adam, two clients
    stepping alternately on one replica end where each would on a replica of its own."""
    def client(replica, index):
        return Client(replica, dataset.train, ShardSampler(shard_indices(len(dataset.train), 2, index, 0), BATCH, 0,
                                                           index))

    def replica():
        return Replica(build_model("cnn", dataset.shape, dataset.num_classes, seed=0), lr=LR, momentum=0.0,
                       weight_decay=WD, name="adam")

    shared = replica()
    together, alone = [client(shared, i) for i in range(2)], [client(replica(), i) for i in range(2)]
    for _ in range(4):
        for c in together + alone:
            c.step()
    for a, b in zip(together, alone):
        np.testing.assert_array_equal(a.weights.numpy(), b.weights.numpy())


def test_an_optimizers_state_that_is_no_tensor_or_number_is_left_out_of_its_arrays():
    """A user's optimizer may keep None or a string beside its tensors: its arrays are
    plain numbers (a STATE with an object array would be refused and hold every async
    checkpoint up), and the state loads back."""
    import torch

    from clients.optimizers import OptimizerSettings, TorchOptimizer

    class Marked(torch.optim.SGD):
        def step(self, closure=None):
            super().step(closure)
            for p in self.param_groups[0]["params"]:
                self.state[p].update({"note": "seen", "spare": None, "count": self.state[p].get("count", 0) + 1})

    param = torch.nn.Parameter(torch.zeros(3))
    param.grad = torch.ones(3)
    optimizer = TorchOptimizer(OptimizerSettings(name="mine:factory"), lambda: [param],
                               Marked([param], lr=0.1, momentum=0.9))
    optimizer.step(param.grad, 0.1, None)
    arrays = optimizer.state_arrays()
    assert sorted(arrays) == ["number.0.count", "state.0.momentum_buffer"]
    assert all(a.dtype != object for a in arrays.values())
    optimizer.load_state_arrays(arrays)
    assert optimizer.optimizer.state[param]["count"] == 1
