"""The server's loop over a `Link`: take messages, `handle()` them, send the replies.

`serve()` answers clients in the order their messages arrive (no round robin), hands
each message to the pure `handle()` and its events to the `Recorder`, and returns when
every client has sent STOP. Replies go out without waiting (the transfer completes
while the next message is taken); those that read the live weights in place are
finished before the next push is handled, the copies whenever their clients take them.
A push may be answered later, with others, when the step it joined is taken (`fresh`,
paramserver/handler.py).

With sharded servers server 0 decides when each client is answered and tells the others
after each message (`Decided`); they handle the clients' messages in its order with its
answers (`follow`, paramserver/drivers/follow.py).

A client that fails (it reports an exception), stalls (silent past the stall timeout)
or dies (`PeerWatch`) is lost: by default that ends the job, naming it; with
`on_client_failure = "continue"` the server records it and goes on with the others,
and admits a spare rank in its place where one waits (ADMIT; paramserver/membership.py).
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from paramserver import membership
from paramserver.events import Applied, Joined, JoinRefused
from paramserver.drivers.follow import IN_TURN, Follow
from paramserver.drivers.tickets import Tickets
from paramserver.handler import ClientLost, handle, release, tag_name
from paramserver.state import ServerState
from paramserver.tally import ServerTally
from paramserver.recorder import Recorder
from paramserver.wire.liveness import PeerDied
from paramserver.wire.protocol import Decided, Link, Message, PeerTimeout, Reply, Seated, Tag, Welcome


PHASES = ("receive", "check", "apply", "reply", "record")  # wall time, each push


@dataclass
class PushCost:
    """The server's own time on each push inside the job, by phase, over the last KEEP
    pushes: taking it off the wire once it is there (`receive`), the checks and decoding
    around the rule (`check`), the rule's apply (`apply`), finishing the replies before
    it and posting its own (`reply`), the log rows and snapshots (`record`), all wall
    time; and the CPU the server's thread spent on it, all phases (`cpu`: on a machine
    whose clients share the server's cores, the wall phases include the waits for a
    core, the CPU does not). Waiting for a message is in neither."""

    KEEP = 4096
    seconds: dict[str, deque] = field(default_factory=lambda: {p: deque(maxlen=PushCost.KEEP)
                                                               for p in (*PHASES, "cpu")})

    def add(self, **phases: float) -> None:
        for phase, value in phases.items():
            self.seconds[phase].append(value)

    def medians_us(self) -> dict[str, float]:
        """Each phase's median and their sum (`total`), and the CPU's median, in
        microseconds ({} before any push)."""
        if not self.seconds["apply"]:
            return {}
        medians = {p: round(1e6 * statistics.median(v), 1) for p, v in self.seconds.items()}
        return {**{p: medians[p] for p in PHASES}, "total": round(sum(medians[p] for p in PHASES), 1),
                "cpu": medians["cpu"]}


class ClientStalled(ClientLost):
    """A client has sent nothing for longer than the stall timeout."""


class ClientDied(ClientLost):
    """A client's process is gone."""


@dataclass
class ServerLoop:
    """One server rank's message loop: what it waits for, what it has in flight.

    `recorder` is None on servers 1..S-1 of sharded servers: server 0 records the run.
    `hosts`: rank -> host, to name a lost client. `spin`: after each message, poll closely
    for the next one and for the replies in flight (a core of its own: least latency);
    without, go straight to the transport's sleeping polls, where the server shares its
    host's cores with clients whose compute that spinning took (measured: 2 clients on 2
    cores, the proxy CNN, 305 steps: the server's CPU while serving 1.26-1.36 s with it,
    1.03-1.10 s without; the clients' samples/s without over with 1.00-1.10, median 1.04,
    in 6 pairs, 0.93-1.04, median 1.01, in 5 of 155 steps; the replies still move, at
    each poll).
    """

    link: Link
    state: ServerState
    recorder: Recorder | None
    clock: Callable[[], float]
    stall_timeout: float
    on_client_failure: str = "abort"
    hosts: dict[int, str] = field(default_factory=dict)
    busy_s: float = 0.0  # wall time spent handling messages (the rest is waiting for them)
    cost: PushCost = field(default_factory=PushCost)
    spin: bool = True
    followers: tuple[int, ...] = ()  # server 0 of sharded servers: the other servers, which follow its decisions
    follow: Follow | None = None     # a server > 0: server 0's decisions and the messages they wait for

    def __post_init__(self) -> None:
        if self.followers:
            self.state.reply.leads()
        if self.follow is not None:
            self.state.reply.follows()
        # a server > 0 with a door: the joiners from outside the job that server 0 let in
        self.tickets = Tickets(self.link, self.stall_timeout) if self.follow and hasattr(self.link, "admit") else None
        self.excused = 0.0  # seconds the server spent waiting on one client: no other's silence (`_excuse`)
        self.lost_at = -math.inf  # when the last client was lost (`_awaits_joiner`)
        self.heard = {r: (self._now(), "none") for r in self.state.client_ranks}  # rank -> (when, last tag)
        self.in_flight: list[tuple[int, list, int]] = []  # replies under way: (rank, requests, bytes)

    def serve(self) -> ServerTally:
        """Handle messages until every client has stopped or is lost."""
        while not self.state.done or self._awaits_joiner():
            if self.follow is not None:
                self._guarded(self._follow_one)
                continue
            msg, woken = self._guarded(self._serve_one) or (None, False)
            said = self.state.reply.spoken() if self.followers else ()
            if self.state.reply.release_due(self.state, overdue=woken):  # a lost (or, woken, an overdue) client's push was awaited
                self._release(overdue=woken)
            self._tell(msg, said)
        self.finish_replies()
        return self.state.tally

    def _guarded(self, act: Callable[[], Any]) -> Any:
        """`act()`, or None where it lost a client (which ends the job, or the run goes on)."""
        try:
            return act()
        except ClientLost as lost:
            if lost.named:
                raise
            self._lose(lost)
            return None

    def _tell(self, msg: Message | None, said: tuple[bool, ...]) -> None:
        """Server 0 of sharded servers: tell the others whose message it handled (`msg`; None:
        none, woken), what its reply policy answered while handling it (`said`) and then, looking
        for a step to let go (paramserver/drivers/follow.py)."""
        if not self.followers:
            return
        then = self.state.reply.spoken()
        turn = msg is not None and msg.tag in IN_TURN and msg.source in self.state.client_ranks
        if not turn and not any(then):  # nothing the others must do
            return
        word = Decided(msg.source if turn else -1, said if turn else (), then)
        for server in self.followers:
            self.link.send(server, Tag.DECIDED, word, timeout=self.stall_timeout)

    def _follow_one(self) -> None:
        """A server > 0: take the next message, then handle those whose turn server 0 named,
        with its answers, and let go the steps it let go."""
        msg = self._next_message()
        self.heard[msg.source] = (self._now(), tag_name(msg.tag))
        if msg.tag == Tag.JOIN and self.tickets is not None:  # a joiner server 0 let in, at this server's door
            self.tickets.knock(msg, self._now())
        elif not self.follow.take(msg):
            self.answer(msg)
        for word, turn in self.follow.ready(self.state.tally.lost):
            if word is None:  # server 0 reads this slice, at the version of the words before
                self.answer(turn)
                continue
            if isinstance(word, Seated):
                self.seat(word)
                continue
            if turn is not None:
                self.state.reply.hear(word.said)
                self._guarded(lambda: self.answer(turn))
            self.state.reply.hear(word.then)
            if self.state.reply.release_due(self.state):
                self._release()

    def seat(self, word: Seated) -> None:
        """A server > 0: a joiner server 0 let in is a client here too, from this point of its order."""
        membership.follow_seat(self.state, word)
        self.heard[word.rank] = (self._now(), "JOIN")
        if self.tickets is not None:
            self.tickets.seated(word, self._now())

    def answer(self, msg: Message) -> None:
        """Handle one message, start sending the replies, then record what happened: the
        log rows are written while the weights are on their way, not before. A push's
        phases are timed (`cost`)."""
        start, start_cpu = time.perf_counter(), time.thread_time()
        if msg.tag == Tag.PUSH or (msg.tag == Tag.STOP and self.state.reply.deferred):
            self.finish_replies(live=True)  # the apply, or a step a STOP releases, changes the weights they may read
        finished = time.perf_counter()
        replies, events = handle(self.state, msg)
        handled = time.perf_counter()
        posted = self._post_and_record(replies, events)
        if msg.tag == Tag.PUSH:
            apply = sum(e.apply_s for e in events if isinstance(e, Applied))
            self.cost.add(receive=getattr(self.link, "receive_s", 0.0), check=handled - finished - apply,
                          apply=apply, reply=finished - start + posted - handled,
                          record=time.perf_counter() - posted,
                          cpu=getattr(self.link, "receive_cpu_s", 0.0) + time.thread_time() - start_cpu)

    def _release(self, overdue: bool = False) -> None:
        self.finish_replies()
        self._post_and_record(*release(self.state, overdue))

    def _post_and_record(self, replies: list[Reply], events: list) -> float:
        """Post the replies, then record the events; returns when the replies were posted."""
        for reply in replies:
            self._post(reply)
        posted = time.perf_counter()
        self._at_door(events)
        if self.recorder is not None:
            self.recorder.record(events)
        return posted

    def _at_door(self, events: list) -> None:
        """A joiner at server 0's door (paramserver/wire/door.py, a link that can `refuse`)
        is told why it was refused, and any joiner is named by its host from its JOIN on."""
        for event in events:
            if isinstance(event, JoinRefused) and hasattr(self.link, "refuse"):
                self.link.refuse(event.rank, event.reason)
            elif isinstance(event, Joined):
                self.hosts.setdefault(event.rank, event.host)

    def _serve_one(self) -> tuple[Message | None, bool]:
        """Handles the next message: it, and True when there was none but a wake-up instead."""
        msg = self._next_message()
        if msg is None:  # woken: the clients a gathered step waits for are overdue
            return None, True
        self.heard[msg.source] = (self._now(), tag_name(msg.tag))
        start = time.perf_counter()
        self.answer(msg)
        self.busy_s += time.perf_counter() - start
        return msg, False

    def _awaits_joiner(self) -> bool:
        """Every client is lost but the run has not finished, and a door is open (a link
        that can `refuse`: paramserver/wire/door.py): the run waits for a joiner, as long
        as a client may be silent (the stall timeout) from the last loss."""
        return (self.follow is None and hasattr(self.link, "refuse") and not membership.finished(self.state)
                and self._now() < self.lost_at + self.stall_timeout)

    def _next_message(self) -> Message | None:
        """Waits no longer than the first waiting client's stall deadline, and checks it
        even while other clients keep the server busy; None at `wake_at`, when a step
        being gathered goes without the clients it waits for (the caller releases it),
        or when no client runs and no joiner came in time (`_awaits_joiner`)."""
        while True:
            waiting = self.state.waiting
            if not waiting:
                try:
                    return self.link.recv(timeout=max(0.0, self.lost_at + self.stall_timeout - self._now()),
                                          into=self.state.landing)
                except (PeerTimeout, PeerDied):
                    return None
            first = min(waiting, key=lambda r: self.heard[r][0])
            now = self.clock()  # the pace's clock; silence is measured by _now()
            left = self.heard[first][0] + self.stall_timeout - self._now()
            if left <= 0:
                raise self._silent(first)
            wake = self.state.reply.wake_at(self.state)
            due = wake is not None and wake <= now  # a message that came meanwhile is taken first
            left = 0.0 if due else left if wake is None else min(left, wake - now)
            # Replies in flight move only while we call into MPI: poll closely while they should.
            in_flight = sum(nbytes for _, _, nbytes in self.in_flight)
            busy = 1e-3 + in_flight / 1e9 if self.spin else 0.0
            start = self.clock()
            try:
                return self.link.recv(timeout=left, busy=busy, into=self.state.landing)
            except PeerTimeout as timeout:
                if timeout.peers:  # it stopped sending halfway through a message
                    stalled = self._stalled(timeout.peers[0])
                    self._excuse(self.clock() - start)
                    raise stalled from None
                if due:
                    return None
            except PeerDied as died:
                clients = [r for r in died.ranks if r in waiting]
                if clients:
                    raise ClientDied(clients[0], str(died)) from None
                self._spares_died(died.ranks)

    def _post(self, reply: Reply) -> None:
        """Start sending and go on serving: the transfer completes while we take the next
        message (waiting for it here would leave the server idle until the client is
        scheduled, half its time on a crowded machine)."""
        header = reply.header
        if isinstance(header, Welcome):  # a joiner's place first, pickled on JOIN's tag; then weights as a pull's
            self.in_flight.append((reply.dest, self.link.post(reply.dest, Tag.JOIN, header), 0))
            if self.followers:  # the others grow by server 0's word, and the joiner pulls from every server
                for server in self.followers:
                    self.link.send(server, Tag.DECIDED, Seated(reply.dest, header.client, header.ticket),
                                   timeout=self.stall_timeout)
                return
            header = header.weights
        requests = self.link.post(reply.dest, Tag.WEIGHTS, header, reply.payload)
        self.in_flight.append((reply.dest, requests, reply.payload.nbytes))

    def finish_replies(self, live: bool = False) -> None:
        """Finish every reply in flight, or (`live`: the weights are about to change) those
        that read the weights in place; a copy (`Posted.live` false: a streamed fragment's
        answer, which its client takes only at its next fragment boundary) goes on without
        holding up the applies, and is forgotten once out. A client that does not take its
        reply within the stall timeout, or died, is lost (and the others' replies still
        finish). The time spent here is excused (`_excuse`): whatever the others sent
        meanwhile waits for the server, and their replies wait behind the one it finishes.
        (A reply to a host whose link was cut held the server for the whole stall timeout;
        every other client was then written off as silent at once, and a `continue` run
        ended with none.)"""
        replies, self.in_flight = self.in_flight, []
        if live:  # a link that does not say its post copied (`live`) is taken to read in place
            lost = self.state.tally.lost
            copies = [r for r in replies if not getattr(r[1], "live", True)]
            self.in_flight = [r for r in copies if r[0] not in lost and not self.link.done(r[1])]
            replies = [r for r in replies if getattr(r[1], "live", True)]
        start = self.clock()
        for rank, requests, nbytes in replies:
            if rank in self.state.tally.lost:
                continue
            try:
                self.link.complete(requests, [rank], nbytes, self.stall_timeout)
            except PeerTimeout:
                self._lose(self._stalled(rank))
            except PeerDied as died:
                self._lose(ClientDied(rank, str(died)))
        self._excuse(self.clock() - start)

    def _excuse(self, waited: float) -> None:
        """Time the server spent waiting on one client does not count as the others' silence."""
        self.excused += waited

    def _now(self) -> float:
        """The clock the clients' silence is measured by: it stops while the server waits on one."""
        return self.clock() - self.excused

    def _silent(self, rank: int) -> Exception:
        """Why `rank` is silent: stalled, or, on a follower holding its message, server 0
        has not said what to do with it (which ends the job: every client waits on it)."""
        held = self.follow.held_since(rank) if self.follow is not None else None
        if held is None:
            return self._stalled(rank)
        return PeerTimeout(f"server 0 (rank 0) silent for {self.clock() - held:.0f} s: it has not named "
                           f"the message of client rank {rank} (stall timeout {self.stall_timeout:g} s)", (0,))

    def _stalled(self, rank: int) -> ClientStalled:
        return ClientStalled(rank, f"silent for {self._now() - self.heard[rank][0]:.0f} s "
                                   f"(stall timeout {self.stall_timeout:g} s)")

    def _lose(self, lost: ClientLost) -> None:
        """Name the client in the log; end the job, or (continue) go on without it."""
        tally = self.state.tally
        if lost.rank in tally.lost:  # a late word of a client already written off
            return
        client = self.state.client(lost.rank)
        step = int(tally.client_steps[client])
        what = (f"client {client} (rank {lost.rank}, host {self.hosts.get(lost.rank, '?')}) lost: {lost}; "
                f"last step {step}, last message {self.heard[lost.rank][1]}")
        if self.recorder is not None:
            self.recorder.membership({"client": client, "rank": lost.rank, "lost": what, "kind": type(lost).__name__})
        if self.on_client_failure != "continue":
            raise type(lost)(lost.rank, what, named=True)
        membership.lose(self.state, lost.rank, f"{type(lost).__name__}: {lost}")
        self.lost_at = self._now()
        print(f"asgd: {what}; continuing with {len(self.state.waiting)} client(s)", file=sys.stderr, flush=True)
        self._admit(client)

    def _admit(self, client: int) -> None:
        """ADMIT to the first spare rank still waiting, to stand in for lost client `client`;
        a spare that cannot take it is gone, and the next one is asked."""
        while (admitted := membership.admit(self.state, client)) is not None:
            rank, header = admitted
            try:
                self.link.send(rank, Tag.ADMIT, header, timeout=self.stall_timeout)
                return
            except (PeerTimeout, PeerDied):
                membership.spare_gone(self.state, rank)

    def _spares_died(self, ranks: list[int]) -> None:
        """Spare ranks that died are admitted no more; one admitted but not yet joined
        hands its lost client to the next spare."""
        for rank in ranks:
            client = membership.spare_gone(self.state, rank)
            if client is not None:
                self._admit(client)

