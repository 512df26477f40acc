"""The server's update rules against float64 references written out here, on small vectors.

Each reference is the rule's formula from docs/rules.md, step by step in numpy float64; the
rule runs in float32 torch inside a real Store (which pulls and measures staleness), so
the tolerance is float32's.
"""
from __future__ import annotations

import numpy as np
import pytest

from paramserver.config import RunConfig
from paramserver.rules import RULES, make_rule
from paramserver.runlog import load_arrays, save_arrays
from paramserver.store import Store

N, K = 7, 3
SETTINGS = RunConfig(lr=0.05, server_lr=0.1, server_momentum=0.9, weight_decay=1e-3, dc_lambda=2.0)


def vectors(seed: int, count: int, scale: float = 0.1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(N) * scale).astype(np.float32) for _ in range(count)]


# (client, push) in arrival order; client 0 pulls after each of its pushes, the others
# never do, so their staleness grows (see test_staleness_of_the_schedule)
SCHEDULE = [0, 1, 2, 0, 1, 0, 2, 2]


def play(rule: str, settings: RunConfig = SETTINGS, clients: int = K, start: np.ndarray | None = None):
    """The rule in a Store over SCHEDULE: (final weights, staleness of each push)."""
    start = vectors(0, 1, 1.0)[0] if start is None else start
    store = Store(start, make_rule(rule, settings, clients))
    for c in range(clients):
        store.pull(c)
    stale = []
    for c, push in zip(SCHEDULE, vectors(1, len(SCHEDULE))):
        result = store.apply(c, push)
        assert result.accepted
        stale.append(result.staleness)
        if c == 0:
            store.pull(0)
    return store.weights.copy(), stale


def reference(update) -> np.ndarray:
    """Float64 replay of SCHEDULE: `update(w, d, client, staleness, pulled)` returns the
    new w; `pulled[c]` holds what client c last pulled."""
    w = vectors(0, 1, 1.0)[0].astype(np.float64)
    pulled = {c: w.copy() for c in range(K)}
    version, version_pulled = 0, {c: 0 for c in range(K)}
    for c, push in zip(SCHEDULE, vectors(1, len(SCHEDULE))):
        w = update(w, push.astype(np.float64), c, version - version_pulled[c], pulled)
        version += 1
        if c == 0:
            pulled[0], version_pulled[0] = w.copy(), version
    return w


def test_staleness_of_the_schedule():
    assert play("add")[1] == [0, 1, 2, 2, 4, 1, 6, 7]


def test_add():
    np.testing.assert_allclose(play("add")[0], reference(lambda w, d, c, tau, p: w + d), atol=1e-6)


def test_scaled():
    np.testing.assert_allclose(play("scaled")[0], reference(lambda w, d, c, tau, p: w + d / K), atol=1e-6)


def test_staleness_rule():
    def update(w, d, c, tau, pulled):
        return w + d * min(1.0, K / (tau + 1)) / K
    np.testing.assert_allclose(play("staleness")[0], reference(update), atol=1e-6)


def test_sgd_with_momentum_and_weight_decay():
    buffer = {}

    def update(w, d, c, tau, pulled):
        g = d + SETTINGS.weight_decay * w
        buffer["b"] = g if "b" not in buffer else SETTINGS.server_momentum * buffer["b"] + g
        return w - SETTINGS.server_lr * buffer["b"]
    np.testing.assert_allclose(play("sgd")[0], reference(update), atol=1e-6)


def test_adagrad():
    total = {"s": 0.0}

    def update(w, d, c, tau, pulled):
        g = d + SETTINGS.weight_decay * w
        total["s"] = total["s"] + g * g
        return w - SETTINGS.server_lr * g / (np.sqrt(total["s"]) + 1e-10)
    np.testing.assert_allclose(play("adagrad")[0], reference(update), atol=1e-6)


def test_dcasgd_adaptive():
    ms = {}

    def update(w, d, c, tau, pulled):
        g = -d / SETTINGS.lr
        ms["v"] = g * g if "v" not in ms else 0.95 * ms["v"] + 0.05 * g * g
        lam = SETTINGS.dc_lambda / (np.sqrt(ms["v"]) + 1e-7)
        compensated = g + lam * g * g * (w - pulled[c])
        return w - SETTINGS.lr * compensated
    np.testing.assert_allclose(play("dcasgd")[0], reference(update), atol=1e-5)
    assert np.abs(play("dcasgd")[0] - play("add")[0]).max() > 1e-3  # the compensation is not nothing


def test_dcasgd_with_lambda_0_is_add():
    no_compensation = RunConfig(lr=0.05, dc_lambda=0.0)
    np.testing.assert_array_equal(play("dcasgd", no_compensation)[0], play("add")[0])


def test_easgd_center_moves_alpha_towards_the_pushed_weights():
    alpha = SETTINGS.easgd_beta / K
    np.testing.assert_allclose(play("easgd")[0], reference(lambda w, d, c, tau, p: w + alpha * (d - w)), atol=1e-6)


@pytest.mark.parametrize("rule", ["scaled", "staleness"])
def test_one_client_fresh_pushes_reduce_to_add(rule):
    """With K = 1 and every push fresh (n_sync 1), scaled and staleness are add."""
    start = vectors(5, 1, 1.0)[0]
    stores = {name: Store(start, make_rule(name, SETTINGS, 1)) for name in ("add", rule)}
    for push in vectors(6, 5):
        for store in stores.values():
            store.pull(0)
            assert store.apply(0, push).staleness == 0
    np.testing.assert_array_equal(stores[rule].weights, stores["add"].weights)


@pytest.mark.parametrize("rule", list(RULES))
def test_rule_state_survives_a_checkpoint_exactly(tmp_path, rule):
    """Half the schedule, a checkpoint, a fresh Store loaded from it, the other half: the
    same weights, to the bit, as without the checkpoint."""
    def run(checkpoint_at: int | None) -> np.ndarray:
        store = Store(vectors(0, 1, 1.0)[0], make_rule(rule, SETTINGS, K))
        for c in range(K):
            store.pull(c)
        for i, (c, push) in enumerate(zip(SCHEDULE, vectors(1, len(SCHEDULE)))):
            if i == checkpoint_at:
                save_arrays(tmp_path / "ck.npz", store.state())
                store = Store(np.zeros(N, np.float32), make_rule(rule, SETTINGS, K))
                store.load_state(load_arrays(tmp_path / "ck.npz"))
            store.apply(c, push)
            if c == 0:
                store.pull(0)
        return store.weights.copy()
    np.testing.assert_array_equal(run(4), run(None))
