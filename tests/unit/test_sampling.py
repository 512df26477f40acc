"""Tests for clients.sampling: each client's shard and its seeded, resumable order."""
from __future__ import annotations

import numpy as np
import pytest

from clients.data import DataError
from clients.sampling import ShardSampler, shard_indices


def test_shards_are_disjoint_and_cover_everything() -> None:
    shards = [shard_indices(103, 4, k, seed=7) for k in range(4)]
    assert [len(s) for s in shards] == [26, 26, 26, 25]
    assert all(s.dtype == np.int64 for s in shards)
    np.testing.assert_array_equal(np.sort(np.concatenate(shards)), np.arange(103))
    np.testing.assert_array_equal(shard_indices(103, 4, 2, seed=7), shards[2])
    assert not np.array_equal(shard_indices(103, 4, 2, seed=8), shards[2])
    for bad in (-1, 4):
        with pytest.raises(ValueError):
            shard_indices(103, 4, bad, seed=7)


def _epochs(sampler: ShardSampler, n: int) -> list[np.ndarray]:
    return [sampler.next() for _ in range(n)]


def test_sampler_order_comes_from_seed_client_and_epoch() -> None:
    indices = np.arange(100, 130)
    first = ShardSampler(indices, 5, seed=3, client=1).next()
    expected = indices[np.random.default_rng([3, 1, 0]).permutation(30)][:5]
    np.testing.assert_array_equal(first, expected)
    a, b = _epochs(ShardSampler(indices, 5, 3, 1), 12), _epochs(ShardSampler(indices, 5, 3, 1), 12)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    other_client = _epochs(ShardSampler(indices, 5, 3, 2), 12)
    assert not all(np.array_equal(p, q) for p, q in zip(a, other_client))
    assert not np.array_equal(np.concatenate(a[:6]), np.concatenate(a[6:]))


def test_sampler_covers_shard_each_epoch_and_drops_partial_batch() -> None:
    indices = np.arange(50, 61)  # 11 samples, batch 4: two batches per epoch, 3 left over
    sampler = ShardSampler(indices, 4, seed=0, client=0)
    for epoch in range(3):
        assert sampler.epoch == epoch
        seen = np.concatenate(_epochs(sampler, 2))
        assert len(seen) == 8 and len(set(seen.tolist())) == 8 and set(seen.tolist()) <= set(indices.tolist())
    exact = ShardSampler(np.arange(12), 4, seed=0, client=0)
    for _ in range(2):
        np.testing.assert_array_equal(np.sort(np.concatenate(_epochs(exact, 3))), np.arange(12))


@pytest.mark.parametrize("done", [0, 5, 11, 12, 27, 45])
def test_sampler_seek_stands_where_a_sampler_that_ran_stands(done: int) -> None:
    indices = shard_indices(200, 3, 1, seed=5)  # 67 samples: 4 batches of 16 an epoch
    ran = ShardSampler(indices, 16, seed=5, client=1)
    for _ in range(done):
        ran.next()
    resumed = ShardSampler(indices, 16, seed=5, client=1)
    resumed.seek(done)
    assert resumed.epoch == ran.epoch == done // 4
    for _ in range(10):
        np.testing.assert_array_equal(resumed.next(), ran.next())


def test_sampler_rejects_shard_smaller_than_batch() -> None:
    with pytest.raises(DataError) as err:
        ShardSampler(np.arange(5), 8, seed=0, client=0)
    assert str(err.value) == "data: client shard has 5 samples, fewer than batch_size 8"


def test_minibatches_read_ahead_by_a_worker_are_the_clients_own_in_order_and_after_a_seek(tiny_npz):
    """One DataLoader worker reads the same batches, with their epochs, as the client
    reading them itself; positioned at a resumed step first, the same from there."""
    import torch

    from clients.data import load_dataset
    from clients.sampling import Minibatches, ShardSampler, shard_indices

    train = load_dataset(str(tiny_npz)).train
    shard = shard_indices(len(train), 2, 1, 0)

    def batches(workers: int, seek: int, n: int) -> list:
        sampler = ShardSampler(shard, 32, 0, 1)
        sampler.seek(seek)
        reader = Minibatches(train, sampler, workers)
        return [reader.next() for _ in range(n)]

    per_epoch = len(shard) // 32
    for seek in (0, per_epoch - 2):
        own, ahead = batches(0, seek, per_epoch + 3), batches(1, seek, per_epoch + 3)
        epochs = [(seek + i) // per_epoch for i in range(per_epoch + 3)]  # across an epoch's end
        assert [e for e, _, _ in own] == [e for e, _, _ in ahead] == epochs
        assert all(torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]) for a, b in zip(own, ahead))


def test_a_redealt_shard_changes_each_epoch_the_clients_shards_still_disjoint() -> None:
    """Under a run-wide budget each epoch deals the clients' shards afresh: over epochs a
    client sees more than its first share; within an epoch the clients' shards are
    disjoint and cover the set; a sampler seeked to a minibatch reads on as one that
    handed it out."""
    samplers = [ShardSampler(shard_indices(103, 4, k, seed=7), 5, 7, k, redeal=(103, 4)) for k in range(4)]
    per_epoch = [len(shard_indices(103, 4, k, seed=7)) // 5 for k in range(4)]  # 5, 5, 5, 5
    epochs = [[np.concatenate([s.next() for _ in range(n)]) for _ in range(3)] for s, n in zip(samplers, per_epoch)]
    for e in range(3):
        dealt = np.concatenate([epochs[k][e] for k in range(4)])
        assert len(np.unique(dealt)) == len(dealt) == 100  # disjoint: 4 x 25 of 103 (the remainders dropped)
    assert len(np.unique(np.concatenate(epochs[0]))) > 26  # client 0 saw more than one shard's worth
    again = ShardSampler(shard_indices(103, 4, 1, seed=7), 5, 7, 1, redeal=(103, 4))
    again.seek(7)
    np.testing.assert_array_equal(again.next(), epochs[1][1][10:15])
