"""Store and update rules in one process: arithmetic, versions, staleness, rejection."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from runconfig.settings import RunConfig
from paramserver.rules import make_rule
from paramserver.store import Store
from rundir.durable import load_arrays, save_arrays


def test_add_rule_adds_delta_and_bumps_version():
    store = Store(np.arange(4, dtype=np.float32), make_rule("add", RunConfig()))
    store.pull(0)
    result = store.apply(0, np.full(4, 0.5, np.float32))
    assert result.accepted and result.version == 1 and store.version == 1
    np.testing.assert_array_equal(store.weights, np.arange(4) + 0.5)


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 5e-4)])
def test_sgd_rule_matches_torch_sgd(momentum, weight_decay):
    rng = np.random.default_rng(1)
    start = rng.standard_normal(100).astype(np.float32)
    param = torch.nn.Parameter(torch.from_numpy(start.copy()))
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=momentum, weight_decay=weight_decay)
    store = Store(start, make_rule("sgd", RunConfig(lr=0.1, server_momentum=momentum, weight_decay=weight_decay)))
    for _ in range(5):
        grad = rng.standard_normal(100).astype(np.float32)
        param.grad = torch.from_numpy(grad.copy())
        optimizer.step()
        store.apply(0, grad)
    np.testing.assert_allclose(store.weights, param.detach().numpy(), atol=1e-6)


def test_staleness_counts_pushes_since_the_clients_pull():
    store = Store(np.zeros(3, np.float32), make_rule("add", RunConfig()))
    for client in range(3):
        store.pull(client)  # everyone holds version 0
    delta = np.ones(3, np.float32)
    assert [store.apply(c, delta).staleness for c in range(3)] == [0, 1, 2]
    store.pull(0)
    assert store.apply(0, delta).staleness == 0
    assert store.apply(1, delta).staleness == 4  # pulled at 0, server now at 4
    assert store.version == 5
    assert store.staleness == {0: 2, 1: 1, 2: 1, 4: 1}
    assert store.staleness_stats()["max"] == 4


@pytest.mark.parametrize("push,reason", [
    (np.ones(5, np.float32), "length 5"),
    (np.ones(4, np.float64), "dtype float64"),
    (np.array([1, np.nan, 1, 1], np.float32), "NaN"),
    (np.array([1, 1, np.inf, 1], np.float32), "Inf"),
    (np.array([-np.inf, 1, 1, 1], np.float32), "Inf"),
])
def test_bad_pushes_are_rejected_and_never_touch_the_weights(push, reason):
    store = Store(np.arange(4, dtype=np.float32), make_rule("add", RunConfig()))
    store.pull(0)
    result = store.apply(0, push)
    assert not result.accepted and reason in result.reason
    np.testing.assert_array_equal(store.weights, np.arange(4))
    assert store.version == 0 and store.rejected[0] == 1 and sum(store.applied.values()) == 0


def test_large_finite_values_are_not_mistaken_for_inf():
    store = Store(np.zeros(4, np.float32), make_rule("add", RunConfig()))
    assert store.apply(0, np.full(4, 3e38, np.float32)).accepted  # their float32 sum would overflow


def test_checkpoint_round_trip_without_pickle(tmp_path):
    store = Store(np.arange(6, dtype=np.float32), make_rule("sgd", RunConfig(lr=0.1, server_momentum=0.9, weight_decay=0.0)))
    store.apply(0, np.ones(6, np.float32))
    save_arrays(tmp_path / "ck.npz", store.state())
    restored = Store(np.zeros(6, np.float32), make_rule("sgd", RunConfig(lr=0.1, server_momentum=0.9, weight_decay=0.0)))
    restored.load_state(load_arrays(tmp_path / "ck.npz"))  # load_arrays uses allow_pickle=False
    assert restored.version == 1
    np.testing.assert_array_equal(restored.weights, store.weights)
    np.testing.assert_array_equal(restored.rule.buffer.numpy(), store.rule.buffer.numpy())
    with pytest.raises(ValueError, match="holds 6 weights, the model has 3"):
        Store(np.zeros(3, np.float32), make_rule("add", RunConfig())).load_state(load_arrays(tmp_path / "ck.npz"))


@pytest.mark.parametrize("where", [0.5, 0.9])
def test_a_damaged_checkpoint_is_refused(tmp_path, where):
    from rundir.durable import CorruptFile

    path = tmp_path / "ck.npz"
    save_arrays(path, {"weights": np.arange(1000, dtype=np.float32), "version": np.array(3)})
    data = bytearray(path.read_bytes())
    data[int(where * len(data))] ^= 0xFF  # one flipped byte, as a bad disk would
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFile, match="ck.npz"):
        load_arrays(path)


def test_a_checkpoint_with_tampered_arrays_fails_its_checksum(tmp_path):
    from rundir.durable import CorruptFile

    path = tmp_path / "ck.npz"
    save_arrays(path, {"weights": np.zeros(4, np.float32)})
    with np.load(path) as data:
        arrays = dict(data)
    arrays["weights"] = np.ones(4, np.float32)  # rewritten as a valid zip, old checksum kept
    np.savez(path, **arrays)
    with pytest.raises(CorruptFile, match="checksum mismatch"):
        load_arrays(path)
