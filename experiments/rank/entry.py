"""Start a training job on MPI: each rank's role is decided here, once.

`asgd train` run by hand re-executes itself under `mpiexec -n K+1` (experiments/parent/,
the parent's side); run by `mpiexec` (or srun) it lands in `run_mpi`, where rank 0
becomes the server, ranks 1..K the clients and the N ranks after them (`--spares N`)
spares, which join when a client is lost. The MPI is the wire's
(paramserver/wire/transport.py), imported only inside `run_mpi`, after the config was
validated, so bad input never starts MPI. An exception on any rank ends the whole job
within seconds (MPI_Abort), after the server wrote a `failed` summary when it could.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
import traceback
from typing import TYPE_CHECKING, Callable, NoReturn

import numpy as np
import torch

from clients.collective import Fate, LockstepFates
from clients.devices import (device_name, gpu_count, keep_freed_memory, node_devices, share_cores, use_device,
                             visible_gpu)
from clients.driver import await_admission, run_client
from clients.loop import ClientPlan, PlanSettings
from experiments.run.assemble import (ClientSettings, Parts, Share, Started, build, client_plan, join_client,
                                      make_replica, start)
from experiments.run.collectiverun import CollectiveSettings, collective_run
from experiments.parent.supervise import LOCKED_RUN, direct_stdio
from experiments.run.provenance import provenance
from experiments.rank.startwatch import bounded_start
from experiments.run.resume import ResumePoint, resume_hint
from experiments.run.record import RunSetup
from experiments.run.serverrun import ServerSettings, door_of, serve_mpi, serve_slice
from paramserver.compute.quantkernel import make_codec
from paramserver.wire import frame
from paramserver.wire.door import Door, DoorLink
from paramserver.drivers.tickets import FIRST_RANK
from paramserver.wire.protocol import Bye, Tag
from runconfig.settings import RunConfig
from paramserver.wire.farewell import say_bye, tell_recorders, wait_for_bye
from paramserver.wire.liveness import PeerDied, PeerWatch
from rundir.summary import log_traceback
from rundir.modes import Mode

START_TIMEOUT_S = 600.0  # how long the ranks wait for each other's verdict on their start
# The least time MPI may take to start: ranks reach MPI_Init as fast as they import torch,
# seconds apart on a busy host, and a short stall_timeout must not cut that short.
MPI_START_S = 30.0
# How long a failing rank lets its launcher forward the line it printed before MPI_Abort:
# hydra may act on the abort before it drains the rank's stderr pipe, and across hosts the
# server's one line was lost so (tests/cluster, once in five runs of the cut-link test).
ABORT_GRACE_S = 0.3

if TYPE_CHECKING:  # the transport imports mpi4py, which starts MPI: only run_mpi loads it
    from paramserver.wire.transport import Transport


def run_mpi(cfg: RunConfig, out: str) -> int:
    """The body of every rank. Returns the exit status; failures abort the job instead.

    async: rank 0 is the server, ranks 1..K the clients, then the spares. sync,
    local-sgd: no server; every rank is a client and rank 0 also records the run.
    """
    with bounded_start(max(cfg.stall_timeout, MPI_START_S)):
        from paramserver.wire.transport import Transport, library_version

    direct_stdio()
    keep_freed_memory()
    transport = Transport.world(timeout=START_TIMEOUT_S)  # ranks reach the start at their own pace: no stall yet
    if refused_anywhere(transport, None):
        return 2
    transport.timeout = cfg.stall_timeout
    servers, spares = (cfg.servers if cfg.mode == Mode.ASYNC else 0), cfg.spares
    clients = cfg.clients or transport.size - servers - spares
    if clients < 1 or transport.size != clients + servers + spares:
        if transport.rank == 0:
            ranks = clients + servers + spares if clients >= 1 else servers + spares + 1
            need = f"{ranks}" if clients >= 1 else f"at least {ranks}"
            what = f"{clients} client(s)" if clients >= 1 else "at least 1 client"
            who = (f"{servers} server(s), the clients and {spares} spare(s)" if spares
                   else f"{servers} server(s) and the clients")
            print(f"asgd: error: clients: {what} in {cfg.mode} mode need {need} MPI ranks ({who}), "
                  f"but the job has {transport.size}; use mpiexec -n {ranks}", file=sys.stderr)
        return 2
    index = transport.rank - servers  # this rank's client number; negative on a server, K or more on a spare
    try:
        local_rank, on_node = transport.this_node(is_client=index >= 0)
        _set_threads(index >= 0, cfg.threads, len(on_node), sum(on_node))
        if index >= 0 and cfg.mode == Mode.ASYNC:
            transport.wait_as_client(sum(on_node))
        device = node_devices(cfg.device, cfg.server_device, on_node, gpu_count())[local_rank]
        use_device(device)
        role = "server" if index < 0 else "client" if index < clients else "spare"
        info = {"rank": transport.rank, "role": role,
                "host": socket.gethostname(), "local_rank": local_rank, "local_ranks": len(on_node),
                "pid": os.getpid(), "device": device_name(device), "gpu": visible_gpu(device)}
        ranks = transport.bcast(transport.gather(info))
        transport.watch = PeerWatch(ranks, info["host"])
        parts = build(cfg, device, clients, [index] if 0 <= index < clients else [])  # `start`'s barrier waits
        prov = provenance(library_version(), ranks) if transport.rank == 0 else {}
        started = start(parts, out, records=transport.rank == 0, provenance=prov,
                        share=_mpi_share(transport, servers, clients))
        start_s, offset = time.perf_counter(), started.point.time if started.point else 0.0
        return _run_role(transport, started, parts, index, servers,
                         clock=lambda: offset + time.perf_counter() - start_s)
    except KeyboardInterrupt:  # SIGTERM or Ctrl-C, passed on to every rank; the recorder noted it
        if transport.rank == 0 and LOCKED_RUN not in os.environ:  # no supervisor to say it
            print(f"asgd: run {out} interrupted{resume_hint(out)}", file=sys.stderr)
        _exit(130)
    except Exception as error:  # noqa: BLE001 - any failure must end the whole job
        _fail(transport, error, index, servers, cfg.on_client_failure == "continue", out, cfg.debug)
    finally:
        if transport.watch is not None:
            transport.watch.close()


def refuse_job(error: str) -> int:
    """This rank cannot start (its own checks failed: a run directory rank 0 may not
    write, data missing on its node): the whole job says so and ends, exit status 2,
    instead of the other ranks waiting for it in their first collective."""
    from paramserver.wire.transport import Transport

    refused_anywhere(Transport.world(timeout=START_TIMEOUT_S), error)
    return 2


def refused_anywhere(transport: Transport, error: str | None) -> bool:
    """Every rank's verdict on its own start (None: ready), gathered before any
    collective that a missing rank would block: whether any refused. Rank 0 says why,
    once for all (a reason every refusing rank gives is one line, others name their rank)."""
    verdicts = transport.bcast(transport.gather(error))
    refusals = {rank: why for rank, why in enumerate(verdicts) if why is not None}
    if refusals and transport.rank == 0:
        common = len(refusals) == transport.size and len(set(refusals.values())) == 1
        lines = [refusals[0]] if common else [f"rank {rank}: {why}" for rank, why in refusals.items()]
        print("\n".join(f"asgd: error: {line}" for line in lines), file=sys.stderr)
    return bool(refusals)


def _run_role(transport: Transport, started: Started, parts: Parts, index: int, servers: int,
              clock: Callable[[], float]) -> int:
    """This rank's part of the run, set up: a collective client, a server, or a client."""
    setup, point = started.setup, started.point
    client = parts.local[0] if parts.local else None
    cfg = setup.cfg
    if cfg.mode != Mode.ASYNC:
        collective = CollectiveSettings.from_config(cfg, setup.clients, [index])
        lockstep = _MpiLockstep(transport, LockstepFates.for_run(collective.fates, [index], [0.0], real_time=True))
        return collective_run(setup, collective, [client], [index], _mpi_average(transport), clock,
                              gather=lambda rows: _flatten(transport.gather(rows)),
                              straggle=lockstep, point=point, agree=transport.bcast, away=lockstep.away)
    if index >= setup.clients:
        return _spare(transport, setup, parts.client, PlanSettings.from_config(cfg, setup.clients), servers, clock)
    if client is None:
        return _serve(transport, setup, ServerSettings.from_config(cfg, setup.clients), clock)
    number = started.numbers[0]  # after a resume, the slot's last holder
    plan = client_plan(PlanSettings.from_config(cfg, setup.clients), number, servers, point, cfg.run_budget)
    run_client(transport, client, plan, clock,
               start=(started.steps[0], point.client_pushes[number] if point else 0))
    if wait_for_bye(transport):
        _exit(0)  # as server 0 did: see paramserver/wire/farewell.py
    return 0


def _serve(transport: Transport, setup: RunSetup, server: ServerSettings, clock: Callable[[], float]) -> int:
    """A server rank: server 0 serves its slice and records the run, the others serve
    theirs. With `--joinable` each opens a door (a joiner joins every server: server 0
    first, which lets it in, then the others by its word: paramserver/drivers/tickets.py),
    and the others tell server 0 where theirs listen, for the run's door file."""
    # a joiner's largest message: its optimizer's state (STATE, pickled), a few times the weights
    door = Door(transport.size if transport.rank == 0 else FIRST_RANK,
                max_body=8 * setup.weights.nbytes + (16 << 20)) if server.joinable else None
    link = transport if door is None else DoorLink(transport, door)
    if transport.rank > 0:
        if door is not None:
            transport.send(0, Tag.DOOR, door_of(door), timeout=server.stall_timeout)
        try:
            lost = serve_slice(setup, server, link, clock, transport.rank)
        finally:
            if door is not None:
                door.close()
        if lost:
            _exit(0)  # clients were lost: see paramserver/wire/farewell.py
        return 0
    doors = [transport.recv(server.stall_timeout, source=s, tag=Tag.DOOR).header for s in range(1, server.servers)] \
        if door is not None else []
    lost = {entry["rank"] for entry in serve_mpi(setup, server, link, clock, door, doors)["lost_clients"]}
    joiners = door.joiners() if door is not None else []
    gone = say_bye(link, [*range(1, transport.size), *joiners], lost | transport.watch.reported)  # the dead spares too
    if door is not None:
        door.close()
    if gone:
        _exit(0)  # with clients lost, leave at once: MPI_Finalize would wait for them forever
    return 0


def _spare(transport: Transport, setup: RunSetup, client_settings: ClientSettings, plans: PlanSettings,
           servers: int, clock: Callable[[], float]) -> int:
    """A spare rank: its model and data loaded before it waits (so a join costs the
    messages, not the setup), it waits for server 0; admitted, it is an ordinary client
    from its Welcome on, with the number, shard and steps the Welcome deals."""
    replica = make_replica(client_settings, setup.model, setup.device)
    codec = make_codec(plans.compress if plans.compress_pulls else "none")
    # with sharded servers the Welcome brings no weights: the spare pulls from every server
    landing = frame.empty(codec.wire_size(setup.weights.size), codec.wire_dtype) if servers == 1 else None
    answer = await_admission(transport, socket.gethostname(), landing, plans.timeout)
    if isinstance(answer, Bye):
        lost = bool(answer.lost)
    else:
        client = join_client(client_settings, replica, setup.dataset, setup.clients, answer)
        plan = dataclasses.replace(ClientPlan.for_run(plans, answer.client, servers), steps=answer.steps)
        run_client(transport, client, plan, clock, first=None if landing is None else (landing, answer.weights))
        lost = wait_for_bye(transport)
    if lost:
        _exit(0)  # as server 0 did: see paramserver/wire/farewell.py
    return 0


def _mpi_share(transport: Transport, servers: int, clients: int) -> Share:
    """Rank 0's start weights and resume point, on every rank (with the optimizer state
    of its own client alone, the one its slot goes on with: K clients' states are no
    rank's business but the client's); time starts together on every rank, after all
    setup (the barrier)."""
    def share(weights: np.ndarray, point: ResumePoint | None) -> tuple[np.ndarray, ResumePoint | None]:
        transport.barrier()
        points = [point and point.only([point.holder(rank - servers)] if 0 <= rank - servers < clients else [])
                  for rank in range(transport.size)] if transport.rank == 0 else None
        return transport.bcast_array(weights), transport.scatter(points)
    return share


def _mpi_average(transport: Transport):
    """Average tensors over all ranks (each rank holds one client)."""
    def average(tensors: list[torch.Tensor]) -> None:
        for tensor in tensors:
            host = tensor.numpy() if tensor.device.type == "cpu" else tensor.cpu().numpy()
            transport.allreduce_mean(host)
            if tensor.device.type != "cpu":
                tensor.copy_(torch.from_numpy(host))
    return average


class _MpiLockstep:
    """This rank's step as slow as its fates say (clients/collective.py's `LockstepFates`),
    for real: the MPI side only. With backup workers every rank learns every step's
    durations (one allreduce of K floats before anyone sleeps), so all agree which b are
    dropped; a dropped rank skips its sleep and waits in the average for the slowest kept
    one. A rank that is down (`away`) computes nothing and adds nothing to the average
    until its outage ends on its clock, unless a step must wait for it."""

    def __init__(self, transport: Transport, fates: LockstepFates):
        self.transport, self.fates = transport, fates

    def away(self) -> list[bool]:
        return self.fates.away(time.perf_counter())

    def __call__(self, step: int, compute_s: list[float | None]) -> list[Fate]:
        fates, index, compute = self.fates, self.fates.indices[0], compute_s[0]
        if compute is not None:  # an away rank's base stays its last minibatch's compute
            fates.bases[0] = compute
        start = time.perf_counter() - (compute or 0.0)
        mine = fates.durations(step, start)[0]
        keep = True
        if fates.backups:
            durations = np.zeros(fates.stragglers.clients, np.float32)
            durations[index] = mine
            self.transport.allreduce_mean(durations)  # every slot but one is 0: the mean is each rank's / K
            keep = fates.kept(list(durations))[index]
        if keep:  # back (if it was down), then each failed try and its outage; collective_step computes again
            wait = mine - (fates.tries[0] + 1) * fates.bases[0]
            if wait > 0:
                time.sleep(wait)
        return fates.settle(step, start, [keep], [compute is None])


def _flatten(gathered: list[list[dict]] | None) -> list[dict] | None:
    return None if gathered is None else [row for rows in gathered for row in rows]




def _fail(transport: Transport, error: Exception, index: int, servers: int, keep_going: bool, out: str,
          debug: bool) -> NoReturn:
    """End the job, after the server had a moment to record why. Under `keep_going` a
    client leaves alone once its FAIL is out (exit status 1, without MPI_Finalize, which
    would wait for the others forever); the launcher's SIGUSR1 about it is caught by the
    others' PeerWatch."""
    role = "server" if index < 0 else f"client {index}"
    reason = f"{type(error).__name__}: {error}"
    where = log_traceback(out, error, f"rank {transport.rank} ({role})")
    if debug:
        traceback.print_exception(error)
    print(f"asgd: rank {transport.rank} ({role}) failed: {reason} ({where})", file=sys.stderr, flush=True)
    server_gone = isinstance(error, PeerDied) and any(rank < servers for rank in error.ranks)
    if index >= 0 and not server_gone:
        tell_recorders(transport, transport.rank, servers, reason, wait=not keep_going)
        if keep_going:
            _exit(1)
    time.sleep(ABORT_GRACE_S)
    transport.abort(1)
    raise SystemExit(1)  # not reached: Abort ends the process


def _exit(status: int) -> NoReturn:
    """Leave without MPI_Finalize, which waits for every rank, dead ones included (MPICH's
    launcher then ends the ranks still waiting in theirs: the run is recorded by now)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _set_threads(is_client: bool, threads: int, local_ranks: int, local_clients: int) -> None:
    """Share this node's cores among its client ranks (the server needs little CPU)."""
    share_cores(threads if is_client else 0, local_clients if is_client else local_ranks)
