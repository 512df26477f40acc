"""The server's optimizer under a gradient rule (paramserver/optimizer.py): torch's
Adam, AdamW, SGD with Nesterov and a user's factory, on the gathered gradient, with
clipping, and their state through a checkpoint."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from runconfig.settings import RunConfig
from paramserver.rules import make_rule
from paramserver.store import Store
from rundir.durable import load_arrays, save_arrays

SIZE, LR, DECAY, CLIP = 50, 0.01, 0.1, 0.5


def adam_reference(w: np.ndarray, grads: list[np.ndarray], *, decoupled: bool, clip: float) -> np.ndarray:
    """Adam / AdamW written from their papers' formulas in float64 (torch's bias-corrected
    form; AdamW's decay decoupled, Adam's added to the gradient), the gradient clipped to a
    total norm first."""
    w = w.astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    b1, b2, eps = 0.9, 0.999, 1e-8
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64)
        if clip:
            g = g * min(1.0, clip / (np.linalg.norm(g) + 1e-6))
        if decoupled:
            w = w * (1 - LR * DECAY)
        else:
            g = g + DECAY * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - LR / (1 - b1 ** t) * m / (np.sqrt(v) / math.sqrt(1 - b2 ** t) + eps)
    return w


def push(store: Store, g: np.ndarray) -> bool:
    """Client 0 pulls and pushes `g`, as one client at n_sync 1 does (fresh drops a stale push)."""
    store.pull(0)
    return store.apply(0, g).accepted


def gradients(count: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SIZE).astype(np.float32) for _ in range(count)]


@pytest.mark.parametrize("rule", ["sgd", "fresh"])
@pytest.mark.parametrize("optimizer,clip", [("adamw", 0.0), ("adamw", CLIP), ("adam", 0.0)])
def test_the_servers_adam_is_the_papers_arithmetic(rule, optimizer, clip):
    start = np.random.default_rng(0).standard_normal(SIZE).astype(np.float32)
    store = Store(start, make_rule(rule, RunConfig(lr=LR, weight_decay=DECAY, optimizer=optimizer, clip_grad_norm=clip)))
    grads = gradients(6)
    for g in grads:
        assert push(store, g)
    expected = adam_reference(start, grads, decoupled=optimizer == "adamw", clip=clip)
    np.testing.assert_allclose(store.weights, expected, rtol=1e-5, atol=1e-6)
    assert store.rule.formulas_fit is False  # torch's arithmetic runs, not the SGD kernel


def test_the_servers_adamw_equals_torch_adamw_on_the_same_gradients():
    start = np.random.default_rng(0).standard_normal(SIZE).astype(np.float32)
    param = torch.nn.Parameter(torch.from_numpy(start.copy()))
    reference = torch.optim.AdamW([param], lr=LR, weight_decay=DECAY)
    store = Store(start, make_rule("fresh", RunConfig(lr=LR, weight_decay=DECAY, optimizer="adamw")))
    for g in gradients(5):
        param.grad = torch.from_numpy(g.copy())
        reference.step()
        push(store, g)
    np.testing.assert_array_equal(store.weights, param.detach().numpy())


def test_sgd_with_nesterov_equals_torch():
    start = np.random.default_rng(0).standard_normal(SIZE).astype(np.float32)
    param = torch.nn.Parameter(torch.from_numpy(start.copy()))
    reference = torch.optim.SGD([param], lr=LR, momentum=0.9, nesterov=True, weight_decay=DECAY)
    store = Store(start, make_rule("sgd", RunConfig(lr=LR, momentum=0.9, nesterov=True, weight_decay=DECAY)))
    for g in gradients(5):
        param.grad = torch.from_numpy(g.copy())
        reference.step()
        push(store, g)
    np.testing.assert_allclose(store.weights, param.detach().numpy(), rtol=0, atol=1e-6)


def test_a_users_optimizer_steps_the_server():
    start = np.random.default_rng(0).standard_normal(SIZE).astype(np.float32)
    param = torch.nn.Parameter(torch.from_numpy(start.copy()))
    reference = torch.optim.RMSprop([param], lr=LR)
    factory = lambda params: torch.optim.RMSprop(params, lr=LR)  # noqa: E731 - settings bound, as the run binds them
    store = Store(start, make_rule("sgd", RunConfig(lr=LR), optimizer_factory=factory))
    for g in gradients(5):
        param.grad = torch.from_numpy(g.copy())
        reference.step()
        push(store, g)
    np.testing.assert_allclose(store.weights, param.detach().numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["adamw", "rmsprop"])
def test_the_server_optimizers_state_survives_a_checkpoint(tmp_path, optimizer):
    """Three steps, a checkpoint written and loaded into a new store, three more: the same
    weights as six steps without the stop (Adam's moments and step count; a factory's state)."""
    factory = (lambda params: torch.optim.RMSprop(params, lr=LR, momentum=0.5)) if optimizer == "rmsprop" else None
    settings = RunConfig(lr=LR, weight_decay=DECAY, optimizer="adamw" if factory is None else "sgd")
    start = np.random.default_rng(0).standard_normal(SIZE).astype(np.float32)
    grads = gradients(6)
    straight = Store(start, make_rule("fresh", settings, optimizer_factory=factory))
    stopped = Store(start, make_rule("fresh", settings, optimizer_factory=factory))
    for g in grads:
        push(straight, g)
    for g in grads[:3]:
        push(stopped, g)
    save_arrays(tmp_path / "ckpt.npz", stopped.state())
    resumed = Store(np.zeros(SIZE, np.float32), make_rule("fresh", settings, optimizer_factory=factory))
    resumed.load_state(load_arrays(tmp_path / "ckpt.npz"))
    for g in grads[3:]:
        push(resumed, g)
    np.testing.assert_array_equal(resumed.weights, straight.weights)


def test_sgd_keeps_its_fast_path_and_its_checkpoint_names():
    rule = make_rule("fresh", RunConfig(lr=LR, momentum=0.9))
    assert rule.formulas_fit
    store = Store(np.zeros(SIZE, np.float32), rule)
    push(store, gradients(1)[0])
    assert set(rule.state()) == {"momentum_buffer", "total"} and "opt_step" not in rule.scalars()


def delayed_nesterov_reference(w: np.ndarray, pushes: list[np.ndarray], *, eps: float, beta: float, every: int,
                               c: float) -> np.ndarray:
    """Liu et al. 2024 (arXiv 2401.09135), Algorithm 3, in float64 and in its own terms:
    g is the pseudo-gradient (minus the pushed change d); each push adds g to Delta; at
    every N-th push m = beta m + Delta / N and w -= eps ((1 - cN + c) beta m + g / N),
    Delta = 0; otherwise w -= eps (c beta m + g / N)."""
    w, m, delta = w.astype(np.float64), np.zeros(w.size), np.zeros(w.size)
    for t, d in enumerate(pushes, start=1):
        g = -d.astype(np.float64)
        delta += g
        if t % every == 0:
            m = beta * m + delta / every
            w = w - eps * ((1 - c * every + c) * beta * m + g / every)
            delta = np.zeros(w.size)
        else:
            w = w - eps * (c * beta * m + g / every)
    return w


@pytest.mark.parametrize("kernel", ["torch", "auto"])
@pytest.mark.parametrize("eps,beta,every,c,clients", [(1.0, 0.9, 3, 0.0, 3), (0.7, 0.8, 2, 0.3, 3),
                                                      (0.5, 0.9, 4, 0.25, 2)])
def test_delayed_nesterov_is_algorithm_3(kernel, eps, beta, every, c, clients):
    """c = 0 and c > 0, N = K and N != K, on the torch arithmetic and the fused kernel."""
    start = np.random.default_rng(0).standard_normal(SIZE).astype(np.float32)
    settings = RunConfig(rule="nesterov", outer_lr=eps, nesterov_momentum=beta, nesterov_every=every,
                         nesterov_activation=c)
    store = Store(start, make_rule("nesterov", settings, clients), kernel=kernel)
    pushes = [0.1 * g for g in gradients(11)]
    for i, d in enumerate(pushes):
        assert push_as(store, i % clients, d)
    expected = delayed_nesterov_reference(start, pushes, eps=eps, beta=beta, every=every, c=c)
    np.testing.assert_allclose(store.weights, expected, rtol=1e-5, atol=1e-6)


def push_as(store: Store, client: int, d: np.ndarray) -> bool:
    store.pull(client)
    return store.apply(client, d).accepted


@pytest.mark.parametrize("rule", ["sgd", "fresh"])
def test_clipping_at_sharded_servers_is_refused(rule):
    """Each server of a sharded run holds a slice of the gathered gradient, so none can clip
    it by its whole norm: refused before launch, in one line naming the key."""
    from runconfig.settings import ConfigError

    with pytest.raises(ConfigError, match="^clip_grad_norm: the server clips"):
        RunConfig(rule=rule, servers=2, clip_grad_norm=1.0)
    RunConfig(rule=rule, servers=2)  # without clipping it runs
    RunConfig(rule="add", servers=2, clip_grad_norm=1.0)  # a delta rule's clients clip their own steps
