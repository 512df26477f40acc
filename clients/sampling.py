"""Each client's minibatch order, from seeds alone, so a run can be repeated and resumed exactly.

``shard_indices`` decides which training samples each client owns and ``ShardSampler``
the order it visits them, a pure function of (seed, client, epoch); ``Minibatches``
reads them in that order from a ``Split`` (clients/data.py), itself or ahead in
DataLoader workers.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from clients.data import DataError, Split


def shard_indices(n: int, n_shards: int, shard: int, seed: int | list[int]) -> np.ndarray:
    """A client's disjoint share of the training set; the shared seed makes all clients agree on it."""
    if n_shards < 1 or not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} out of range for {n_shards} shards")
    order = np.random.default_rng(seed).permutation(n)
    return np.array_split(order, n_shards)[shard].astype(np.int64)


def slot_indices(n: int, n_shards: int, slot: int, seed: int | list[int]) -> np.ndarray:
    """The samples of shard `slot`: one of the run's `n_shards` (`shard_indices`), or for a
    slot beyond them (a client that joined a job with no lost client's shard free:
    paramserver/membership.py) the whole training set, in an order of its own."""
    return shard_indices(n, n_shards, slot, seed) if slot < n_shards else np.arange(n, dtype=np.int64)


class ShardSampler:
    """Minibatches of one client's shard in an order fixed by (seed, client, epoch), so runs repeat and resume.

    ``epoch`` rolls over as soon as the last full batch of an epoch is handed out, so it
    counts finished epochs; the incomplete remainder of each epoch is dropped.

    ``redeal`` (n, shards): the client's shard of the n samples is dealt afresh each
    epoch (``shard_indices`` of (seed, epoch), as torch's DistributedSampler deals), for
    runs whose clients run different numbers of epochs (a run-wide budget under uneven
    speeds): a fixed shard would have a fast client learn its own share by heart.
    ``indices`` is then shard ``client`` of the first deal's size, which every deal keeps.
    """

    def __init__(self, indices: np.ndarray, batch_size: int, seed: int, client: int,
                 redeal: tuple[int, int] | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._indices = np.asarray(indices, dtype=np.int64)
        if len(self._indices) < batch_size:
            raise DataError(f"data: client shard has {len(self._indices)} samples, fewer than batch_size {batch_size}")
        self.batch_size, self.seed, self.client, self.redeal = batch_size, seed, client, redeal
        self.seek(0)

    def _shuffle(self) -> None:
        if self.redeal is not None:
            self._indices = shard_indices(*self.redeal, self.client, [self.seed, self.epoch])
        rng = np.random.default_rng([self.seed, self.client, self.epoch])
        self._order = self._indices[rng.permutation(len(self._indices))]

    def next(self) -> np.ndarray:
        batch = self._order[self._pos:self._pos + self.batch_size]
        self._pos += self.batch_size
        if self._pos + self.batch_size > len(self._order):
            self.epoch, self._pos = self.epoch + 1, 0
            self._shuffle()
        return batch

    def seek(self, batches: int) -> None:
        """Stand where a sampler is after handing out `batches` minibatches (for resume):
        the order is a pure function of (seed, client, epoch), so no state is saved."""
        per_epoch = len(self._indices) // self.batch_size
        self.epoch, self._pos = divmod(batches, per_epoch)
        self._pos *= self.batch_size
        self._shuffle()


class Minibatches:
    """A client's minibatches in its sampler's order, each with the epoch it is of: read
    here when asked (`workers` 0), or ahead by that many DataLoader worker processes, the
    order still the sampler's alone (so a run, and its resume, read the same batches;
    with `pin`, into page-locked memory for a GPU). The workers start at the first
    batch, after the sampler was positioned (`ShardSampler.seek`)."""

    def __init__(self, split: Split, sampler: ShardSampler, workers: int = 0, pin: bool = False):
        self.split, self.sampler, self.workers, self.pin = split, sampler, workers, pin
        self._ahead: Any = None

    def next(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        if self._ahead is None:
            batches, order = _Batches(self.split), _Order(self.sampler)
            if self.workers:
                from torch.utils.data import DataLoader
                self._ahead = iter(DataLoader(batches, sampler=order, batch_size=None, num_workers=self.workers,
                                              pin_memory=self.pin))
            else:
                self._ahead = (batches[key] for key in order)
        epoch, x, y = next(self._ahead)
        return int(epoch), x, y


class _Order:
    """The sampler's minibatches, with their epochs, for as long as the client asks."""

    def __init__(self, sampler: ShardSampler):
        self.sampler = sampler

    def __iter__(self):
        while True:
            epoch = self.sampler.epoch
            yield epoch, self.sampler.next()


class _Batches(torch.utils.data.Dataset):
    """A worker's read: one whole minibatch of the split, as the client reads it itself."""

    def __init__(self, split: Split):
        self.split = split

    def __getitem__(self, key: tuple[int, np.ndarray]) -> tuple[int, torch.Tensor, torch.Tensor]:
        epoch, idx = key
        return (epoch, *self.split.batch(idx))
