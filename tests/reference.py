"""The plain single-process PyTorch SGD loop that async training must reduce to, and how
far two float32 computations of the same steps may lie apart."""
from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch

from clients.data import Dataset
from clients.devices import threads_kept
from clients.models import build_model
from clients.sampling import ShardSampler, shard_indices


# A run's torch threads without --threads (experiments/sim/simulator.py): a reference
# computes with them, since a kernel splits its sums by the threads it has.
RUN_THREADS = len(os.sched_getaffinity(0))


@contextmanager
def run_threads() -> Iterator[None]:
    """torch at RUN_THREADS threads in the block, at the count it had after it."""
    with threads_kept():
        torch.set_num_threads(RUN_THREADS)
        yield


def at_run_threads(function: Callable) -> Callable:
    """`function` computed under `run_threads`."""
    @functools.wraps(function)
    def at(*args, **kwargs):
        with run_threads():
            return function(*args, **kwargs)
    return at


def ulps_a_step(weights: np.ndarray, steps: int) -> float:
    """How far two float32 computations of the same `steps` SGD steps may lie apart: an
    ulp of the largest weight a step. The same operations may round differently where one
    side fuses a multiply-add that the other rounds twice (torch's vectorised body and its
    scalar tail, which fall on other elements in a flat vector than in separate tensors,
    and on AVX-512 than on AVX2); SGD's step is linear in the gradient, so at a stable lr
    one step's rounding is not amplified by the next (Adam's division by the root of tiny
    second moments would amplify it: those comparisons are exact, or made so)."""
    return steps * float(np.spacing(np.float32(np.abs(weights).max())))


def assert_steps_close(actual: np.ndarray, expected: np.ndarray, steps: int) -> None:
    """`actual` within `ulps_a_step` of `expected`, element by element."""
    np.testing.assert_allclose(actual, expected, atol=ulps_a_step(expected, steps), rtol=0)


@at_run_threads
def plain_sgd(dataset: Dataset, steps: int, *, model: str = "cnn", seed: int = 0, batch_size: int = 32,
              lr: float = 0.05, momentum: float = 0.9, weight_decay: float = 5e-4, clients: int = 1,
              optimizer: str = "SGD", lr_lambda: Callable[[int], float] | None = None,
              clip_grad_norm: float = 0.0, autocast: torch.dtype | None = None, nesterov: bool = False,
              through_server: bool = False) -> np.ndarray:
    """Final weights, flattened, of `steps` minibatches of torch.optim.SGD (or of another
    torch.optim class named by `optimizer`, at the same lr and weight decay), the gradient
    clipped by torch.nn.utils.clip_grad_norm_ to `clip_grad_norm` (0: not), the forward
    under torch.autocast to `autocast` (float16: with torch's GradScaler, as its recipe).

    Each minibatch joins the next `batch_size` samples of each of `clients` shards (in
    the order those clients would see them under the default run's budget), so one client gives client 0's run and K
    clients give the batch K*B that synchronous data parallelism is equivalent to.
    `lr_lambda`: a torch LambdaLR multiplier of the steps taken, stepped after each.
    `through_server`: each step's change reaches the weights as one client's delta push
    at n_sync 1 reaches the `add` rule's server, `w + (w' - w)` in float32 (one rounding,
    up to half an ulp of the weight, where w' - w is not exact), which the client then
    pulls: with it the loop is, operation for operation, what such a run computes."""
    net = build_model(model, dataset.shape, dataset.num_classes, seed)
    if optimizer == "SGD":
        optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay,
                                    nesterov=nesterov)
    else:
        optimizer = getattr(torch.optim, optimizer)(net.parameters(), lr=lr, weight_decay=weight_decay)
    scaler = torch.amp.GradScaler("cpu") if autocast == torch.float16 else None
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda) if lr_lambda else None
    # dealt afresh each epoch, as under the run's budget
    redeal = (len(dataset.train), clients) if clients > 1 else None
    samplers = [ShardSampler(shard_indices(len(dataset.train), clients, k, seed), batch_size, seed, k, redeal)
                for k in range(clients)]
    for _ in range(steps):
        x, y = dataset.train.batch(np.concatenate([s.next() for s in samplers]))
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            loss = torch.nn.functional.cross_entropy(net(x), y)
        if scaler:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        if clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip_grad_norm)
        before = [p.detach().clone() for p in net.parameters()] if through_server else []
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        with torch.no_grad():
            for p, w in zip(net.parameters(), before):
                p.copy_(w + (p - w))
        if scheduler:
            scheduler.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()


def plain_diloco(dataset: Dataset, rounds: int, h: int, *, clients: int, outer_lr: float, outer_momentum: float,
                 seed: int = 0, batch_size: int = 32, dtype: torch.dtype = torch.float64,
                 inner: Callable = lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4),
                 ) -> np.ndarray:
    """Final global weights, flattened, of synchronous DiLoCo (Douillard et al. 2023,
    Algorithm 1) written out: `clients` workers, each with its own inner optimizer
    (`inner(params)`, by default the tool's default SGD) kept across rounds, start every
    round from the global weights and take `h` steps on their shards (in the order the
    tool's clients read them); the outer
    torch.optim.SGD(lr=outer_lr, momentum=outer_momentum, nesterov=True) steps on the
    mean of (global - local). In `dtype` (float64: the arithmetic, free of float32's
    rounding)."""
    model = build_model("cnn", dataset.shape, dataset.num_classes, seed).to(dtype)
    workers = [build_model("cnn", dataset.shape, dataset.num_classes, seed).to(dtype) for _ in range(clients)]
    inners = [inner(w.parameters()) for w in workers]
    outer = torch.optim.SGD(model.parameters(), lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)
    redeal = (len(dataset.train), clients) if clients > 1 else None
    samplers = [ShardSampler(shard_indices(len(dataset.train), clients, k, seed), batch_size, seed, k, redeal)
                for k in range(clients)]
    for _ in range(rounds):
        for worker, opt, sampler in zip(workers, inners, samplers):
            worker.load_state_dict(model.state_dict())
            for _ in range(h):
                x, y = dataset.train.batch(sampler.next())
                opt.zero_grad()
                torch.nn.functional.cross_entropy(worker(x.to(dtype)), y).backward()
                opt.step()
        for p, *local in zip(model.parameters(), *(w.parameters() for w in workers)):
            p.grad = torch.stack([p.detach() - q.detach() for q in local]).mean(0)
        outer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
