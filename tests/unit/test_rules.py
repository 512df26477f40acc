"""The server's update rules against float64 references written out here, on small vectors.

Each reference is the rule's formula from docs/rules.md, step by step in numpy float64; the
rule runs in float32 torch inside a real Store (which pulls and measures staleness), so
the tolerance is float32's.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from runconfig.settings import RunConfig
from paramserver.rules import RULES, make_rule
from paramserver.store import Store
from rundir.durable import load_arrays, save_arrays

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


def test_a_rule_runs_its_own_defaults_where_none_is_given_and_records_them():
    """Adagrad's lr is its own, not the clients' SGD lr; DC-ASGD's lambda0 is the paper's;
    what a rule does not set keeps the config's default (the server's lr: lr)."""
    assert make_rule("adagrad", RunConfig(rule="adagrad", lr=0.2)).base_lr == 0.01
    assert make_rule("dcasgd", RunConfig(rule="dcasgd"), K).lam0 == 2.0
    assert make_rule("fresh", RunConfig(rule="fresh", lr=0.2)).base_lr == 0.2
    used = {rule: RunConfig(rule=rule, lr=0.2).rule_settings_used for rule in ("adagrad", "dcasgd", "sgd", "add")}
    assert used == {"adagrad": {"server_lr_used": 0.01}, "dcasgd": {"dc_lambda_used": 2.0},
                    "sgd": {"server_lr_used": 0.2}, "add": {}}


def test_a_value_the_user_gives_wins_over_the_rules():
    given = RunConfig(rule="adagrad", server_lr=0.05, dc_lambda=0.5)
    assert make_rule("adagrad", given).base_lr == 0.05 and given.rule_settings_used == {"server_lr_used": 0.05}
    assert make_rule("dcasgd", dataclasses.replace(given, rule="dcasgd"), K).lam0 == 0.5


@pytest.mark.parametrize("rule", RULES)
def test_a_rule_defaults_only_keys_the_config_leaves_unset(rule):
    """A key a rule gives its own default must be None in the config until a user sets
    it: a value there could not be told from one the user gave."""
    assert all(getattr(RunConfig(), key) is None for key in RULES[rule].DEFAULTS)


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





# fresh: S = 2 minibatches a step, gradients up to R = 1 versions old, server momentum,
# weight decay and the linear lr rule; over SCHEDULE clients 1 and 2 (which never pull)
# fall 2 versions behind and are dropped, and steps gather pushes 1 version old
FRESH = RunConfig(lr=0.05, server_momentum=0.9, weight_decay=1e-3, fresh_batch=2, max_staleness=1,
                  lr_scaling="linear")


def play_fresh(settings: RunConfig, clients: int = K):
    """The fresh rule in a Store over SCHEDULE (client 0 pulls after each push): (final
    weights, per push: (staleness, dropped), the store)."""
    store = Store(vectors(0, 1, 1.0)[0], make_rule("fresh", settings, clients))
    for c in range(clients):
        store.pull(c)
    seen = []
    for c, push in zip(SCHEDULE, vectors(1, len(SCHEDULE))):
        result = store.apply(c, push)
        assert result.accepted != result.dropped
        seen.append((result.staleness, result.dropped))
        if c == 0:
            store.pull(0)
    return store.weights.copy(), seen, store


def fresh_reference(settings: RunConfig) -> tuple[np.ndarray, list[tuple[int, bool]]]:
    """Float64: versions move only at a step; a push more than R versions behind is left out."""
    w = vectors(0, 1, 1.0)[0].astype(np.float64)
    version, pulled, total, covered, buffer, seen = 0, {c: 0 for c in range(K)}, 0.0, 0, None, []
    for c, push in zip(SCHEDULE, vectors(1, len(SCHEDULE))):
        tau = version - pulled[c]
        seen.append((tau, tau > settings.max_staleness))
        if tau <= settings.max_staleness:
            total, covered = total + push.astype(np.float64), covered + 1
            if covered == settings.fresh_batch:
                g = total / covered + settings.weight_decay * w
                buffer = g if buffer is None else settings.server_momentum * buffer + g
                scale = {"linear": covered, "sqrt": covered ** 0.5, "none": 1}[settings.lr_scaling]
                w = w - settings.lr * scale * buffer
                version, total, covered = version + 1, 0.0, 0
        if c == 0:
            pulled[0] = version
    return w, seen


@pytest.mark.parametrize("scaling", ["linear", "sqrt"])
def test_fresh_gathers_fresh_gradients_and_drops_stale_ones(scaling):
    settings = dataclasses.replace(FRESH, lr_scaling=scaling)
    weights, seen, store = play_fresh(settings)
    expected, expected_seen = fresh_reference(settings)
    assert seen == expected_seen and sum(d for _, d in seen) == 3 and any(t == 1 and not d for t, d in seen)
    np.testing.assert_allclose(weights, expected, atol=1e-6)
    assert store.version == 2 and store.dropped == {1: 1, 2: 2} and sum(store.applied.values()) == 5


def test_fresh_gathers_a_push_of_every_client_by_default_whatever_n_sync():
    assert make_rule("fresh", RunConfig(n_sync=4), 8).step_batch == 32
    assert make_rule("fresh", RunConfig(n_sync=4, fresh_batch=5), 8).step_batch == 5


def test_fresh_with_one_client_and_s_1_is_the_sgd_rule():
    settings = RunConfig(lr=0.05, server_momentum=0.9, weight_decay=1e-3)
    stores = {name: Store(vectors(5, 1, 1.0)[0], make_rule(name, settings, 1)) for name in ("sgd", "fresh")}
    for push in vectors(6, 5):
        for store in stores.values():
            store.pull(0)
            assert store.apply(0, push).accepted
    np.testing.assert_allclose(stores["fresh"].weights, stores["sgd"].weights, atol=1e-7)
    assert stores["fresh"].version == 5


def test_a_dropped_push_changes_nothing_but_its_counters():
    store = Store(vectors(0, 1, 1.0)[0], make_rule("fresh", FRESH, K))
    for c in range(K):
        store.pull(c)
    for push in vectors(2, 2):  # client 0: one step, so client 1 is a version behind ...
        store.apply(0, push)
    store.apply(0, vectors(3, 1)[0])  # ... and a push is being gathered
    store.pull(0)
    store.apply(0, vectors(4, 1)[0])  # the second step: client 1 is 2 versions behind
    before = store.state()
    result = store.apply(1, vectors(5, 1, 10.0)[0])
    assert result.dropped and not result.accepted and result.reason == "staleness 2 > max_staleness 1"
    after = store.state()
    assert before.keys() == after.keys()
    for key in before:
        if key != "store.dropped":
            np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    assert store.dropped == {1: 1}


def test_fresh_flush_takes_the_step_with_what_was_gathered():
    store = Store(np.zeros(N, np.float32), make_rule("fresh", RunConfig(lr=0.1, fresh_batch=4), K))
    store.pull(0)
    assert store.apply(0, np.ones(N, np.float32)).gathered and store.version == 0
    assert store.flush() and store.version == 1 and not store.flush()
    np.testing.assert_allclose(store.weights, -0.1 * np.ones(N), atol=1e-7)  # the mean of one push


@pytest.mark.parametrize("every", [0, 2])
def test_nesterov_plain_steps_and_momentum_once_every_n_pushes(every):
    settings = RunConfig(rule="nesterov", nesterov_every=every, nesterov_momentum=0.8, outer_lr=1.0)
    n = every or K
    kept = {"total": 0.0, "m": 0.0, "count": 0}

    def update(w, d, c, tau, pulled):
        w = w + d / n
        kept["total"], kept["count"] = kept["total"] + d, kept["count"] + 1
        if kept["count"] == n:
            kept["m"] = 0.8 * kept["m"] + kept["total"] / n
            w = w + 0.8 * kept["m"]
            kept["total"], kept["count"] = 0.0, 0
        return w
    np.testing.assert_allclose(play("nesterov", settings)[0], reference(update), atol=1e-6)


def test_nesterov_with_n_equal_rounds_is_one_nesterov_step_of_the_mean_change():
    """K clients pushing in rounds from the same weights: each round moves the weights by
    the mean change plus beta m, m = beta m + mean: Nesterov's outer step."""
    settings = RunConfig(rule="nesterov", nesterov_momentum=0.5, outer_lr=1.0)
    store = Store(np.zeros(N, np.float32), make_rule("nesterov", settings, K))
    w, m = np.zeros(N), np.zeros(N)
    for round_ in range(3):
        pushes = vectors(10 + round_, K)
        for c, push in enumerate(pushes):
            store.apply(c, push)
        mean = np.mean(np.array(pushes, np.float64), axis=0)
        m = 0.5 * m + mean
        w = w + mean + 0.5 * m
    np.testing.assert_allclose(store.weights, w, atol=1e-6)


# rules whose state holds pushes half gathered at the checkpoint (fresh, with drops too)
GATHERING = [("fresh", FRESH), ("fresh", RunConfig(fresh_batch=4, max_staleness=7, server_momentum=0.9)),
             ("nesterov", RunConfig(nesterov_every=2))]


@pytest.mark.parametrize("rule,settings", [(rule, SETTINGS) for rule in RULES] + GATHERING,
                         ids=[*RULES, "fresh-dropping", "fresh-gathering", "nesterov-2"])
def test_rule_state_survives_a_checkpoint_exactly(tmp_path, rule, settings):
    """A part of the schedule, a checkpoint, a fresh Store loaded from it, the rest: the
    same weights, rule state, counters and noise scale, to the bit, as without it."""
    def run(checkpoint_at: int | None) -> dict:
        store = Store(vectors(0, 1, 1.0)[0], make_rule(rule, settings, K))
        for c in range(K):
            store.pull(c)
        for i, (c, push) in enumerate(zip(SCHEDULE, vectors(1, len(SCHEDULE)))):
            if i == checkpoint_at:
                save_arrays(tmp_path / "ck.npz", store.state())
                store = Store(np.zeros(N, np.float32), make_rule(rule, settings, K))
                store.load_state(load_arrays(tmp_path / "ck.npz"))
            store.apply(c, push)
            if c == 0:
                store.pull(0)
        return store.state()
    whole, resumed = run(None), run(3)
    assert whole.keys() == resumed.keys()
    for key in whole:
        np.testing.assert_array_equal(resumed[key], whole[key], err_msg=key)


def test_a_run_recorded_before_rules_had_defaults_resumes_at_the_lr_it_ran_with(tmp_path):
    """Adagrad took the run's lr as its own before its default (0.01) was its own: an old
    record, with no `server_lr_used`, resumes at that lr, not at the new default."""
    import json

    from experiments.run.resume import recorded_config

    (tmp_path / "config.json").write_text(json.dumps({"rule": "adagrad", "lr": 0.03, "server_lr": None}))
    assert recorded_config(tmp_path)["server_lr"] == 0.03
    (tmp_path / "config.json").write_text(json.dumps({"rule": "adagrad", "lr": 0.03, "server_lr": None,
                                                      "server_lr_used": 0.01}))
    assert recorded_config(tmp_path)["server_lr"] == 0.01
