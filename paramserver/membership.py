"""Who trains in a running job, and what a client that joins it is given.

The server is the donor: a JOIN (paramserver/wire/protocol.py) is one message in, one
`Welcome` out, and a `Joined` event in the record, decided here without I/O and
dispatched by `handle()` (paramserver/handler.py) as a push is. A joiner gets a new
client number, never a lost client's, so every row of clients.jsonl stays once; the
server's per-client state grows for it (`grow`): the tallies, DyLU's speed (measured
from its first push; until then its window is n_push), the pace (keyed by rank, so it
starts untimed) and the rule's per-client state (DC-ASGD's backup is taken at its first
pull, as any client's).

Its data: a joiner takes over the shard of a client lost before it (`slot`), at the
minibatch of that shard's order the lost client had pushed up to (`position`), so the
samples of that shard are drawn once in the epoch however the client holding it
changed. Where no lost client's shard is free (the job grows beyond its K), the joiner
draws from the whole training set in an order of its own (clients/sampling.py's
`joiner_sampler`): its samples may then be drawn by another client in the same epoch.
Its share of the budget: under the run's budget (`budget = "run"`) it computes until
the server tells it to stop, as every client does; under each client's budget, what the
lost client whose shard it took had left of `steps`, or `steps` on a shard of its own.

A JOIN is refused, changing nothing but a `JoinRefused` row, when the run is not
joinable, the secret is wrong, the rank is a client already, the run has finished (a
stop target reached, the run's budget spent, or every client stopped), or
`max_clients` clients are running already.

Spare ranks (`--spares`, started with an MPI job, or the simulator's) wait to be
admitted: when a client is lost, server 0 hands the first spare still waiting the run's
secret (`admit`: an ADMIT), and that spare sends the JOIN any joiner sends. Only the
admitted learn the secret, so a JOIN from any other rank is refused as one with a wrong
secret. Its record names the client it stands in for (`Joined.spare_for`).
"""
from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paramserver.events import Joined, JoinRefused
from paramserver.wire.protocol import Admit, Join, Message, ProtocolError, Seated, Tag, well_formed

ServerState = Any  # paramserver/state.py's, which holds a Membership (an import back would be a circle)
GONE = -2  # a client a resume did not start stands on rank GONE - client, no process's (a joiner's frames say -1)


@dataclass
class Membership:
    """The run's door: its secret (None: not joinable), the bound on clients at once (0:
    none), a client's budget (`steps`; the run's under `budget = "run"`), and each client's
    shard: `seats[c]` is (slot, the position in its order where client c began). `spares`:
    the spare ranks not yet admitted, in the order they will be; `admitted`: each admitted
    spare's rank -> the lost client it stands in for, until its JOIN is let in."""

    secret: str | None = None
    max_clients: int = 0
    steps: int = 0
    seats: list[tuple[int, int]] = field(default_factory=list)
    joined: list[dict[str, Any]] = field(default_factory=list)  # the summary's joined_clients
    spares: list[int] = field(default_factory=list)
    admitted: dict[int, int] = field(default_factory=dict)

    def arrays(self) -> dict[str, np.ndarray]:
        """What a checkpoint holds of it: each client's seat, and the joins (JSON: hosts are text)."""
        return {"members.seats": np.array(self.seats, np.int64).reshape(-1, 2),
                "members.joined": np.array([json.dumps(entry) for entry in self.joined], dtype=str)}

    @classmethod
    def for_clients(cls, clients: int, steps: int, secret: str | None = None, max_clients: int = 0,
                    spares: list[int] = ()) -> Membership:
        return cls(secret, max_clients, steps, [(c, 0) for c in range(clients)], spares=list(spares))


def refusal(state: ServerState, msg: Message) -> JoinRefused | None:
    """Why this JOIN is refused (a `JoinRefused`), or None to let it in."""
    header = msg.header
    host = header.host if isinstance(header, Join) and isinstance(header.host, str) else "?"
    why = _problem(state, msg)
    return JoinRefused(msg.source, host, why) if why else None


def _problem(state: ServerState, msg: Message) -> str:
    members = state.members
    if not well_formed(Tag.JOIN, msg.header):
        return f"malformed join: header {type(msg.header).__name__}"
    if members.secret is None:
        return "the run is not joinable (start it with --joinable)"
    if not hmac.compare_digest(msg.header.secret.encode(), members.secret.encode()):
        return "wrong secret"
    if msg.source in state.client_ranks:
        return f"rank {msg.source} is a client of the run already"
    running = state.running
    if finished(state):
        return "the run has finished"
    if members.max_clients and len(running) >= members.max_clients:
        return f"the run is full ({len(running)} clients running, max_clients {members.max_clients})"
    return ""


def finished(state: ServerState) -> bool:
    """Whether the run is over for any joiner: a stop target reached, the run's budget
    spent, or every client stopped after its steps (a run whose clients all died is not)."""
    tally, running = state.tally, state.running
    return bool(state.stop() or (state.budget is not None and state.budget.spent(tally, -1, running))
                or (tally.stops and not running))


def admit(state: ServerState, client: int) -> tuple[int, Admit] | None:
    """The spare rank to admit in lost client `client`'s place, and what to tell it; None
    when no spare waits or no join would be let in (a spare kept for nothing costs less
    than one admitted to be refused)."""
    members = state.members
    if not members.spares or members.secret is None or finished(state):
        return None
    rank = members.spares.pop(0)
    members.admitted[rank] = client
    return rank, Admit(members.secret)


def spare_gone(state: ServerState, rank: int) -> int | None:
    """Spare rank `rank` died (or took no ADMIT): it is admitted no more; the lost client
    it was to stand in for, if it was admitted, for the next spare."""
    members = state.members
    if rank in members.spares:
        members.spares.remove(rank)
    return members.admitted.pop(rank, None)


def seat(state: ServerState, rank: int) -> tuple[int, int, int, int]:
    """Make rank `rank` a client: (its number, its steps, its slot, the position in it)."""
    slot, position = _free_slot(state)
    members = state.members
    client = grow(state, rank)
    members.seats.append((slot, position))
    return client, share_of(members.steps, position, state.budget is not None), slot, position


def ticket(state: ServerState, client: int) -> str:
    """What joiner `client` shows the doors of servers 1..S-1 (`Seated`): the run's secret
    keyed to its number, so it opens no door for another client and tells nothing of the
    secret; the same on every server 0 that holds the secret (a resume's too)."""
    return hmac.new(state.members.secret.encode(), f"client {client}".encode(), hashlib.sha256).hexdigest()[:32]


def follow_seat(state: ServerState, word: Seated) -> None:
    """A server > 0 of sharded servers grows by server 0's word, in its order: the same
    client number for the same rank, or the two disagree on who trains."""
    client = grow(state, word.rank)
    if client != word.client:
        raise ProtocolError(f"server 0 seated rank {word.rank} as client {word.client}; this server counts "
                            f"it client {client}")


def share_of(steps: int, position: int, run_budget: bool) -> int:
    """The most minibatches a client seated `position` minibatches into its shard's order
    may count to: the run's under its budget, else what the shard's order has left of `steps`."""
    return steps if run_budget else steps - position


def holders(seats: list[tuple[int, int]]) -> dict[int, int]:
    """Each shard's last holder: slot -> the client seated on it last."""
    return {slot: client for client, (slot, _) in enumerate(seats)}


def joined(state: ServerState, client: int, rank: int, host: str) -> Joined:
    """The record of a join (server.jsonl, and the summary's joined_clients)."""
    members = state.members
    event = Joined(client, rank, host, state.store.version, members.admitted.pop(rank, None))
    members.joined.append({"client": client, "rank": rank, "host": host, "version": event.version,
                           "slot": members.seats[client][0],
                           **({} if event.spare_for is None else {"spare_for": event.spare_for})})
    return event


def _free_slot(state: ServerState) -> tuple[int, int]:
    """The lowest shard whose last holder was lost with minibatches of it left, where that
    holder stood; else a slot of the joiner's own (its number)."""
    members, tally = state.members, state.tally
    holder = holders(members.seats)
    for slot in sorted(holder):
        client = holder[slot]
        position = members.seats[client][1] + int(tally.client_steps[client])
        if state.client_ranks[client] in tally.lost and (state.budget is not None or position < members.steps):
            return slot, position
    return len(state.client_ranks), 0


def lose(state: ServerState, rank: int, reason: str) -> dict[str, Any]:
    """The run goes on without client rank `rank` (`on_client_failure = "continue"`): its
    entry in the summary's lost_clients. Its number is never given again; its shard
    waits for a joiner where it stood (`_free_slot`)."""
    client = state.client(rank)
    entry = {"client": client, "rank": rank, "last_step": int(state.tally.client_steps[client]), "reason": reason}
    state.tally.lost[rank] = entry
    return entry


def grow(state: ServerState, rank: int) -> int:
    """The server's per-client state, one client more; its number."""
    state.client_ranks.append(rank)
    state.tally.grow()
    state.reply.grow()
    return len(state.client_ranks) - 1


def resumed(state: ServerState, arrays: dict[str, np.ndarray]) -> None:
    """The membership a resumed run goes on with, from its checkpoint's `arrays`. The job's
    client ranks, slot s on the s-th, run each slot's last holder from where it stood (a
    joiner's number, where one took a lost client's shard), so every shard goes on where it
    was left and every row stays once. A client that holds no slot of the job's is not
    started (a joiner on a shard of its own; one whose shard a joiner took): it is lost to
    the resumed run, its number never given again, and its shard waits for the next
    joiner where it stood (`_free_slot`). An older checkpoint holds no seats: the job's
    clients are all there is."""
    if "members.seats" not in arrays:
        return
    members, tally, jobs = state.members, state.tally, list(state.client_ranks)
    members.seats = [(int(slot), int(position)) for slot, position in arrays["members.seats"]]
    members.joined = [json.loads(entry) for entry in arrays["members.joined"]]
    holder = holders(members.seats)
    ranks = {holder[slot]: rank for slot, rank in enumerate(jobs)}
    for _ in range(len(jobs), len(members.seats)):
        state.reply.grow()
    state.client_ranks = [ranks.get(client, GONE - client) for client in range(len(members.seats))]
    for client, (slot, _) in enumerate(members.seats):
        if client not in ranks:
            why = f"client {holder[slot]} went on with its shard" if slot < len(jobs) \
                else "a joiner on a shard of its own, which waits for the next joiner"
            tally.lost[GONE - client] = {"client": client, "rank": None, "last_step": int(tally.client_steps[client]),
                                         "reason": f"not restarted by the resume: {why}"}
