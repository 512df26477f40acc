"""A soak in the simulator: 10^5 pushes from 32 clients through the real Store and the
server's `handle()`, and every one of them accounted for.

The simulator's event queue moves the messages (its virtual clock decides the order in
which the server takes them); each client is a stub that trains nothing, so the run costs
only the server's path. The test keeps its own books from what crosses the link (which
message the server took when, which version it sent back) and checks the server's logs,
the Store's counters and statistics, and the final weights against them.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from experiments.sim.simulator import Simulation, SimTiming, StepClock
from paramserver.drivers.inprocess import InProcess
from paramserver.wire.protocol import Outgoing, Pull, Push, Stop, Tag
from rundir.durable import read_jsonl
from tests.conftest import make_server

CLIENTS, PUSHES_EACH, SIZE, SEED = 32, 3125, 1000, 7  # 10^5 pushes of 1,000 floats
P_PULL, P_NO_FETCH = 0.05, 0.1  # of a client's sync points: a bare pull; a push without fetch
# Weights and updates are multiples of 2^-10 and every weight stays below 2^7, so every
# float32 sum the server makes is exact: one push lost or applied twice shows in the weights.
UNIT = np.float32(2.0 ** -10)
TIMING = SimTiming(step_time=1e-3, apply_time=20e-6, bandwidth=1e9, latency=2e-6)


class StubClient:
    """Stands in for a ClientLoop and its Client: a seeded stream of small updates, pushed
    with or without fetch, and bare pulls, at a speed of its own; nothing trained."""

    def __init__(self, index: int):
        self.index, self.rng = index, np.random.default_rng([SEED, index])
        self.clock = StepClock(TIMING.step_time * self.rng.uniform(0.5, 1.5))
        self.step = self.pushes = 0
        self.done = False
        self.behind = False                  # whole pushes: never waits on a streamed fragment
        self.sent = np.zeros(SIZE)           # float64 sum of what it pushed
        self.pushed: list[int] = []          # the step of each push

    def take_weights(self, weights: np.ndarray, samples: int | None = None) -> None:
        assert weights.shape == (SIZE,)

    def state_before(self, message: Outgoing) -> None:
        """No optimizer, so no state to send for a checkpoint."""

    def advance(self) -> tuple[Outgoing, bool]:
        """1 to 3 minibatches of virtual time, then what a client sends at a sync point."""
        for _ in range(self.rng.integers(1, 4)):
            self.clock()
            self.step += 1
        if self.pushes == PUSHES_EACH:
            self.done = True
            return Outgoing(Tag.STOP, Stop(self.step, self.pushes)), False
        draw = self.rng.random()
        if draw < P_PULL:
            return Outgoing(Tag.PULL, Pull()), True
        fetch = draw >= P_PULL + P_NO_FETCH
        return self._push(fetch), fetch

    def _push(self, fetch: bool) -> Outgoing:
        update = self.rng.integers(-7, 8, SIZE).astype(np.float32) * UNIT
        self.sent += update
        self.pushes += 1
        self.pushed.append(self.step)
        return Outgoing(Tag.PUSH, Push(self.step, SIZE, fetch, rows=({"client": self.index, "step": self.step},)),
                        update)


class Noting(InProcess):
    """The simulation's server, also noting each message it took, in its order:
    (rank, tag, the push's step, the versions of the weights sent back)."""

    def __init__(self, server: InProcess) -> None:
        super().__init__(server.state, server.recorder)
        self.taken: list[tuple[int, Tag, int | None, list[int]]] = []

    def deliver(self, source, tag, header, payload=None):
        replies = super().deliver(source, tag, header, payload)
        step = header.step if tag == Tag.PUSH else None
        self.taken.append((source, tag, step, [reply.header.version for reply in replies]))
        return replies


def books(taken: list[tuple[int, Tag, int | None, list[int]]]) -> list[tuple[int, int, int, int]]:
    """(client, step, version it last pulled, staleness) of each push in the server's order,
    counting versions here: one per push taken, none otherwise. Also checks that every
    reply carried the version counted so far."""
    version, pulled, pushes = 0, {}, []
    for rank, tag, step, replies in taken:
        if tag == Tag.PUSH:
            pushes.append((rank - 1, step, pulled[rank], version - pulled[rank]))
            version += 1
        for sent in replies:
            assert sent == version
            pulled[rank] = sent
    return pushes


def staleness_stats(staleness: list[int]) -> dict:
    """What Store.staleness_stats() should say, from the test's own staleness list."""
    values = np.array(staleness)
    return {"mean": float(values.mean()), "max": int(values.max()), "p50": float(np.percentile(values, 50)),
            "p90": float(np.percentile(values, 90)),
            "histogram": {str(k): n for k, n in sorted(Counter(staleness).items())}}


@pytest.mark.slow
@pytest.mark.long
def test_soak_every_push_is_applied_once_with_the_staleness_it_had(tmp_path):
    stubs = [StubClient(i) for i in range(CLIENTS)]
    start = np.random.default_rng(SEED).integers(-64, 64, SIZE).astype(np.float32)
    simulation = Simulation(stubs, [stub.clock for stub in stubs], TIMING)
    server = Noting(make_server(tmp_path / "run", start, CLIENTS, clock=lambda: simulation.now))
    simulation.run(server)
    server.recorder.close()
    store, tally = server.state.store, server.state.tally

    expected = books(server.taken)
    total = CLIENTS * PUSHES_EACH
    assert len(expected) == total and store.version == total and tally.rejected == 0
    assert sorted((c, step) for c, step, _, _ in expected) == [(s.index, step) for s in stubs for step in s.pushed]
    assert store.applied == {s.index: PUSHES_EACH for s in stubs}
    assert tally.stops == {s.index + 1: Stop(s.step, PUSHES_EACH) for s in stubs}

    server_rows = list(read_jsonl(tmp_path / "run" / "server.jsonl"))
    assert [(r["client"], r["version"], r["staleness"]) for r in server_rows] == \
        [(c, version, staleness) for version, (c, _, _, staleness) in enumerate(expected, start=1)]
    client_rows = list(read_jsonl(tmp_path / "run" / "clients.jsonl"))
    assert [(r["client"], r["step"], r["version_pulled"], r["staleness"]) for r in client_rows] == expected

    assert store.staleness_stats() == staleness_stats([st for _, _, _, st in expected])
    np.testing.assert_array_equal(store.weights, start + sum(s.sent for s in stubs))
