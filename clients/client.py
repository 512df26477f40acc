"""One model replica's training state: local optimizer steps between syncs, and what it pushes.

A `Client` owns flat vectors (weights, gradient) and its optimizer, and binds the vectors
into a shared `Replica` (the model) to compute: every parameter and its grad becomes a
view into the client's vectors, so binding costs a few pointer swaps, a push or pull
copies one buffer, and the default SGD step is one call over the whole vector
(clients/optimizers.py has the others). In an MPI run each process has one client on
its own replica; the simulator steps K clients on one replica. No MPI inside.

The client keeps `base`, the weights as they would be without its unpushed work.
A push hands over what the server's rule asks for (`pushes`): the work done since the
last push (the weight change, or for gradient rules the summed gradients), moving
`base` up to the current weights, or for elastic averaging (EASGD) the weights
themselves. A fetch replaces the weights with the server's plus any work not pushed
yet, so with n_push == n_fetch (the paper's setting) the client simply takes the
server's weights; under EASGD the answer to a push is the center that push moved, and
the client moves towards it by the same elastic step (its weights stay its own).
The optimizer's state (SGD's momentum, Adam's moments) and weight decay stay on the client.

On a GPU the host vectors that meet the wire (`base`, `incoming`, each push) are
page-locked, so the copies between them and the device are DMAs at full speed, and
each copy has finished before MPI touches its buffer. On a CPU they are plain numpy
and nothing is copied that was not before.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from clients.buffers import host_copy, host_empty
from clients.data import Split
from clients.optimizers import OptimizerSettings
from clients.sampling import Minibatches, ShardSampler
from paramserver.rules.easgd import EASGDRule
from paramserver.schedule import Schedule


@dataclass(frozen=True)
class StepResult:
    loss: float
    error: float
    samples: int
    lr: float
    epoch: int = 0             # the pass over the client's shard the minibatch is of (0: the first)

    def row(self, client: int, step: int, time: float) -> dict:
        """The minibatch's row in clients.jsonl (or warm_start.jsonl): the one place it is built."""
        return {"client": client, "step": step, "time": time, "loss": self.loss, "error": self.error,
                "samples": self.samples, "lr": self.lr, "epoch": self.epoch}


def classifies(outputs: torch.Tensor, targets: torch.Tensor) -> bool:
    """Whether outputs and targets look like classification: (n, C) scores for C >= 2
    classes against integer labels. Other targets (a user's regression loss, counts
    against one output) have no error rate and no label range."""
    return outputs.ndim == 2 and outputs.shape[1] > 1 and targets.ndim == 1 and not targets.is_floating_point()


def wrong(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Misclassified samples; NaN where the outputs do not classify, where an error rate
    means nothing."""
    if not classifies(outputs, targets):
        return math.nan
    return float((outputs.argmax(1) != targets).sum().item())


class Replica:
    """A model and its clients' optimizer settings, computing for whichever client is bound to it."""

    def __init__(self, model: nn.Module, *, lr: float, momentum: float, weight_decay: float,
                 device: str = "cpu", loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 **optimizer: Any):
        self.device = torch.device(device)
        self.loss = loss or nn.functional.cross_entropy
        self.model = model.to(self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # `optimizer`: OptimizerSettings' other keys (name, clip_grad_norm, precision, factory)
        self.optimizer = OptimizerSettings(lr=lr, momentum=momentum, weight_decay=weight_decay, **optimizer)
        self.bound: Client | None = None

    def initial_weights(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params]).float()

    def bind(self, client: "Client") -> None:
        """Make the model's parameters and grads views of `client`'s vectors."""
        if self.bound is client:
            return
        offset = 0
        for p in self.params:
            view = slice(offset, offset + p.numel())
            p.data = client.weights[view].view_as(p)
            # Autograd accumulates into an existing .grad in place, so grads stay views
            # as long as they are zeroed instead of set to None.
            p.grad = client.grad[view].view_as(p)
            offset += p.numel()
        self.bound = client


class Client:
    """`pushes`: "delta", "gradient" or "weights" (the rule's `pushes`); `elastic`: the
    EASGD coefficient alpha when the client pushes its weights; `schedule`: the run's lr
    schedule, whose lr a window trains at is the one of the progress its weights came
    with (`sync`), or that the collective modes set each step (`lr`). `workers`: the
    DataLoader workers that read its minibatches ahead (clients/sampling.py's Minibatches)."""

    def __init__(self, replica: Replica, train: Split, sampler: ShardSampler, pushes: str = "delta",
                 elastic: float = 0.0, schedule: Schedule | None = None, workers: int = 0):
        self.replica, self.train, self.sampler = replica, train, sampler
        self.batches = Minibatches(train, sampler, workers, pin=replica.device.type == "cuda")
        self.schedule = schedule
        self.lr = schedule.at(0) if schedule else replica.optimizer.lr
        self.weights = replica.initial_weights()
        self.grad = torch.zeros_like(self.weights)
        self.optimizer = replica.optimizer.build(self.weights, lambda: replica.params)
        self.pushes = pushes
        self.grad_sum = torch.zeros_like(self.weights) if pushes == "gradient" else None
        self.elastic = elastic
        self.answer_due = False  # an EASGD push awaits the center it moved
        self.base = host_copy(self.weights)
        self.incoming = host_empty(self.size, replica.device)  # where pulled weights land
        self.unpushed_steps = 0

    @property
    def size(self) -> int:
        return self.weights.numel()

    def step(self) -> StepResult:
        """One minibatch: forward, backward, local optimizer step."""
        result = self.compute()
        self.optimizer_step()
        return result

    def compute(self) -> StepResult:
        """Forward and backward on the next minibatch; the gradient lands in `self.grad`."""
        replica = self.replica
        replica.bind(self)
        epoch, x, y = self.batches.next()
        x, y = x.to(replica.device, non_blocking=True), y.to(replica.device, non_blocking=True)
        replica.model.train()
        self.grad.zero_()  # every parameter's grad is a view of it
        autocast = replica.optimizer.autocast
        with torch.autocast(replica.device.type, dtype=autocast, enabled=autocast is not None):
            logits = replica.model(x)
            loss = replica.loss(logits, y)
        self.optimizer.scale(loss).backward()
        return StepResult(loss.item(), wrong(logits, y) / len(y), len(y), self.lr, epoch)

    def optimizer_step(self) -> None:
        """The optimizer's step with the gradient in `self.grad` (possibly averaged
        meanwhile); a gradient push sums what it stepped with (clients/optimizers.py)."""
        self.replica.bind(self)  # a torch.optim optimizer steps the bound parameters
        self.optimizer.step(self.grad, self.lr, self.grad_sum)
        self.unpushed_steps += 1

    def take_push(self) -> np.ndarray:
        """The work since the last push, as one flat float32 host vector."""
        weights = host_copy(self.weights)
        if self.pushes == "weights":
            push, self.answer_due = weights, True
        elif self.grad_sum is not None:
            push = host_copy(self.grad_sum)
            self.grad_sum.zero_()
        else:  # into the old base, which the new one replaces: no buffer to allocate (at 0.8 MB 91-100 us, not 132-142)
            push = np.subtract(weights, self.base, out=self.base)
        self.base = weights
        self.unpushed_steps = 0
        return push

    def take_fragment(self, lo: int, hi: int) -> np.ndarray:
        """A streamed fragment's push (delta rules): the work since this slice of the
        weights was last pushed, on the slice alone; the rest waits for its own fragment."""
        weights = host_copy(self.weights[lo:hi])
        push = weights - self.base[lo:hi]
        self.base[lo:hi] = weights
        return push

    def restart(self) -> None:
        """Back from a failure: the work not pushed is lost and the optimizer starts
        afresh, as a restarted process would; the weights come with the next sync."""
        self.take_push()
        self.answer_due = False
        self.optimizer = self.replica.optimizer.build(self.weights, lambda: self.replica.params)

    def rewind(self, weights: torch.Tensor) -> None:
        """Back from a failure in local SGD (clients/collective.py): the round's local work
        is lost with the process, so it goes on from the round's start, `weights` (the last
        average), with the optimizer afresh as a restarted process would have it."""
        self.weights.copy_(weights)
        self.optimizer = self.replica.optimizer.build(self.weights, lambda: self.replica.params)

    def sync(self, weights: np.ndarray, samples: int | None = None, lo: int = 0) -> None:
        """Take the server's weights, keeping any local work not pushed yet; with the
        server's progress `samples`, train on at the schedule's lr there. `lo`: where
        `weights` start when they are a slice, a streamed fragment's answer: the work done
        there since that fragment was pushed is kept likewise (the client never waited).

        A blocking copy to the device (from the pinned `incoming`, one DMA): it is done
        when this returns, so MPI may receive the next weights into `incoming` at once."""
        if samples is not None and self.schedule is not None:
            self.lr = self.schedule.at(samples)
        hi = lo + weights.size
        if self.answer_due:
            self._elastic_step(weights)
        elif self.unpushed_steps:
            weights_now = host_copy(self.weights[lo:hi])
            self.weights[lo:hi].copy_(torch.from_numpy(weights + (weights_now - self.base[lo:hi])))
        else:
            self.weights[lo:hi].copy_(torch.from_numpy(weights))
        np.copyto(self.base[lo:hi], weights)

    def _elastic_step(self, center: np.ndarray) -> None:
        """The rule's step back towards the center that answered the push (EASGD's)."""
        EASGDRule.follow(self.weights, torch.from_numpy(center).to(self.weights.device), self.elastic)
        self.answer_due = False
