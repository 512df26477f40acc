"""How a client waits for its transfers, over real MPI in this process alone: polling,
yielding the core, for as long as the bytes should take, except where its host's
clients outnumber its cores, where it sleeps from the start (`Transport.wait_as_client`)."""
from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("more_clients_than_cores", [-1, 0, 1])
def test_a_client_waits_for_a_transfer_asleep_only_where_the_clients_outnumber_the_cores(monkeypatch,
                                                                                         more_clients_than_cores):
    from mpi4py import MPI

    from paramserver.wire.transport import Posted, Transport

    transport = Transport(MPI.COMM_SELF)
    transport.wait_as_client(max(1, (os.cpu_count() or 1) + more_clients_than_cores))
    into, data, polled = np.zeros(4, np.float32), np.ones(4, np.float32), []

    def poll(done, timeout, check, busy, what, peers):  # the weights arrive while the wait polls
        polled.append(busy)
        MPI.COMM_SELF.Isend([data, MPI.FLOAT], dest=0, tag=7).Wait()
        assert done()

    monkeypatch.setattr(transport, "_poll", poll)
    transport.complete(Posted([MPI.COMM_SELF.Irecv([into, MPI.FLOAT], source=0, tag=7)]), [0], into.nbytes, 5)
    assert polled == ([0.0] if more_clients_than_cores > 0 else [0.01 + 16 / 1e9])  # yielding polls for 16 bytes
    np.testing.assert_array_equal(into, data)
