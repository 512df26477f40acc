"""`asgd join RUN_DIR`: a process outside the run's MPI job becomes a new client of it.

Launched by hand, by `mpiexec -n J` or `srun` (each process joins alone: MPI is not
started here), or from a second `sbatch`. It reads what the run recorded (config.json:
the model, the data, the optimizer; door.json: where server 0 listens and the secret,
readable by the run's owner alone), loads its model and data and runs one minibatch
before it knocks (`_warm_up`), so that a join costs the server one message and a
weights transfer, and the joiner's first push one ordinary minibatch, and then talks to
server 0 over a TCP stream (paramserver/wire/stream.py; why not MPI: docs/joining.md).
The server answers its JOIN as any joiner's (paramserver/membership.py): a new client
number, a shard, its share of the budget, the weights; from then on it is an ordinary
client, and waits for the server's BYE at the end of the run. With sharded servers it
then joins each other server's door with the Welcome's ticket (`_enter`) and pulls the
weights from all of them.

Anything wrong before the server let it in (not a run, not joinable, finished, not the
owner, data on this host other than the run's, the server unreachable, the JOIN
refused) is one line and exit status 2, and the run is unchanged; a failure once it trains is exit status 1, after a FAIL to the server,
which goes on without it under `--on-client-failure continue`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time

import torch

from clients.client import Client
from clients.devices import gpu_count, node_devices, share_cores, use_device
from clients.driver import join_server, run_client
from clients.loop import ClientPlan, PlanSettings
from clients.models import flat_weights
from experiments.run.assemble import build, join_client, make_client, make_replica
from experiments.run.inputs import check_fingerprint
from experiments.run.resume import recorded_config
from paramserver.wire import frame
from paramserver.wire.compress import make_codec
from paramserver.wire.farewell import tell_recorders, wait_for_bye
from paramserver.wire.liveness import PeerDied
from paramserver.wire.protocol import Fail, Join, PeerTimeout, ProtocolError, Seated, Tag, Welcome
from paramserver.wire.stream import SocketLink
from runconfig.load import load_config
from runconfig.settings import RunConfig
from rundir.layout import RunDir
from rundir.lock import RunDirError
from rundir.modes import Mode

CONNECT_S = 5.0  # the longest one address of the door is tried
# where a launcher says which of a node's processes this is: a joiner's GPU, as a rank's
LOCAL_RANK = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK")
# and how many processes it started on this node (joiners launched together)
LOCAL_SIZE = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "LOCAL_WORLD_SIZE")


def join(run_dir: str) -> int:
    """Join the run in `run_dir`; the exit status (bad input raises `RunDirError`)."""
    run = RunDir(run_dir)
    cfg, door = _read(run)
    parts = build(cfg, _device(cfg, _sharing(run)), cfg.clients, [])
    check_fingerprint(run.record("config").get("data_fingerprint"), parts.dataset)  # this host's data, the run's?
    cfg, clients = parts.cfg, parts.clients
    replica = make_replica(parts.client, parts.model, parts.device)
    _warm_up(make_client(parts.client, replica, parts.dataset, clients, 0))
    codec = make_codec(cfg.compress if cfg.compress_pulls else "none")
    size = flat_weights(parts.model).size
    others = door.get("servers") or []  # sharded servers: the Welcome brings no weights (`_enter`)
    landing = None if others else frame.empty(codec.wire_size(size), codec.wire_dtype)
    link = SocketLink(_connect(run, door))
    try:
        answer = join_server(link, door["secret"], socket.gethostname(), landing, cfg.stall_timeout)
    except (PeerDied, PeerTimeout, ProtocolError) as error:
        raise RunDirError(f"join: {run.path}: the server did not let us in: {error}") from None
    if not isinstance(answer, Welcome):
        why = answer.reason if isinstance(answer, Fail) else "the run ended"
        raise RunDirError(f"join: {run.path}: {why}")
    start = time.perf_counter()
    print(f"asgd: joined {run.path} as client {answer.client} at version {answer.weights.version}",
          file=sys.stderr, flush=True)
    try:
        for other in others:
            _enter(link, run, other, answer, cfg.stall_timeout)
        client = join_client(parts.client, replica, parts.dataset, clients, answer)
        plan = dataclasses.replace(ClientPlan.for_run(PlanSettings.from_config(cfg, clients), answer.client,
                                                      1 + len(others)), steps=answer.steps)
        run_client(link, client, plan, lambda: answer.clock + time.perf_counter() - start,
                   first=None if landing is None else (landing, answer.weights))
        wait_for_bye(link)
    except Exception as error:  # noqa: BLE001 - the servers must hear why, then this process ends
        reason = f"{type(error).__name__}: {error}"
        print(f"asgd: client {answer.client} (joined) failed: {reason}", file=sys.stderr, flush=True)
        if not isinstance(error, PeerDied):
            tell_recorders(link, -1, len(link.socks), reason, wait=False)
        return 1
    finally:
        link.close()
    return 0


def _enter(link: SocketLink, run: RunDir, door: dict, answer: Welcome, timeout: float) -> None:
    """Join server i > 0 of sharded servers, once server 0 let us in: show it the ticket
    of the Welcome, and be told the client number server 0 gave (its word, which that
    server waited for: paramserver/drivers/tickets.py)."""
    server = link.add(_connect(run, door))
    link.send(server, Tag.JOIN, Join(answer.ticket, socket.gethostname()), timeout=timeout)
    msg = link.recv(timeout, server)
    if not isinstance(msg.header, Seated) or msg.header.client != answer.client:
        why = msg.header.reason if isinstance(msg.header, Fail) else f"answered {type(msg.header).__name__}"
        raise ProtocolError(f"server {server} did not let client {answer.client} in: {why}")


def _warm_up(client: Client) -> None:
    """One forward and backward pass before the join, its gradient and the model's
    buffers (BatchNorm's statistics) then put back as they were: a fresh process's first
    minibatch is slow (measured on the tiny model: 46 ms, against 2.4 ms for the next),
    and after the join it would delay the first push by that much. No optimizer step:
    the weights come with the Welcome."""
    buffers = {name: buffer.clone() for name, buffer in client.replica.model.named_buffers()}
    client.compute()
    client.grad.zero_()
    with torch.no_grad():
        for name, buffer in client.replica.model.named_buffers():
            buffer.copy_(buffers[name])


def _read(run: RunDir) -> tuple[RunConfig, dict]:
    """The run's config and its door, or why this process may not join it (one line)."""
    if not (run.path / "config.json").is_file():
        raise RunDirError(f"join: {run.path} is not a run directory (no config.json)")
    stored = recorded_config(run.path)
    if not stored.get("joinable"):
        raise RunDirError(f"join: {run.path} is not joinable (start it with --joinable)")
    if stored.get("backend") != "mpi" or stored.get("mode") != Mode.ASYNC:
        raise RunDirError(f"join: {run.path} is not an async run over MPI (the simulator's --joins studies joins)")
    status = run.status()
    if status is not None:
        raise RunDirError(f"join: {run.path} has finished ({status})")
    try:
        door = json.loads(run.door_path.read_text())
    except FileNotFoundError:
        raise RunDirError(f"join: {run.path}: its server is not serving (no {run.door_path.name}: "
                          "not started yet, or ended)") from None
    except PermissionError:
        raise RunDirError(f"join: cannot read {run.door_path}: only the run's owner may join it") from None
    except (OSError, ValueError) as error:
        raise RunDirError(f"join: cannot read {run.door_path} ({error})") from None
    if not isinstance(door, dict) or not {"port", "addresses", "secret"} <= set(door):
        raise RunDirError(f"join: {run.door_path} is not a door file of ours")
    return load_config(None, {**stored, "out": str(run.path)}), door


def _connect(run: RunDir, door: dict) -> socket.socket:
    """A stream to a server's door (`door`: its port and addresses), from the first of
    its addresses that answers."""
    tried = []
    for address in door["addresses"]:
        try:
            return socket.create_connection((address, door["port"]), timeout=CONNECT_S)
        except OSError as error:
            tried.append(f"{address}: {error.strerror or error}")
    raise RunDirError(f"join: cannot reach a server of {run.path} on port {door['port']} "
                      f"({'; '.join(tried)}): has the run ended?")


def _sharing(run: RunDir, host: str | None = None) -> int:
    """The processes a joiner computes beside on its node: the run's client ranks there
    (config.json's record of its ranks) and the joiners launched with it (the launcher's
    local size; 1 alone). A joiner that took every core beside a job's client rank took
    35 to 400 times as long a minibatch as they did (measured on the 2-core machine)."""
    host = host or socket.gethostname()
    ranks = run.record("config").get("provenance", {}).get("ranks", [])
    here = sum(r.get("role") in ("client", "spare") and r.get("host") == host for r in ranks)
    launched = next((int(os.environ[name]) for name in LOCAL_SIZE if os.environ.get(name, "").isdigit()), 1)
    return here + launched


def _device(cfg: RunConfig, sharing: int) -> str:
    """The joiner's device: as a client rank's, this process counted among its node's by
    the launcher's local rank (0 when launched alone); its threads `threads`, or (0) the
    node's cores shared among `sharing` processes, as a client rank's are."""
    local = next((int(os.environ[name]) for name in LOCAL_RANK if os.environ.get(name, "").isdigit()), 0)
    device = node_devices(cfg.device, cfg.server_device, [True] * (local + 1), gpu_count())[local]
    use_device(device)
    share_cores(cfg.threads, sharing)
    return device
