"""Every message between clients and the server: tags and headers, in one place.

A message is a header (a dataclass) and, for a push or weights, a payload. On the
wire a push and its weights reply are each ONE MPI message, a fixed binary header in
front of the payload's bytes (paramserver/wire/frame.py: no pickle on the hot path); the
rare messages (PULL, STOP, FAIL, BYE, STATE, JOIN and its Welcome, ADMIT) are pickled
dataclasses.

The rare headers are frozen. What one push builds (`Push`, `Weights`, `Outgoing`,
`Message`, `Reply`; the server's `ApplyResult`, `Applied`, `ClientRows` and the rule's
`Update`) are slotted dataclasses that nothing changes once built, not frozen ones: a
frozen dataclass sets each field through `object.__setattr__`, 0.7 us more a build
than a slotted one (1.0 against 0.27 us for seven fields, measured), and a round trip
builds eleven (a 2-rank job at 1e4 floats, frozen and slotted in turn, 3 pairs:
9,084-10,158 round trips/s frozen, 10,057-10,335 slotted).

Message sequence (one client; the server serves all clients in arrival order):

    client                                  server
      | -- PULL ---------------------------> |  remembers the version the client holds
      | <---------- WEIGHTS(version) + data - |
      |   n_push local minibatches (DyLU: the |
      |   last reply's `window`)              |  (paramserver/reply/dylu.py: from measured speeds)
      | -- PUSH(rows, fetch=True) + data ---> |  checks, applies, logs staleness
      | <---------- WEIGHTS(version) + data - |  (only when the push asks to fetch)
      |   while WEIGHTS say `state` (a        |
      |   checkpoint is due), each push comes |
      |   after STATE(step, optimizer arrays) |  held until the checkpoint, written once
      |   ...                                 |  every client's last push brought one
      |   ... until the step budget is done,  |
      |   or a WEIGHTS says stop (the run     |
      |   reached a stop_at_* target; work    |
      |   not pushed goes in one PUSH first)  |
      | -- STATE, STOP(steps, pushes) ------> |  ends when every client has stopped (or is lost)
      | <---------------------- BYE(lost) --- |  once the run is recorded; then all exit
      | -- FAIL(reason) --------------------> |  on an exception; then the job aborts

A process that joins a running job (`--joinable`, docs/joining.md) sends JOIN(secret,
host) from a rank the server has not seen; the server answers WELCOME(client, steps,
slot, position, weights) with the weights as a pull's, and from then on it is a client
like the others (its next message a PUSH). A JOIN the server refuses gets no answer.
Over MPI the Welcome travels pickled on the JOIN tag, then its weights as a WEIGHTS
frame. A spare rank (`--spares`, started with the job) waits for server 0:

    spare                                   server 0
      | <------------------ ADMIT(secret) -- |  a client was lost (under continue)
      | -- JOIN(secret, host) -------------> |  as any joiner's
      | <-- JOIN: WELCOME, WEIGHTS + data --- |  from here on an ordinary client
      | <----------------------- BYE(lost) -- |  instead, for a spare never admitted

With n_fetch != n_push a client also sends PUSH(fetch=False) (no reply) or a bare
PULL at its fetch steps. A client back from a failure (`mtbf`, clients/stragglers.py)
sends PULL with a `Rejoin` header: the step it failed at and the rows it lost. STATE is sent only by clients whose optimizer keeps state
(momentum, Adam's moments), to server 0 only: a checkpoint of an async run then holds
each client's state at the step it records for that client, so a resume goes on with
it. With S sharded servers (ranks 0..S-1, `shard_bounds`) a
client sends each message to every server, each push carrying that server's slice
(rows go to server 0 only), and takes WEIGHTS from each; server 0 reads the other
servers' slices with PULL for snapshots, and says BYE to them last. Server 0 decides
when each client is answered (the pace, DyLU's windows): after each message it handled
it sends the others DECIDED(rank, said, then), and they handle the clients' messages in its
order with its answers (paramserver/drivers/follow.py), so every server's version v is the same
v steps of the same pushes. `rows` carries the client's per-minibatch log rows, so only
the server's rank writes the run directory and clients on other hosts need no shared
file system.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

import numpy as np


class Tag(IntEnum):
    PULL = 1
    PUSH = 2
    STOP = 3
    FAIL = 4
    WEIGHTS = 5
    GATHER = 7     # a small object to or from the root of a gather or scatter (startup, sync modes' rows)
    BYE = 8
    STATE = 9      # a client's optimizer state, for the checkpoint (before a push or STOP)
    JOIN = 10      # a process asks to become a new client of the running job (`Join`; answered with a `Welcome`)
    DECIDED = 11   # server 0's reply decisions, to the other servers, for each message it handled (`Decided`)
    ADMIT = 12     # server 0 to a spare rank: join now, in a lost client's place (`Admit`)
    DOOR = 13      # a server > 0 to server 0 as the run starts (`--joinable`): where its door listens (a dict)


@dataclass(frozen=True)
class Pull:
    pass


@dataclass(frozen=True)
class Rejoin:
    """A PULL from a client back from a failure: the step it failed at and the rows of
    the minibatches it lost (not pushed), so the server counts and logs them."""

    step: int
    rows: tuple[dict[str, Any], ...] = ()


@dataclass(slots=True)
class Push:
    step: int                  # the client's minibatch count at this push
    size: int                  # payload length, in elements
    fetch: bool                # reply with the weights after applying
    dtype: str = "float32"
    rows: tuple[dict[str, Any], ...] = field(default=())
    fragment: int = -1         # a streamed fragment's index (-1: the whole vector), applied at `offset`
    offset: int = 0            # its first element in the flat vector (the server checks it against its slicing)


@dataclass(frozen=True)
class Stop:
    steps: int                 # minibatches the client ran
    pushes: int                # pushes it sent
    pushed_bytes: int = 0      # the bytes of its push frames (headers, payloads, rows), to every server
    pulled_bytes: int = 0      # the bytes of the weights frames it took, from every server
    computed_s: float = 0.0    # seconds its minibatches took (clients/loop.py, BusyTime)
    span_s: float = 0.0        # seconds from its first minibatch's start to its last one's end


@dataclass(frozen=True)
class State:
    step: int                  # the client's minibatch count: that of the push or STOP it precedes
    arrays: dict[str, np.ndarray]  # `ClientOptimizer.state_arrays()`


@dataclass(frozen=True)
class Join:
    """A process that asks to join the running job: the run's secret (from the run
    directory, readable by its owner only) and the host it runs on, for the record."""

    secret: str
    host: str = ""


@dataclass(frozen=True)
class Decided:
    """Server 0 of sharded servers, to the others, after each message it handled: `rank`,
    the client whose next PUSH, PULL or STOP (which every server gets) they handle now
    (-1: none, the message was server 0's alone or a step its loop released); `said`, its
    reply policy's answers while handling it, and `then`, while its loop looked for a step
    to let go after it, each in the order asked (paramserver/reply/policy.py)."""

    rank: int
    said: tuple[bool, ...]
    then: tuple[bool, ...] = ()


@dataclass(frozen=True)
class Seated:
    """Server 0 of sharded servers, to the others, when it let a joiner in: the rank it
    knows the joiner by, its client number, and the ticket it shows the other servers'
    doors (one from outside the job: paramserver/drivers/tickets.py). They grow by it,
    in server 0's order, before any word naming the joiner's messages; a server's answer
    to the joiner at its door is this word too."""

    rank: int
    client: int
    ticket: str = ""


@dataclass(frozen=True)
class Admit:
    """Server 0 to a spare rank: a client was lost, join in its place. The secret is what
    the JOIN must show: no rank learns it before it is admitted, so a JOIN from a spare
    that was not admitted is refused."""

    secret: str


@dataclass(frozen=True)
class Fail:
    reason: str


@dataclass(frozen=True)
class Bye:
    lost: int                  # clients the run went on without


@dataclass(slots=True)
class Weights:
    version: int
    size: int
    samples: int = 0           # the server's progress (paramserver/schedule.py): the lr they train at
    stop: bool = False         # the run reached a target (stop_at_error, _loss, _metric): the client stops here
    state: bool = False        # a checkpoint is due: send the optimizer's state before each push
    window: int = 0            # DyLU: the minibatches to run before the next push (0: n_push; paramserver/reply/dylu.py)
    fragment: int = -1         # the slice of the weights the payload is: the fragment answered (-1: all of them)


@dataclass(frozen=True)
class Welcome:
    """The server's answer to a JOIN: the joiner's new client number (a lost client's is
    never given again), its share of the run's budget in minibatches, the shard of the
    training set it draws from (`slot`: a lost client's, or one of its own) and how many
    minibatches of that shard's order were drawn already (`position`), and the weights'
    header (version, the schedule's position) before the payload. `clock`: the run's clock
    at the join, which a joiner from another job stamps its rows from (the job's ranks
    started theirs together). `ticket`: what it shows servers 1..S-1 of sharded servers
    (`Seated`); with them the payload does not follow: the joiner pulls from every server."""

    client: int
    steps: int
    slot: int
    position: int
    weights: Weights
    clock: float = 0.0
    ticket: str = ""


@dataclass(slots=True)
class Outgoing:
    """A message a client (or server 0, reading the other slices) is about to send."""
    tag: Tag
    header: Any
    payload: np.ndarray | None = None


@dataclass(slots=True)
class Message:
    """A header as received, with the rank it came from and, for a push, its payload
    (`carries_payload`) as it landed: in the receiver's buffer when the byte count was
    the buffer's, else as raw bytes (`payload_target`), which the server rejects."""

    source: int
    tag: int
    header: Any
    payload: np.ndarray | None = None


@dataclass(slots=True)
class Reply:
    """What the server sends back: weights (header and payload) to `dest`."""

    dest: int
    header: Weights | Welcome
    payload: np.ndarray


class ProtocolError(RuntimeError):
    """A server's reply that cannot be read: the run cannot go on from it."""


class PeerTimeout(TimeoutError):
    """No message came from the awaited rank(s) within the timeout. `peers`: the ranks
    it was awaited from (empty: any rank), so a half-received message names its sender."""

    def __init__(self, what: str, peers: tuple[int, ...] = ()):
        super().__init__(what)
        self.peers = peers


class PeerFailed(RuntimeError):
    """A rank reported an exception (FAIL) while this one waited in a collective."""


class Link(Protocol):
    """The moving of messages, as the server loop and a client's `ServerLink` use it:
    `paramserver/wire/transport.py` over MPI (the simulator moves them through its event
    queue instead). The cores are typed against this, so none of them imports MPI."""

    def recv(self, timeout: float, source: int = ..., tag: int = ..., busy: float = ...,
             into: np.ndarray | None = ...) -> Message: ...

    def send(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None,
             timeout: float = ...) -> None: ...

    def send_many(self, messages: list[tuple[int, Tag, Any, np.ndarray | None]], timeout: float = ...) -> None: ...

    def post(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None) -> list: ...

    def done(self, requests: list) -> bool: ...

    def expect_weights(self, sources: list[int], intos: list[np.ndarray]) -> list: ...

    def complete(self, requests: list, peers: list[int], nbytes: int, timeout: float) -> list[Weights]: ...


def shard_bounds(size: int, servers: int, block: int = 1) -> list[tuple[int, int]]:
    """The contiguous slice of the flat vector each of `servers` server ranks owns, each
    starting at a multiple of `block` (a blockwise codec's, paramserver/wire/compress.py:
    then a slice of a push is whole blocks, which its server decodes alone)."""
    blocks = -(-size // block)
    edges = [min(size, block * (blocks * s // servers)) for s in range(servers + 1)]
    return list(zip(edges[:-1], edges[1:]))


def fragment_pieces(fragment: tuple[int, int], shards: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Streamed fragment [a, b) of the flat vector cut at the servers' slices `shards`:
    for each server (offset in its own slice, start, stop within the fragment), so the
    fragment's payload [start:stop] goes to that server, applied at that offset. A server
    whose slice it misses gets an empty piece (start == stop, the offset clamped to its
    slice): its header still goes, so every server takes every push in server 0's order
    (paramserver/drivers/follow.py) and counts the same versions."""
    a, b = fragment
    return [(min(max(a, lo), hi) - lo, min(max(lo, a), b) - a, max(min(hi, b), a) - a) for lo, hi in shards]


HEADERS = {Tag.PULL: (Pull, Rejoin), Tag.PUSH: Push, Tag.STOP: Stop, Tag.FAIL: Fail, Tag.WEIGHTS: Weights,
           Tag.BYE: Bye, Tag.STATE: State, Tag.JOIN: Join, Tag.DECIDED: (Decided, Seated),
           Tag.ADMIT: Admit, Tag.DOOR: dict}
FROM_CLIENTS = (Tag.PULL, Tag.PUSH, Tag.STOP, Tag.FAIL, Tag.STATE)
_LOGGABLE = (int, float, str, bool, type(None))


def carries_payload(tag: int, header: Any) -> bool:
    """Whether a client's message brings a payload for the server: only a push does."""
    return tag == Tag.PUSH and isinstance(header, Push)


def payload_target(nbytes: int, into: np.ndarray | None) -> np.ndarray:
    """Where an arriving payload of `nbytes` lands: `into`, or the start of it for a
    shorter run of whole elements (a streamed fragment's slice; the server checks its
    length against the header's fragment), with no allocation on the hot path; else
    fresh bytes, which the server rejects by size."""
    if into is None or nbytes > into.nbytes or nbytes % into.itemsize:
        return np.empty(nbytes, np.uint8)
    return into if nbytes == into.nbytes else into[:nbytes // into.itemsize]


def well_formed(tag: int, header: Any) -> bool:
    """True when `header` is the header type that `tag` announces, with fields of the
    declared types (a push's rows come as JSON from the wire, so nothing else guarantees
    them)."""
    if not isinstance(header, HEADERS.get(tag, ())):  # an unknown tag: () is no header type
        return False
    if isinstance(header, Push):
        return (_is_int(header.step) and _is_int(header.size) and isinstance(header.fetch, bool)
                and isinstance(header.dtype, str) and _loggable(header.rows)
                and _is_int(header.fragment) and _is_int(header.offset))
    if isinstance(header, Rejoin):
        return _is_int(header.step) and _loggable(header.rows)
    if isinstance(header, Join):
        return isinstance(header.secret, str) and isinstance(header.host, str)
    if isinstance(header, Decided):
        return _is_int(header.rank) and all(isinstance(said, tuple) and all(isinstance(b, bool) for b in said)
                                            for said in (header.said, header.then))
    if isinstance(header, Seated):
        return _is_int(header.rank) and _is_int(header.client) and isinstance(header.ticket, str)
    if isinstance(header, Admit):
        return isinstance(header.secret, str)
    if isinstance(header, Stop):
        return all(_is_int(v) for v in (header.steps, header.pushes, header.pushed_bytes, header.pulled_bytes)) and \
            all(isinstance(v, float) and 0 <= v < math.inf for v in (header.computed_s, header.span_s))
    if isinstance(header, State):
        return _is_int(header.step) and isinstance(header.arrays, dict) and all(
            isinstance(k, str) and isinstance(v, np.ndarray) and v.dtype != object for k, v in header.arrays.items())
    return True


def _loggable(rows: Any) -> bool:
    """Rows a client sent for the logs: a tuple of dicts of plain values."""
    return isinstance(rows, tuple) and all(isinstance(row, dict) for row in rows) and \
        all(isinstance(v, _LOGGABLE) for row in rows for v in row.values())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
