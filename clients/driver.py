"""The client driver: the training loop with its sync points, over a Transport.

    pull -> [step ... step] -> push (+ fetch) -> [step ...] -> ... -> STOP

A push goes every `n_push` minibatches and at the last one (so no work is lost), a
fetch every `n_fetch` minibatches before the last. The minibatch rows travel inside
the push, to be written by the server's rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from clients.client import Client
from paramserver.config import InjectedFault
from paramserver.protocol import Pull, Push, Stop, Tag
from paramserver.transport import Transport


@dataclass(frozen=True)
class ClientPlan:
    index: int             # client number, 0..K-1 (rows carry it)
    steps: int
    n_push: int
    n_fetch: int
    timeout: float         # longest wait for the server's reply
    server: int = 0
    fault_step: int | None = None


def run_client(transport: Transport, client: Client, plan: ClientPlan,
               clock: Callable[[], float]) -> int:
    """Train for `plan.steps` minibatches; returns the number of pushes sent."""
    transport.send(plan.server, Tag.PULL, Pull())
    _receive_weights(transport, client, plan)
    rows, pushes = [], 0
    for step in range(1, plan.steps + 1):
        result = client.step()
        rows.append({"client": plan.index, "step": step, "time": clock(), "loss": result.loss,
                     "error": result.error, "samples": result.samples})
        if step == plan.fault_step:
            raise InjectedFault(f"injected fault on client {plan.index} at step {step}")
        last = step == plan.steps
        fetch = step % plan.n_fetch == 0 and not last
        if step % plan.n_push == 0 or last:
            push = client.take_push()
            transport.send(plan.server, Tag.PUSH, Push(step, push.size, fetch, rows=tuple(rows)), push)
            rows, pushes = [], pushes + 1
        elif fetch:
            transport.send(plan.server, Tag.PULL, Pull())
        if fetch:
            _receive_weights(transport, client, plan)
    transport.send(plan.server, Tag.STOP, Stop(plan.steps, pushes))
    return pushes


def _receive_weights(transport: Transport, client: Client, plan: ClientPlan) -> None:
    transport.recv(plan.timeout, source=plan.server, tag=Tag.WEIGHTS)
    weights = transport.recv_payload(plan.server, client.incoming, plan.timeout)
    client.sync(weights)
