"""The only module that talks MPI: headers as small objects, payloads as raw buffers.

Waiting never spins a core for long. A blocking MPI receive busy-polls (MPICH and Open
MPI both do), which on a small machine steals the CPU the clients train on; here every
wait for a message is `Iprobe` plus a sleep that backs off from 50 us to 1 ms, so an
idle rank costs about 1% of a core and a message waits at most ~1 ms longer to be
noticed. A transfer already under way is polled busily for about as long as its bytes
should take, then with the same backoff. Every wait has a timeout, sends included, so
a silent peer becomes an error that names it instead of a hang.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from paramserver.protocol import Tag

ANY = MPI.ANY_SOURCE
_FIRST_SLEEP, _MAX_SLEEP = 50e-6, 1e-3


class PeerTimeout(TimeoutError):
    """No message came from the awaited rank(s) within the timeout."""


@dataclass(frozen=True)
class Message:
    source: int
    tag: int
    header: Any


class Transport:
    """Point-to-point messages over one communicator."""

    def __init__(self, comm: MPI.Comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def send(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None,
             timeout: float = 600.0) -> None:
        """A header, then its payload buffer (never pickled) if there is one; returns when
        both are out. Even a small MPI send blocks while the receiver does not take it (a
        stopped process fills MPICH's shared-memory queue), so a send waits like a receive:
        polled, and no longer than `timeout`."""
        requests = [self.comm.isend(header, dest=dest, tag=int(tag))]
        if payload is not None:
            requests.append(self.comm.Isend([_as_bytes(payload), MPI.BYTE], dest=dest, tag=int(Tag.PAYLOAD)))
        self._complete(requests, timeout, dest, 0 if payload is None else payload.nbytes)

    def recv(self, timeout: float, source: int = ANY, tag: int = MPI.ANY_TAG) -> Message:
        """The next header from `source` (any rank by default), waiting without spinning."""
        status = self._wait(source, tag, timeout)
        header = self.comm.recv(source=status.Get_source(), tag=status.Get_tag())
        return Message(status.Get_source(), status.Get_tag(), header)

    def recv_payload(self, source: int, into: np.ndarray, timeout: float) -> np.ndarray:
        """The payload that follows a header from `source`.

        It lands in `into` when the byte counts match (no allocation on the hot path);
        otherwise in a fresh byte array, which the caller will reject by its size.
        """
        status = self._wait(source, int(Tag.PAYLOAD), timeout)
        nbytes = status.Get_count(MPI.BYTE)
        target = into if nbytes == into.nbytes else np.empty(nbytes, np.uint8)
        request = self.comm.Irecv([_as_bytes(target), MPI.BYTE], source=source, tag=int(Tag.PAYLOAD))
        self._complete([request], timeout, source, nbytes)  # a sender stopped mid-transfer times out
        return target

    def _complete(self, requests: list[MPI.Request], timeout: float, peer: int, nbytes: int) -> None:
        """Wait for transfers with `peer`: busy at first, for as long as the bytes should
        take at 1 GB/s plus 10 ms (MPI moves a large message only while we call into it),
        then with backoff sleeps, so a peer that is gone costs little CPU until `timeout`."""
        now = time.monotonic()
        busy_until, deadline = now + 0.01 + nbytes / 1e9, now + timeout
        sleep = _FIRST_SLEEP
        while not MPI.Request.Testall(requests):
            now = time.monotonic()
            if now > deadline:
                raise PeerTimeout(f"rank {self.rank}: no transfer with rank {peer} for {timeout:g} s")
            if now > busy_until:
                time.sleep(sleep)
                sleep = min(sleep * 2, _MAX_SLEEP)

    def _wait(self, source: int, tag: int, timeout: float) -> MPI.Status:
        status = MPI.Status()
        deadline = time.monotonic() + timeout
        sleep = _FIRST_SLEEP
        while not self.comm.Iprobe(source=source, tag=tag, status=status):
            if time.monotonic() > deadline:
                who = "any rank" if source == ANY else f"rank {source}"
                raise PeerTimeout(f"rank {self.rank}: no message from {who} for {timeout:g} s")
            time.sleep(sleep)
            sleep = min(sleep * 2, _MAX_SLEEP)
        return status

    def allreduce_mean(self, array: np.ndarray) -> None:
        """Replace `array` (contiguous float32) by its mean over all ranks, in place."""
        self.comm.Allreduce(MPI.IN_PLACE, [array, MPI.FLOAT], op=MPI.SUM)
        array /= self.size

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Small objects from every rank, as a list on `root` (None elsewhere)."""
        return self.comm.gather(obj, root=root)

    def barrier(self) -> None:
        """Wait for every rank, without spinning (ranks may wait long, e.g. for a warm start)."""
        request = self.comm.Ibarrier()
        sleep = _FIRST_SLEEP
        while not request.Test():
            time.sleep(sleep)
            sleep = min(sleep * 2, _MAX_SLEEP)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """A small object from `root`, on every rank."""
        return self.comm.bcast(obj, root=root)

    def bcast_array(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        """`root`'s array, on every rank (the others pass an array of the same size)."""
        self.comm.Bcast([_as_bytes(array), MPI.BYTE], root=root)
        return array

    def abort(self, code: int) -> None:
        """End every rank of the job: one rank's failure must not leave others waiting."""
        self.comm.Abort(code)


def _as_bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)
