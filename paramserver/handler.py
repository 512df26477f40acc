"""The server's reaction to one message, as a pure function: `handle(state, msg)`.

`handle` checks the message, applies a push with the Store's rule, counts what it must,
and returns the replies to send and the events to record (paramserver/events.py); it
does no I/O. Moving messages is the driver's (`serve()` over MPI, the simulator's event
loop, `InProcess` in tests); writing logs, snapshots and checkpoints is the `Recorder`'s.
So the simulator, the tests and an MPI run share every decision the server makes, and
the handler's cost is the apply's, not the disk's.

A malformed message is rejected (a `Rejected` event) and never reaches the weights. A
reply's payload may be the live weights: the driver sends it before the next push is
handled (the apply would change it under the transfer).

A rule that gathers pushes into one step and defers replies (`fresh` with
`fresh_reply = "wait"`, or with "auto" where `paramserver/reply/pace.py` says the step comes
before the sender could push again) leaves a gathered push unanswered until the step:
its sender is `deferred`, and the push that completes the step is answered together
with every deferred one, so `handle()` may return replies to earlier pushers. When every client
still running waits so, or is overdue (paramserver/reply/gather.py), no push will complete the
step: it is taken with what was gathered (`release`, also the driver's after it loses a
client, or at `wake_at` when the clients it waits for fall overdue).

Where the clients' optimizer keeps state (`collects_states`, server 0), a checkpoint
falls due with its snapshot but is taken only once every client still in the run has
brought its state (a STATE just before its last push handled, or its STOP): from the
snapshot on, replies ask for it (`Weights.state`), and the checkpoint then holds each
client's state at the very step it records for that client. No client waits for it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from runconfig.settings import RunConfig
from paramserver.reply.dylu import Windows
from paramserver.events import (Applied, CheckpointDue, ClientRows, Dropped, Event, NoiseMeasured, Rejected,
                                 SnapshotDue)
from paramserver.reply.gather import release_due, waits
from paramserver.reply.pace import Pace
from paramserver.reply.rounds import Rounds
from paramserver.tally import RunBudget, ServerTally
from paramserver.schedule import Schedule
from paramserver.store import ApplyResult, Store
from paramserver.wire import frame
from paramserver.wire.compress import Codec, make_codec
from paramserver.wire.frame import Garbled
from paramserver.wire.protocol import FROM_CLIENTS, Message, Push, Rejoin, Reply, State, Tag, Weights, well_formed


class ClientLost(RuntimeError):
    """A client can no longer take part: the job ends, or goes on without it."""

    def __init__(self, rank: int, what: str, named: bool = False):
        super().__init__(what)
        self.rank = rank
        self.named = named  # logged already: it ends the job


class ClientFailed(ClientLost):
    """A client reported an exception."""


@dataclass
class ServerState:
    """Everything `handle` reads and changes: the Store, the tallies, the wire's buffers.

    `peers`: with sharded servers, the server ranks allowed to read this one's slice
    (a PULL from them is answered with the raw slice). `apply_cost`: seconds an apply is
    logged as taking (the simulator's virtual cost); None: measured. `schedule`: the
    run's lr schedule (paramserver/schedule.py), whose progress the replies carry and
    whose multiplier the rule applies with; None: a constant lr. `clock`: the run's
    (virtual in the simulator), by which a paced rule (`fresh_reply = "auto"`) times the
    clients to decide who waits (`pace`; otherwise the rule's `defers` decides), and by
    which a checkpoint is due `checkpoint_every` seconds after the last. `stop`:
    whether the run reached a target (`stop_at_error`, `_loss`, `_metric`): every reply from then on tells
    its client to stop. `collects_states`: checkpoints hold the clients' optimizer states
    (see the module's doc); `client_states`: client -> the state its last push handled (or
    STOP) came with, where it came with one; `arrived_states`: those awaiting their push.
    `windows`: with DyLU, the clients' speeds and the windows the replies give (paramserver/reply/dylu.py).
    `budget`: the run's, where the run has one (`budget = "run"`; paramserver/tally.py).
    """

    store: Store
    client_ranks: list[int]
    eval_every: int = 0
    codec: Codec = field(default_factory=Codec)
    tally: ServerTally | None = None
    peers: tuple[int, ...] = ()
    apply_cost: float | None = None
    wire_bytes: list[int] = field(default_factory=lambda: [0, 0])  # payload bytes (pushed, pulled)
    schedule: Schedule | None = None
    deferred: list[int] = field(default_factory=list)  # client ranks whose replies wait for a step
    clock: Callable[[], float] = time.monotonic  # the run's clock, which `pace` times the clients by
    stop: Callable[[], bool] = lambda: False
    collects_states: bool = False
    client_states: dict[int, State] = field(default_factory=dict)
    arrived_states: dict[int, State] = field(default_factory=dict)
    checkpoint_due: bool = False
    checkpoint_every: float = 0.0  # seconds of `clock` after which a checkpoint is due between curve points
    checkpointed_at: float = 0.0   # `clock` when the last was asked for (from the start: __post_init__)
    windows: Windows | None = None
    rounds: Rounds | None = None  # nesterov_reply round/auto: early pushers may wait for the round's momentum step
    budget: RunBudget | None = None

    def __post_init__(self) -> None:
        self.checkpointed_at = self.clock()
        self.tally = self.tally or ServerTally(len(self.client_ranks))
        self.buffer = frame.empty(self.store.size, np.float32)  # pushes, as float32
        compressed = self.codec.wire_dtype != np.float32
        self.landing = frame.empty(self.store.size, self.codec.wire_dtype) if compressed else self.buffer  # as they come
        self.pace = Pace(self.clock, overdue=self.store.rule.overdue) if self.store.rule.paced else None

    @classmethod
    def for_run(cls, cfg: RunConfig, weights: np.ndarray, clients: int, optimizer_factory: Callable | None = None,
                **options: Any) -> ServerState:
        """A server's state for its slice `weights` of a run of `clients` clients: its store
        (`optimizer_factory`: the user's optimizer, for its rule), the clients' ranks (after
        the servers'), the wire's codec, the lr schedule the server counts progress for and
        applies its rule's lr by (`options`: the other fields)."""
        return cls(Store.for_run(cfg, weights, clients, optimizer_factory), list(range(cfg.servers, cfg.servers + clients)),
                   codec=make_codec(cfg.compress),
                   schedule=Schedule.for_run(cfg, clients, lr=cfg.effective_server_lr),
                   windows=Windows.for_run(cfg, clients), rounds=Rounds.for_run(cfg),
                   budget=RunBudget(cfg.client_steps(clients), cfg.fetch_every) if cfg.run_budget else None, **options)

    def arrays(self) -> dict[str, np.ndarray]:
        """What a checkpoint holds of the server: the Store's arrays, and DyLU's speeds."""
        return {**self.store.state(), **(self.windows.state() if self.windows else {})}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """The server as a checkpoint's `arrays` hold it."""
        self.store.load_state(arrays)
        if self.windows is not None:
            self.windows.load_state(arrays)

    def counts(self) -> dict[str, Any]:
        """What the server counted, for the run's summary."""
        store, tally = self.store, self.tally
        return {
            "minibatches": tally.minibatches,
            "samples": tally.samples,
            "version": store.version,
            # a stopped client says how many it sent; of one that failed or was lost, what came
            "pushes_sent": sum(max(int(tally.client_pushes[i]), tally.stops[r].pushes if r in tally.stops else 0)
                               for i, r in enumerate(self.client_ranks)),
            "pushes_applied": sum(store.applied.values()),
            "pushes_rejected": tally.rejected,
            "pushes_dropped": sum(store.dropped.values()),
            "dropped_per_client": {str(c): n for c, n in sorted(store.dropped.items())},
            "staleness": store.staleness_stats(),
            # memory the rule's state takes beside the weights (DC-ASGD's copies, momentum, sums)
            "rule_state_bytes": sum(t.numel() * t.element_size() for t in store.rule.state().values()),
            "lost_clients": sorted(tally.lost.values(), key=lambda lost: lost["client"]),
        }

    def client(self, rank: int) -> int:
        return self.client_ranks.index(rank)

    @property
    def progress(self) -> int:
        """Samples the clients have pushed so far: the lr schedule's clock. From the steps
        in the push headers, so every server of a sharded run counts alike (only server 0
        sees the rows), and a checkpoint's client steps restore it. Where the rule counts
        progress itself (`fresh` under adascale: its steps' gains, one server, checkpointed
        with the rule), that count in samples."""
        batch = self.schedule.batch_size if self.schedule else 0
        gained = self.store.rule.gained
        return batch * self.tally.steps if gained is None else round(batch * gained)

    @property
    def waiting(self) -> list[int]:
        """Client ranks still expected to send something."""
        return [self.client_ranks[c] for c in self.running]

    @property
    def running(self) -> list[int]:
        """The clients (indices) still expected to send something."""
        tally = self.tally
        return [c for c, r in enumerate(self.client_ranks) if r not in tally.stops and r not in tally.lost]

    @property
    def done(self) -> bool:
        return not self.waiting


def handle(state: ServerState, msg: Message) -> tuple[list[Reply], list[Event]]:
    """One message: the replies to send and the events to record."""
    if msg.source in state.peers and msg.tag == Tag.PULL:  # server 0 reads this slice for a snapshot
        return [Reply(msg.source, Weights(state.store.version, state.store.size, state.progress),
                      state.store.weights)], []
    problem = _message_problem(state, msg)
    if problem:
        return [], [_reject(state, msg.source, problem)]
    if msg.tag == Tag.FAIL:
        raise ClientFailed(msg.source, f"failed: {msg.header.reason}")
    if msg.tag == Tag.STATE:
        state.arrived_states[state.client(msg.source)] = msg.header
        return [], []
    if msg.tag == Tag.STOP:
        state.tally.stops[msg.source] = msg.header
        _took_state(state, msg.source, msg.header.steps)
        replies, events = release(state)
        return replies, events + _checkpoint_ready(state)
    if msg.tag == Tag.PULL:
        events = _rejoined(state, msg.source, msg.header) if isinstance(msg.header, Rejoin) else []
        return [_weights_for(state, msg.source)], events
    version = state.store.version
    if state.pace is not None:
        state.pace.pushed(msg.source)
    _took_state(state, msg.source, msg.header.step)
    result, events = _push(state, msg)
    events += _checkpoint_ready(state)
    replies = []
    held = state.rounds is not None and state.rounds.holds(state, msg.source)
    if msg.header.fetch and (held or result.gathered and waits(state, msg.source)):
        state.deferred.append(msg.source)
    elif msg.header.fetch:
        replies.append(_weights_for(state, msg.source))
    if state.store.version != version and not held:
        replies += _answer_deferred(state)
    more, flushed = release(state)
    return replies + more, events + flushed


def release(state: ServerState, overdue: bool = False) -> tuple[list[Reply], list[Event]]:
    """The step `release_due` says must be taken, with what was gathered, and the replies
    to the clients that waited for it; or, held for a round that can no longer complete
    (paramserver/reply/rounds.py), those clients answered with the weights as they are."""
    if state.rounds is not None and state.deferred and state.rounds.stranded(state):
        return _answer_deferred(state), []
    if not release_due(state, overdue) or not state.store.flush():
        return [], []
    return _answer_deferred(state), _snapshot_due(state)


def _answer_deferred(state: ServerState) -> list[Reply]:
    ranks, state.deferred = state.deferred, []
    return [_weights_for(state, rank) for rank in ranks if rank not in state.tally.lost]


def tag_name(tag: int) -> str:
    try:
        return Tag(tag).name
    except ValueError:
        return f"unknown tag {tag}"


def _message_problem(state: ServerState, msg: Message) -> str:
    if msg.source not in state.client_ranks:
        return f"message tag {msg.tag} from rank {msg.source}, which is not a client"
    if msg.source in state.tally.stops:
        return f"message tag {msg.tag} from rank {msg.source} after its STOP"
    if msg.source in state.tally.lost:
        return f"message tag {msg.tag} from rank {msg.source}, a client lost before"
    if msg.tag not in FROM_CLIENTS:
        return f"message tag {tag_name(msg.tag)} is not one a client sends"
    if isinstance(msg.header, Garbled):
        return f"malformed message: {msg.header.why}"
    if not well_formed(msg.tag, msg.header):
        return f"malformed message: tag {msg.tag} with header {type(msg.header).__name__}"
    return ""


def _weights_for(state: ServerState, rank: int) -> Reply:
    weights, version = state.store.pull(state.client(rank))
    if state.pace is not None:
        state.pace.replied(rank)
    data = state.codec.encode(weights)
    state.wire_bytes[1] += data.nbytes
    windows = state.windows  # DyLU: the window, from the speeds of the clients still running
    budget = state.budget
    client, running = state.client(rank), state.running if windows or budget else []
    window = windows.reply(client, state.clock(), running) if windows else 0
    stop = state.stop() or (budget is not None and budget.spent(state.tally, client, running))
    if budget is not None and not stop:
        budget.went(state.tally, client, window)
    return Reply(rank, Weights(version, weights.size, state.progress, stop, state.checkpoint_due, window), data)


def _push(state: ServerState, msg: Message) -> tuple[ApplyResult, list[Event]]:
    header: Push = msg.header
    client, store, payload = state.client(msg.source), state.store, msg.payload
    state.wire_bytes[0] += payload.nbytes
    pulled, version = store.pulled.get(client, 0), store.version
    if state.schedule is not None:  # the lr at the progress before this push
        store.rule.lr_factor = state.schedule.factor(state.progress)
        store.rule.scale_ramp = state.schedule.ramp(store.version)  # the steps taken, whatever was dropped
    # from the steps in the headers, which every server of a sharded run gets
    minibatches = max(1, header.step - int(state.tally.client_steps[client]))
    if state.windows is not None:
        state.windows.pushed(client, minibatches, state.clock())
    start = time.perf_counter()
    if header.dtype != state.codec.dtype or payload.dtype != state.codec.wire_dtype or header.size != store.size:
        reason = (f"payload of {payload.nbytes} bytes as {header.size} {header.dtype}, "
                  f"expected {store.size} {state.codec.dtype}")
        result = ApplyResult(False, store.version, store.version - pulled, reason)
    else:
        result = store.apply(client, state.codec.decode(payload, state.buffer), minibatches)
    apply_s = time.perf_counter() - start if state.apply_cost is None else state.apply_cost
    events: list[Event] = [_outcome(state, msg.source, client, result, apply_s)]
    events.append(_client_rows(state, client, header, pulled, result))
    if result.measured:
        rule = store.rule
        events.append(NoiseMeasured(state.progress, rule.noise.estimate, rule.step_batch, rule.gain,
                                    rule.noise.mean_norm))
    if store.version != version:
        events += _snapshot_due(state)
    return result, events


def _outcome(state: ServerState, rank: int, client: int, result: ApplyResult, apply_s: float) -> Event:
    if result.accepted:
        return Applied(client, result.version, result.staleness, apply_s)
    if result.dropped:
        return Dropped(client, result.staleness, result.reason)
    return _reject(state, rank, result.reason)


def _snapshot_due(state: ServerState) -> list[Event]:
    """A curve point at each multiple of eval_every, with a checkpoint; between them a
    checkpoint alone once `checkpoint_every` seconds passed since the last, so an
    interrupt loses no more than that however far apart the curve's points are."""
    version = state.store.version
    if state.eval_every and version % state.eval_every == 0:
        state.checkpoint_due, state.checkpointed_at = state.collects_states, state.clock()
        return [SnapshotDue(version, checkpoint=not state.collects_states), *_checkpoint_ready(state)]
    if not state.checkpoint_every or state.clock() - state.checkpointed_at < state.checkpoint_every:
        return []
    state.checkpointed_at = state.clock()
    if not state.collects_states:
        return [CheckpointDue(version)]
    state.checkpoint_due = True  # once every client brought its optimizer state
    return _checkpoint_ready(state)


def _took_state(state: ServerState, rank: int, step: int) -> None:
    """A push or STOP at `step` from `rank` came in: the state sent just before it is
    that client's now, or (none came, or of another step) it has none the server knows."""
    if not state.collects_states:  # no state is asked for: nothing to do on every push
        return
    client = state.client(rank)
    arrived = state.arrived_states.pop(client, None)
    if arrived is not None and arrived.step == step:
        state.client_states[client] = arrived
    else:
        state.client_states.pop(client, None)


def _checkpoint_ready(state: ServerState) -> list[Event]:
    """The checkpoint waiting for the clients' states, once every client still in the run
    has brought its own."""
    if not state.checkpoint_due:
        return []
    lost = {state.client(rank) for rank in state.tally.lost}
    if any(c not in state.client_states and c not in lost for c in range(len(state.client_ranks))):
        return []
    state.checkpoint_due = False
    return [CheckpointDue(state.store.version)]


def _client_rows(state: ServerState, client: int, header: Push, pulled: int, result: ApplyResult) -> ClientRows:
    """The window's rows (the client ran them, applied or not); the last one carries the
    sync point's version and staleness, or why its push was rejected."""
    tally = state.tally
    rows = [dict(r) for r in header.rows]
    tally.stepped(client, header.step)
    tally.client_pushes[client] += 1
    if rows:
        sync = {"version_pulled": pulled, "staleness": result.staleness}
        if result.dropped:
            sync["dropped"] = True
        elif not result.accepted:
            sync["rejected"] = result.reason
        rows[-1].update(sync)
    tally.minibatches += len(rows)
    tally.samples += sum(r.get("samples", 0) for r in rows)
    return ClientRows(rows, tally.minibatches)


def _rejoined(state: ServerState, rank: int, header: Rejoin) -> list[Event]:
    """A client back from a failure: its lost minibatches count as computed (the
    progress, the minibatches and samples, their rows logged), and the state it will
    bring is a fresh one, so a checkpoint waits for it."""
    client, tally = state.client(rank), state.tally
    tally.stepped(client, header.step)
    _took_state(state, rank, header.step)
    rows = [dict(r) for r in header.rows]
    tally.minibatches += len(rows)
    tally.samples += sum(r.get("samples", 0) for r in rows)
    return [ClientRows(rows, tally.minibatches)] if rows else []


def _reject(state: ServerState, rank: int, reason: str) -> Rejected:
    state.tally.rejected += 1
    return Rejected(state.client(rank) if rank in state.client_ranks else None, rank, reason)
