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

When to answer is the reply policy's (`ServerState.reply`, paramserver/reply/policy.py):
a push its rule gathers into a step not yet taken may be left unanswered until the step,
and the push that completes it is answered together with every deferred one, so
`handle()` may return replies to earlier pushers. When the policy says no push will
complete the step, it is taken with what was gathered (`release`, also the driver's after
it loses a client, or at the policy's `wake_at` when the clients it waits for fall overdue).

Where the clients' optimizer keeps state (`collects_states`, server 0), a checkpoint
falls due with its snapshot but is taken only once every client still in the run has
brought its state (a STATE just before its last push handled, or its STOP): from the
snapshot on, replies ask for it (`Weights.state`), and the checkpoint then holds each
client's state at the very step it records for that client. No client waits for it.
"""
from __future__ import annotations

import time

from paramserver import membership
from paramserver.events import (Applied, CheckpointDue, ClientRows, Dropped, Event, NoiseMeasured, Rejected,
                                 SnapshotDue)
from paramserver.state import ServerState
from paramserver.store import ApplyResult
from paramserver.wire.frame import Garbled
from paramserver.wire.protocol import (FROM_CLIENTS, Message, Push, Rejoin, Reply, Tag, Weights, Welcome,
                                       well_formed)


class ClientLost(RuntimeError):
    """A client can no longer take part: the job ends, or goes on without it."""

    def __init__(self, rank: int, what: str, named: bool = False):
        super().__init__(what)
        self.rank = rank
        self.named = named  # logged already: it ends the job


class ClientFailed(ClientLost):
    """A client reported an exception."""


def handle(state: ServerState, msg: Message) -> tuple[list[Reply], list[Event]]:
    """One message: the replies to send and the events to record."""
    if msg.source in state.peers and msg.tag == Tag.PULL:  # server 0 reads this slice for a snapshot
        return [Reply(msg.source, Weights(state.store.version, state.store.size, state.progress),
                      state.store.weights)], []
    if msg.tag == Tag.JOIN:
        return _join(state, msg)
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
        replies = [_weights_for(state, msg.source)]  # a client starting a window afresh: a held round may not wait
        return replies + (_answer_deferred(state) if state.reply.stranded(state) else []), events
    version = state.store.version
    _took_state(state, msg.source, msg.header.step)
    result, minibatches, events, fragment = _push(state, msg)
    events += _checkpoint_ready(state)
    replies = []
    held = state.reply.holds(state, msg.source)  # a round of delayed Nesterov not yet stepped
    if msg.header.fetch and (held or result.gathered and state.reply.waits(state, msg.source, minibatches)):
        state.reply.deferred.append(msg.source)  # answered with the step or the round
    elif msg.header.fetch:
        replies.append(_weights_for(state, msg.source, fragment))
    if state.store.version != version and not held:
        replies += _answer_deferred(state)
    more, flushed = release(state)
    return replies + more, events + flushed


def release(state: ServerState, overdue: bool = False) -> tuple[list[Reply], list[Event]]:
    """The step `release_due` says must be taken, with what was gathered, and the replies
    to the clients that waited for it; or, held for a round that can no longer complete,
    those clients answered with the weights as they are."""
    if state.reply.stranded(state):
        return _answer_deferred(state), []
    if not state.reply.release_due(state, overdue) or not state.store.flush():
        return [], []
    return _answer_deferred(state), _snapshot_due(state)


def _answer_deferred(state: ServerState) -> list[Reply]:
    return [_weights_for(state, rank) for rank in state.reply.answered() if rank not in state.tally.lost]


def tag_name(tag: int) -> str:
    return Tag(tag).name if tag in Tag._value2member_map_ else f"unknown tag {tag}"


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


def _weights_for(state: ServerState, rank: int, fragment: int = -1) -> Reply:
    """The weights for client `rank`: all of them, or the slice of streamed fragment `fragment`."""
    weights, version = state.store.pull(state.client(rank))
    if fragment >= 0:
        lo, hi = state.pieces[fragment]
        weights = weights[lo:hi]
    data = state.pull_codec.encode(weights)
    budget = state.budget
    client, running = state.client(rank), state.running if state.reply.windows or budget else []
    window = state.reply.replied(rank, client, running)
    stop = state.stop() or (budget is not None and budget.spent(state.tally, client, running))
    if budget is not None and not stop:
        budget.went(state.tally, client, window)
    return Reply(rank, Weights(version, data.size, state.progress, stop, state.checkpoint_due, window, fragment), data)


def _join(state: ServerState, msg: Message) -> tuple[list[Reply], list[Event]]:
    """A process asks to join (paramserver/membership.py): refused, changing nothing, or a
    client from now on, answered with the weights as a pull is and its place in the run."""
    refused = membership.refusal(state, msg)
    if refused is not None:
        return [], [refused]
    client, steps, slot, position = membership.seat(state, msg.source)
    weights = _weights_for(state, msg.source)
    # a spare is a rank of the job, which every server knows: it shows no door a ticket
    ticket = "" if msg.source in state.members.admitted else membership.ticket(state, client)
    welcome = Welcome(client, steps, slot, position, weights.header, state.clock(), ticket)
    return [Reply(msg.source, welcome, weights.payload)], [membership.joined(state, client, msg.source, msg.header.host)]


def _push(state: ServerState, msg: Message) -> tuple[ApplyResult, int, list[Event], int]:
    """Apply a push: its outcome, the minibatches it covers, the events to record and the
    fragment it was (-1: the whole vector, or a fragment refused, whose reply is all of it)."""
    header: Push = msg.header
    client, store, payload = state.client(msg.source), state.store, msg.payload
    pulled, version = store.pulled.get(client, 0), store.version
    schedule = state.schedule  # the lr at the progress before this push; the ramp by the steps taken, whatever was dropped
    at = (schedule.factor(state.progress), schedule.ramp(store.version)) if schedule is not None else (1.0, 1.0)
    # from the steps in the headers, which every server of a sharded run gets
    minibatches = max(1, header.step - int(state.tally.client_steps[client]))
    state.reply.pushed(msg.source, client, minibatches)
    start = time.perf_counter()
    codec = state.codec
    piece, reason = _piece(state, header)
    size = store.size if piece is None else piece.stop - piece.start
    wire_size = codec.wire_size(size)  # a truncated or padded payload is refused here, before decoding
    expected = (codec.dtype, codec.wire_dtype, wire_size, wire_size)
    if not reason and (header.dtype, payload.dtype, header.size, payload.size) != expected:
        reason = (f"payload of {payload.nbytes} bytes as {header.size} {header.dtype}, "
                  f"expected {wire_size} {codec.wire_dtype} of {codec.dtype}")
    if reason:
        result = ApplyResult(False, store.version, store.version - pulled, reason)
    else:
        result = store.apply(client, codec.decode(payload, state.buffer[:size]), minibatches, *at, piece=piece,
                             pieces=tuple(slice(lo, hi) for lo, hi in state.pieces))
    apply_s = time.perf_counter() - start if state.apply_cost is None else state.apply_cost
    events: list[Event] = [_outcome(state, msg.source, client, result, apply_s)]
    events.append(_client_rows(state, client, header, pulled, result))
    if result.measured:
        rule = store.rule
        events.append(NoiseMeasured(state.progress, rule.noise.estimate, rule.step_batch, rule.gain,
                                    rule.noise.mean_norm))
    if store.version != version:
        events += _snapshot_due(state)
    return result, minibatches, events, header.fragment if piece is not None else -1


def _piece(state: ServerState, header: Push) -> tuple[slice | None, str]:
    """The slice of the weights a push is for (None: all of them), or why its fragment
    header is refused: an index outside the run's fragments, or an offset not that
    fragment's (its length is checked with the payload's)."""
    if header.fragment == -1:
        return None, ""
    count = len(state.pieces)
    if not 0 <= header.fragment < count:
        return None, f"fragment {header.fragment}, but this run's pushes come in {count or 'no'} fragments"
    lo, hi = state.pieces[header.fragment]
    if header.offset != lo:
        return None, f"fragment {header.fragment} at offset {header.offset}, expected {lo}"
    return slice(lo, hi), ""


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
