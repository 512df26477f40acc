"""The only module that talks MPI: a push or weights as one framed message, the rest pickled.

Waiting never spins a core for long. A blocking MPI receive busy-polls (MPICH and Open
MPI both do), which on a small machine steals the CPU the clients train on; here every
wait for a message is `Iprobe` plus a sleep that backs off from 50 us to 1 ms, so an
idle rank costs about 1% of a core and a message waits at most ~1 ms longer to be
noticed. A transfer already under way is polled busily for about as long as its bytes
should take, then with the same backoff (a client whose host has more clients than
cores sleeps from the start: `Transport.wait_as_client`). Every wait has a timeout,
sends and collectives included, so a silent peer becomes an error that names it instead
of a hang, and every wait asks the `PeerWatch` (when there is one) whether a peer it
waits for has died.
"""
from __future__ import annotations

import faulthandler
import math
import os
import pickle
import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from paramserver.wire import frame
from paramserver.wire.blocks import Blocks, Posted
from paramserver.wire.frame import FRAMED, HEADER_BYTES, rows_bytes
from paramserver.wire.liveness import PeerDied, PeerWatch, finish_within
from paramserver.wire.protocol import (Message, PeerFailed, PeerTimeout, ProtocolError, Push, Tag, Weights,
                                         payload_target)

ANY = MPI.ANY_SOURCE
_FIRST_SLEEP, _MAX_SLEEP = 50e-6, 1e-3
_BUSY = 1e-3  # a message the peer sends right after its last one comes within this
ABORT_GRACE_S = 10.0
_PROC_FAILED = (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING)  # ULFM: a rank of the communicator died


class Transport:
    """Point-to-point messages over one communicator (the MPI `Link`)."""

    def __init__(self, comm: MPI.Comm, watch: PeerWatch | None = None, timeout: float = 600.0):
        self.receive_s = self.receive_cpu_s = 0.0  # the last recv's time (wall, CPU) from the message found to it taken
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.watch = watch
        self.timeout = timeout  # for collectives, whose callers have no better bound
        self.blocks = Blocks(self.done)  # the staging blocks, and the sends from blocks still under way
        self.yields = True  # a transfer is polled, yielding the core, while its bytes should move (`wait_as_client`)
        self._abandoned: list[list] = []  # a lost peer's transfers: MPI may resume them, into buffers kept here

    @classmethod
    def world(cls, timeout: float) -> Transport:
        """Every rank of the job; its MPI_Finalize at exit within its timeout (`finish_within`)."""
        transport = cls(MPI.COMM_WORLD, timeout=timeout)
        finish_within(lambda: transport.timeout, lambda: MPI.Is_finalized() or MPI.Finalize())
        return transport

    def this_node(self, is_client: bool) -> tuple[int, list[bool]]:
        """This rank's number among the ranks on its node, and whether each of them is a
        client (`is_client` on each), in that order: to share the node's cores and GPUs."""
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            return local.Get_rank(), [bool(flag) for flag in local.allgather(is_client)]
        finally:
            local.Free()

    def wait_as_client(self, local_clients: int) -> None:
        """This rank is a client of parameter servers, one of `local_clients` on its host:
        where they outnumber the host's cores, its waits for its transfers sleep from the
        start, without the yielding polls. There each polling client takes a share of
        the CPU the server needs for the replies they all wait on. Not where the clients
        fit the cores (a client's polls move its transfers sooner), nor in sync mode,
        whose allreduce lost by it: docs/performance.md ("Waiting") has the measurements."""
        self.yields = local_clients <= (os.cpu_count() or 1)

    def send(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None,
             timeout: float = 600.0) -> None:
        """One message (a push or weights: header and payload in one, paramserver/wire/frame.py;
        anything else pickled); returns when it is out. Even a small MPI send blocks while
        the receiver does not take it (a stopped process fills MPICH's shared-memory
        queue), so a send waits like a receive: polled, and no longer than `timeout`."""
        self.send_many([(dest, tag, header, payload)], timeout)

    def send_many(self, messages: list[tuple[int, Tag, Any, np.ndarray | None]], timeout: float = 600.0) -> None:
        """Several (dest, tag, header, payload) at once: every transfer is under way
        before we wait for any (a client pushing to sharded servers)."""
        posted = [self.post(dest, tag, header, payload) for dest, tag, header, payload in messages]
        nbytes = sum(m[3].nbytes for m in messages if m[3] is not None)
        self._complete([request for p in posted for request in p], timeout, sorted({m[0] for m in messages}), nbytes)

    def post(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None) -> Posted:
        """Start sending one message; finish with `complete` (the payload must not change
        until then). A push or weights goes framed: in place when the payload has room
        around it (`frame.empty`), else copied into a frame first."""
        if tag not in FRAMED:
            if payload is not None:
                raise ValueError(f"a {Tag(tag).name} message carries no payload")
            return Posted([self.comm.isend(header, dest=dest, tag=int(tag))])
        rows = rows_bytes(header) if isinstance(header, Push) else b""
        data = _as_bytes(payload if payload is not None else np.empty(0, np.uint8))
        block = frame.around(data, len(rows))
        # Not in place: a block whose header is being sent (replies to several clients: not
        # rewritten under MPI), or a streamed fragment's answer, which its client takes only
        # at its next fragment boundary: the server changes the weights before then.
        if block is not None and (self.blocks.reading(block) or isinstance(header, Weights) and header.fragment >= 0):
            block = None
        live = block is not None
        if block is None:
            block = self.blocks.staged(("to", dest), HEADER_BYTES + data.nbytes + len(rows))
            block[HEADER_BYTES:HEADER_BYTES + data.nbytes] = data
        block[HEADER_BYTES + data.nbytes:] = np.frombuffer(rows, np.uint8)
        frame.write_header(block[:HEADER_BYTES], tag, header, self.rank, rows)
        posted = Posted([self._dead_on_error(lambda: self.comm.Isend([block, MPI.BYTE], dest, int(tag)), [dest])],
                        keep=[block], live=live)
        self.blocks.sending(block, posted)
        return posted

    def recv(self, timeout: float, source: int = ANY, tag: int = MPI.ANY_TAG, busy: float = _BUSY,
             into: np.ndarray | None = None) -> Message:
        """The next message from `source` (any rank by default); a framed one's payload
        landed in `into` when the byte counts match (see `payload_target`). `busy`:
        seconds it is expected soon (see `_poll`)."""
        status = self._wait(source, tag, timeout, busy)
        start, start_cpu = time.perf_counter(), time.thread_time()
        sender, got = status.Get_source(), status.Get_tag()
        if got in FRAMED:
            header, payload = self._recv_frame(sender, got, status.Get_count(MPI.BYTE), into)
            message = Message(sender, got, header, payload)
        else:
            message = Message(sender, got, MPI.pickle.loads(self._take(sender, got, status.Get_count(MPI.BYTE))))
        # the server's PushCost reads them: taking it, not waiting for it
        self.receive_s, self.receive_cpu_s = time.perf_counter() - start, time.thread_time() - start_cpu
        return message

    def _take(self, sender: int, tag: int, count: int, block: np.ndarray | None = None) -> np.ndarray:
        """The `count` bytes the probe found, in `block` (or new bytes), within the timeout."""
        block = np.empty(count, np.uint8) if block is None else block
        request = self._dead_on_error(lambda: self.comm.Irecv([block, MPI.BYTE], sender, int(tag)), [sender])
        self._complete(Posted([request], keep=[block]), self.timeout, [sender], count)
        return block

    def _recv_frame(self, sender: int, tag: int, count: int, into: np.ndarray | None) -> tuple[Any, np.ndarray]:
        """A framed message of `count` bytes. When it is as long as `into` says and `into`
        has room around it, it lands in place; otherwise in a reused block, its payload
        copied out after: into `into` when the sizes match, else into fresh bytes (which
        the server rejects)."""
        data = _as_bytes(into if into is not None else np.empty(0, np.uint8))
        tail = count - HEADER_BYTES - data.nbytes
        block = frame.around(data, tail) if into is not None and tail >= 0 else None
        in_place = block is not None
        if not in_place:
            block = self.blocks.staged(("from", sender), count)
        self._take(sender, tag, count, block)
        nrows = min(frame.rows_length(block), max(count - HEADER_BYTES, 0))
        if not (in_place and nrows == tail):
            raw = block[HEADER_BYTES:count - nrows]
            into = payload_target(raw.nbytes, into)
            into.view(np.uint8)[:] = raw
        return frame.decode(tag, block[:HEADER_BYTES], block[count - nrows:count], sender), into

    def expect_weights(self, sources: list[int], intos: list[np.ndarray]) -> Posted:
        """Receives for the servers' replies, posted before the message that asks for them:
        a server's send then completes whatever we are busy with (a client pushing to
        sharded servers must not hold up a server that already answers it). `complete`
        them; it checks each reply's header (raising `ProtocolError` on a bad one) and
        copies a reply that could not land in place."""
        blocks, staged, requests = [], [], []
        for source, into in zip(sources, intos):
            data = _as_bytes(into)
            block = frame.around(data, 0)
            staged.append(block is None)
            if block is None:
                block = self.blocks.staged(("from", source), HEADER_BYTES + data.nbytes)
            blocks.append(block)
            requests.append(self._dead_on_error(
                lambda: self.comm.Irecv([block, MPI.BYTE], source, int(Tag.WEIGHTS)), [source]))

        def finish() -> list[Weights]:
            headers = []
            for source, block, into, copy in zip(sources, blocks, intos, staged):
                header = frame.decode(Tag.WEIGHTS, block[:HEADER_BYTES], b"", source)
                if not isinstance(header, Weights) or header.size != into.size:
                    raise ProtocolError(f"rank {self.rank}: a bad weights reply from rank {source}: {header}")
                if copy:
                    _as_bytes(into)[:] = block[HEADER_BYTES:]
                headers.append(header)
            return headers
        return Posted(requests, keep=blocks, verify=finish)

    def done(self, requests: Posted) -> bool:
        """Whether what `post` started is out (no wait). A send to a rank that died is out
        too: MPI reads its buffer no more (ULFM completes it in error: MPI_ERR_IN_STATUS,
        the status's error MPI_ERR_PROC_FAILED; measured under Open MPI 5, where a staging
        block's check raised it and ended a server under churn), and the death is named
        where that rank is waited for."""
        statuses = [MPI.Status() for _ in requests]
        try:
            return MPI.Request.Testall(requests, statuses)
        except MPI.Exception as error:
            if error.Get_error_class() != MPI.ERR_IN_STATUS:
                raise
            kinds = {MPI.Get_error_class(s.Get_error()) for s in statuses} - {MPI.SUCCESS}
            if not kinds <= {*_PROC_FAILED, MPI.ERR_PENDING}:
                raise
            return MPI.ERR_PENDING not in kinds

    def complete(self, requests: Posted, peers: list[int], nbytes: int, timeout: float) -> list[Weights]:
        """Wait for what `expect_weights` or `post` started; the replies' headers (none for a post)."""
        self._complete(requests, timeout, peers, nbytes)
        return requests.verify() if requests.verify is not None else []

    def _complete(self, requests: list[MPI.Request], timeout: float, peers: list[int] | None,
                  nbytes: int) -> None:
        """Wait for transfers with `peers` (None: every rank, for a collective), busily for
        as long as the bytes should take at 1 GB/s plus 10 ms (MPI moves a large message
        only while we call into it), unless this rank does not yield (`wait_as_client`)."""
        if self._test(requests, peers):  # often done already: skip the polling's set-up
            return
        what = "no transfer with " + ("every rank" if peers is None else "rank " + ", ".join(map(str, peers)))
        try:
            self._poll(lambda: self._test(requests, peers), timeout, lambda: self._check(peers, peers is None),
                       0.01 + nbytes / 1e9 if self.yields else 0.0, lambda: what, peers)
        except (PeerTimeout, PeerDied):
            self._abandoned.append(requests)  # and a `Posted`'s buffers: mpi4py would free a dropped request's
            raise

    def _wait(self, source: int, tag: int, timeout: float, busy: float = _BUSY) -> MPI.Status:
        status = MPI.Status()
        peers = None if source == ANY else [source]

        def probe() -> bool:
            return self._dead_on_error(lambda: self.comm.Iprobe(source=source, tag=tag, status=status), peers)
        if probe():  # a busy server's next message is often there already
            return status
        self._poll(probe, timeout, lambda: self._check(peers), busy,
                   lambda: "no message from " + ("any rank" if source == ANY else f"rank {source}"), peers)
        return status

    def _poll(self, done: Callable[[], bool], timeout: float, check: Callable[[], None], busy: float,
              what: Callable[[], str], peers: list[int] | None) -> None:
        """Until `done()`: for `busy` seconds poll, yielding the core to any process that
        wants it (a reply due soon is seen at once, yet a rank that waits on a crowded
        machine does not take CPU from the ranks that compute); then sleep between polls,
        backing off from 50 us to 1 ms, and `check()` whether the peers are still there."""
        now = time.monotonic()
        busy_until, deadline = now + busy, now + timeout
        sleep = _FIRST_SLEEP
        while not done():
            now = time.monotonic()
            if now > deadline:
                raise PeerTimeout(f"rank {self.rank}: {what()} for {timeout:g} s", tuple(peers or ()))
            if now < busy_until:
                os.sched_yield()
                continue
            check()
            time.sleep(sleep)
            sleep = min(sleep * 2, _MAX_SLEEP)

    def _test(self, requests: list[MPI.Request], peers: list[int] | None) -> bool:
        return self._dead_on_error(lambda: MPI.Request.Testall(requests), peers)

    def _dead_on_error(self, call: Callable[[], Any], peers: list[int] | None) -> Any:
        """`call()`; an MPI error while talking to given peers means one of them is gone
        (MPICH reports a dead process so, when it notices before the launcher ends the job).
        Under ULFM (Open MPI's `mpiexec --with-ft ulfm`) MPI names the dead itself: they are
        acknowledged and named, so the caller's next any-source probe works again."""
        try:
            return call()
        except MPI.Exception as error:
            kind = error.Get_error_class()
            if kind == MPI.ERR_TRUNCATE:
                raise
            failed = self._acknowledge() if kind in _PROC_FAILED else []
            if peers is None and failed:
                raise PeerDied(failed, " and ".join(self._name(p) for p in failed)
                               + " died (MPI: process failed)") from None
            if peers is None:  # from any rank: the watch may know which one died
                if self.watch is not None:
                    self.watch.alarm = True
                    self.watch.check(None)
                raise
            names = " or ".join(map(self._name, peers))
            raise PeerDied(peers, f"{names} died (MPI error {kind})") from None

    def _acknowledge(self) -> list[int]:
        """The ranks MPI reports failed, acknowledged (ULFM): until they are, every
        any-source receive raises MPI_ERR_PROC_FAILED again. An MPI without ULFM's calls
        (MPICH without its fault tolerance enabled) names none."""
        try:
            group = self.comm.Get_failed()
            failed = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), self.comm.Get_group())
            self.comm.Ack_failed(len(failed))  # exactly these: a later failure still raises
            group.Free()
        except (MPI.Exception, NotImplementedError):
            return []
        return list(failed)

    def _name(self, rank: int) -> str:
        return self.watch.names[rank] if self.watch else f"rank {rank}"

    def _check_failed(self) -> None:
        """A rank that failed will not join the collective: say so now, not at the timeout."""
        status = MPI.Status()
        if self._dead_on_error(lambda: self.comm.Iprobe(source=ANY, tag=int(Tag.FAIL), status=status), None):
            header = self.comm.recv(source=status.Get_source(), tag=int(Tag.FAIL))
            raise PeerFailed(f"rank {status.Get_source()} failed: {getattr(header, 'reason', header)}")

    def _check(self, peers: list[int] | None, collective: bool = False) -> None:
        """Raise when a peer we wait for died, or (in a collective) reported a failure."""
        if self.watch is not None:
            self.watch.check(peers)
        if collective:
            self._check_failed()

    def allreduce_mean(self, array: np.ndarray) -> None:
        """Replace `array` (contiguous float32) by its mean over all ranks, in place."""
        self._complete([self.comm.Iallreduce(MPI.IN_PLACE, [array, MPI.FLOAT], op=MPI.SUM)],
                       self.timeout, None, 2 * array.nbytes)
        array /= self.size

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Small objects from every rank, as a list on `root` (None elsewhere)."""
        if self.rank != root:
            self.send(root, Tag.GATHER, obj, timeout=self.timeout)
            return None
        return [obj if rank == root else self._gathered(rank) for rank in range(self.size)]

    def scatter(self, objs: list[Any] | None, root: int = 0) -> Any:
        """Each rank its own item of `root`'s list (one a rank), sent to that rank alone."""
        if self.rank != root:
            return self._gathered(root)
        self.send_many([(rank, Tag.GATHER, obj, None) for rank, obj in enumerate(objs) if rank != root], self.timeout)
        return objs[root]

    def _gathered(self, rank: int) -> Any:
        msg = self.recv(self.timeout, source=rank)
        if msg.tag == Tag.FAIL:  # it failed instead of sending its part
            raise PeerFailed(f"rank {rank} failed: {getattr(msg.header, 'reason', msg.header)}")
        return msg.header

    def barrier(self) -> None:
        """Wait for every rank, without spinning and without a timeout (ranks may wait long,
        e.g. for a warm start), but not for a dead or failed rank."""
        self._complete([self.comm.Ibarrier()], math.inf, None, 0)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """A small object from `root`, on every rank."""
        data = pickle.dumps(obj) if self.rank == root else b""
        size = self.bcast_array(np.array([len(data)], np.int64), root)
        blob = self.bcast_array(np.frombuffer(data, np.uint8).copy() if self.rank == root
                                else np.empty(int(size[0]), np.uint8), root)
        return obj if self.rank == root else pickle.loads(blob.tobytes())

    def bcast_array(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        """`root`'s array, on every rank (the others pass an array of the same size)."""
        self._complete([self.comm.Ibcast([_as_bytes(array), MPI.BYTE], root=root)],
                       self.timeout, None, array.nbytes)
        return array

    def abort(self, code: int) -> None:
        """End every rank of the job: one rank's failure must not leave others waiting.

        The launcher ends the others. Should it never answer (seen once in CI: Open MPI
        5.0.11 under ULFM, the server SIGKILLed, a client inside MPI_Abort for 180 s), this
        rank leaves alone after `ABORT_GRACE_S`, its stack on stderr, exit status 1 (a C
        watchdog thread, as in `finish_within`), and the others, which see it gone, follow."""
        faulthandler.dump_traceback_later(ABORT_GRACE_S, exit=True)
        self.comm.Abort(code)


def _as_bytes(array: np.ndarray) -> np.ndarray:
    if array.ndim == 1 and array.flags.c_contiguous:  # the hot path's vectors: a view, no more
        return array.view(np.uint8)
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def library_version() -> str:
    """The MPI library's first line of its version (for the run's provenance)."""
    return MPI.Get_library_version().splitlines()[0].strip()
