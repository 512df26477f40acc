"""How a client waits for its transfers, over real MPI in this process alone: polling,
yielding the core, for as long as the bytes should take, except where its host's
clients outnumber its cores, where it sleeps from the start (`Transport.wait_as_client`)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tests.conftest import LAUNCHER

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


LEAVER = """
import os, sys, time
from pathlib import Path
from paramserver.wire.transport import Transport
transport, pid_file = Transport.world(timeout=2.0), Path(sys.argv[1])


def exited(pid):  # gone, or a zombie: hydra's proxy, whose sockets it closed, may not reap it until the job ends
    try:
        return "State:\\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


if transport.rank == 0:
    pid_file.write_text(str(os.getpid()))
else:  # never reaches MPI_Finalize while rank 0 waits there
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (pid_file.exists() and exited(pid_file.read_text())):
        time.sleep(0.05)
    print("rank 0 gone" if time.monotonic() < deadline else "rank 0 still in MPI_Finalize", flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(LAUNCHER.kind != "hydra", reason="hydra's PMI barrier; Open MPI's launcher ends the job "
                    "with the rank that leaves (measured: the waiting rank printed nothing)")
def test_a_rank_leaves_mpi_finalize_after_its_timeout_when_a_peer_never_comes(tmp_path):
    """MPI_Finalize waits for every rank (MPICH: in the launcher's PMI barrier, a blocking
    socket read); a client once outlived its server there. A rank leaves it after its
    transport's timeout (the stall timeout), its stack on stderr."""
    from tests.conftest import MPIEXEC, run_command

    result = run_command([MPIEXEC, *LAUNCHER.flags(), "-n", "2", sys.executable, "-c", LEAVER,
                          str(tmp_path / "pid")], timeout=120)
    assert "rank 0 gone" in result.stdout, result.stdout + result.stderr
    # held there, it left with its stack (liveness.finish_within); hydra's barrier has also
    # let it through at once (exit status 0, seen once in a full suite), which is no hang either
    assert result.returncode == 0 or "_finish" in result.stderr, result.stderr


DEAD_PEER = """
import os, signal, time
import numpy as np
from mpi4py import MPI
from paramserver.wire.transport import Posted, Transport
transport = Transport.world(timeout=5.0)
transport.comm.Barrier()
if transport.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
data = np.zeros(8 << 20, np.uint8)  # past the eager limit: out only once rank 1 takes it, which it never does
posted = Posted([transport.comm.Isend([data, MPI.BYTE], 1, 5)])
deadline = time.monotonic() + 30
while time.monotonic() < deadline and not transport.done(posted):
    time.sleep(0.05)
print("out" if time.monotonic() < deadline else "never out", flush=True)
"""


@pytest.mark.skipif(LAUNCHER.kind != "openmpi", reason="ULFM's: MPICH's launcher may end the job with the dead rank")
def test_a_send_to_a_rank_that_died_is_out_not_an_error(tmp_path):
    """ULFM completes the send in error (MPI_ERR_IN_STATUS, the status's error
    MPI_ERR_PROC_FAILED); `done` says it is out, so a staging block it read is free
    again: that check raised once and ended a server whose clients were being killed."""
    from tests.conftest import MPIEXEC, run_command

    result = run_command([MPIEXEC, *LAUNCHER.flags(), "-n", "2", sys.executable, "-c", DEAD_PEER], timeout=120)
    assert "out" in result.stdout.split(), result.stdout + result.stderr
