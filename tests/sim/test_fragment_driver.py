"""The MPI client driver's streamed fragments (clients/driver.py's `_stream`), over a link
to the real server in this process: at most two fragments in flight, each answer taken
at the next fragment boundary and every one before the last whole push and STOP, into a
vector of its own; and one client ends where the simulator's does, bit for bit."""
from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pytest

from clients.client import Client, Replica
from clients.data import load_dataset
from clients.driver import run_client
from clients.loop import ClientLoop, ClientPlan
from clients.models import build_model, flat_weights
from clients.sampling import ShardSampler, shard_indices
from experiments.sim.simulator import Simulation, SimTiming, StepClock
from paramserver.drivers.inprocess import InProcess
from paramserver.recorder import Recorder
from paramserver.rules import make_rule
from paramserver.state import ServerState
from paramserver.store import Store
from paramserver.wire import frame
from paramserver.wire.protocol import Tag
from rundir.layout import RunDir
from runconfig.settings import RunConfig
from tests.reference import at_run_threads
from tests.unit.test_fragment_shards import Servers, sharded

STEPS, H, P = 14, 4, 2


class Served:
    """A `Link` to the server in this process: a message is handled as it is sent, its
    replies held until the client completes their receives (as MPI's wait on the wire);
    `log` says what went and what was taken, in order."""

    def __init__(self, server: InProcess):
        self.server, self.held, self.log, self.landed = server, deque(), [], []

    def expect_weights(self, sources: list[int], intos: list[np.ndarray]) -> list:
        return list(intos)

    def send(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None, timeout: float = 0) -> None:
        self.send_many([(dest, tag, header, payload)], timeout)

    def send_many(self, messages: list, timeout: float = 0) -> None:
        for _, tag, header, payload in messages:
            self.log.append(("sent", Tag(tag).name, getattr(header, "fragment", -1)))
            self.held.extend(self.server.deliver(1, tag, header, payload))

    def complete(self, intos: list, peers: list[int], nbytes: int, timeout: float) -> list:
        headers = []
        for into in intos:
            reply = self.held.popleft()
            into[:] = reply.payload
            self.landed.append(into)
            self.log.append(("taken", "WEIGHTS", reply.header.fragment))
            headers.append(reply.header)
        return headers


@pytest.fixture(scope="module")
def dataset(tiny_npz):
    return load_dataset(str(tiny_npz))


def model(dataset):
    return build_model("cnn", dataset.shape, dataset.num_classes, seed=0)


def client_of(dataset) -> Client:
    sampler = ShardSampler(shard_indices(len(dataset.train), 1, 0, 0), 32, 0, 0)
    return Client(Replica(model(dataset), lr=0.05, momentum=0.9, weight_decay=0.0), dataset.train, sampler)


@at_run_threads
def one_client(path, dataset, drive) -> np.ndarray:
    """One client of `STEPS` minibatches, n_sync H in P fragments, driven by `drive(loop or
    client, plan, server)`; the server's final weights."""
    state = ServerState(Store(flat_weights(model(dataset)), make_rule("add", RunConfig(rule="add"))), [1],
                        fragments=P)
    run = RunDir(path)
    run.create()
    recorder = Recorder(run, state, clock=lambda: 0.0)
    drive(client_of(dataset), ClientPlan(0, STEPS, H, H, timeout=1.0, fragments=P), InProcess(state, recorder))
    recorder.close()
    assert state.tally.stops and state.tally.rejected == 0
    return state.store.weights.copy()


def test_the_driver_streams_fragments_as_the_simulator_does(tmp_path, dataset):
    links = []

    def over_link(client, plan, server):
        links.append(Served(server))
        run_client(links[0], client, plan, clock=lambda: 0.0)

    def simulated(client, plan, server):
        clock = StepClock(1.0)
        Simulation([ClientLoop(client, plan, clock)], [clock], SimTiming(1.0, 0.0, 1e9, 0.0)).run(server)

    driven = one_client(tmp_path / "driven", dataset, over_link)
    np.testing.assert_array_equal(driven, one_client(tmp_path / "sim", dataset, simulated))
    log = links[0].log
    # a fragment every H / P = 2 minibatches (6 of them), the last push (step 14) whole
    assert [f for what, tag, f in log if what == "sent" and tag == "PUSH"] == [0, 1, 0, 1, 0, 1, -1]
    out = 0
    for what, tag, fragment in log[2:]:  # after the first pull
        if what == "sent" and fragment < 0:
            assert out == 0, f"{tag} sent with {out} answers out"
        out += 1 if (what, fragment >= 0) == ("sent", True) else -1 if what == "taken" else 0
        assert out <= 2
    # each answer was taken after the next fragment went (none after the first), in order
    taken = [i for i, (what, _, _) in enumerate(log) if what == "taken"][1:]
    assert [log[i - 1][:2] for i in taken[:-1]] == [("sent", "PUSH")] * 5 and log[-1][1] == "STOP"
    landings = {frame.address(into) for into in links[0].landed[1:]}
    assert len(landings) == P and all(frame.around(into, 0) is not None for into in links[0].landed[1:])


@pytest.mark.parametrize("servers", [2, 3])
def test_the_driver_streams_fragments_to_sharded_servers_as_the_simulator_does(tmp_path, dataset, servers):
    """The same client over a link to `servers` in-process servers, each its slice: each
    fragment goes as its pieces (a header alone to a server it misses), each answer comes
    back as pieces put together, and the servers' slices end as the simulator's one
    server's weights, bit for bit."""
    @at_run_threads
    def to_shards() -> tuple[np.ndarray, Servers]:
        made = sharded(tmp_path / "shards", flat_weights(model(dataset)), servers, P, "add", "none")
        link = Servers(made)
        run_client(link, client_of(dataset), ClientPlan(0, STEPS, H, H, timeout=1.0, fragments=P,
                                                        servers=tuple(made)), clock=lambda: 0.0)
        for server in made.values():
            server.recorder.close()
            assert server.state.tally.stops and server.state.tally.rejected == 0
        return np.concatenate([made[s].state.store.weights for s in range(servers)]), link

    def simulated(client, plan, server):
        clock = StepClock(1.0)
        Simulation([ClientLoop(client, plan, clock)], [clock], SimTiming(1.0, 0.0, 1e9, 0.0)).run(server)

    weights, link = to_shards()
    np.testing.assert_array_equal(weights, one_client(tmp_path / "sim", dataset, simulated))
    assert link.headers_alone > 0  # with P = 2 every fragment misses a server
