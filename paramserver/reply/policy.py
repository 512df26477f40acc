"""When the server answers a client, and what the answer says of its next window: the
server's reply policy, the one object `handle()` (paramserver/handler.py) and both
drivers (the MPI loop's timed wait, the simulator's wake-up event) ask.

A push is answered at once, unless its rule gathers it into a step not yet taken
(`fresh`) and the policy defers the reply to that step (`ReplyMode.WAIT`, or `ReplyMode.AUTO`
where the clients' pace says the step comes before the sender could push again:
paramserver/reply/pace.py). The push that completes the step is answered with every
deferred one. When every client still running waits so, or is overdue (computing for
longer than the pace's bound: counted out as a lost client is), no push will complete the
step: it is taken with what was gathered (`release_due`, then the handler's `release`),
and `wake_at` tells a driver when that comes about if no message comes first. With DyLU
each reply carries the client's next window (paramserver/reply/dylu.py).

Under delayed Nesterov (`--rule nesterov`, asynchronous DiLoCo) the policy may hold a
round's early pushers until its momentum step (`nesterov_reply`: `round`; `auto`, held
where the pace says the round's other pushes come before this client could push again,
as `fresh`'s `auto` waits; `now`, answered at once, Algorithm 3 of Liu et al. 2024 as
written). Answered at once, the first N - 1 pushers of a round pull weights without the
round's momentum step and run their next round from a point that step leaves behind: a
round stale against a momentum that amplifies each round's change by up to
eps / (1 - beta) (docs/rules.md measures it). Held, every client of a round at equal
speeds pulls the weights after the step: with N = K the run is synchronous DiLoCo. A
client is held only while the round can still complete; once it cannot (a client
stopped, failed or was lost), or under `auto` once the pace no longer expects it before
they could push again (a failed client pulled to start its window afresh), the held
clients are answered with the weights as they are (`stranded`).

The policy keeps its own state (who waits, the pace's timings, DyLU's speeds); it reads
of the server only what `Served` names: the store's version, what each client pulled and
the rule's gather (`Rule.remaining`, `Rule.drops`) or round (`Rule.round_left`).

With sharded servers server 0's policy decides for the run: each server would time the
clients apart and answer one differently, and a client waits for its slowest reply. So
server 0's policy keeps its answers (`said`), which its loop tells the other servers with
each message it handled (`Decided`, paramserver/wire/protocol.py), and theirs answers each
question with server 0's answer to it (`told`): they handle every client message in server
0's order (paramserver/drivers/follow.py), so they ask the same questions in the same order.
"""
from __future__ import annotations

import time
from collections import deque
from enum import Enum
from typing import Callable, Iterable, Protocol

from paramserver.reply.dylu import Windows
from paramserver.reply.pace import Pace


class ReplyMode(str, Enum):
    """`fresh_reply`: what a client whose push joins a step being gathered is answered."""

    WAIT = "wait"    # the weights after the step
    AGAIN = "again"  # the weights now, to compute again there (every non-gathering rule's)
    AUTO = "auto"    # wait or again by the clients' pace


class Gather(Protocol):
    """What the policy reads of a rule (paramserver/rules/base.py)."""

    clients: int     # the clients the run started with, for whom a step's size was set
    remaining: int   # the minibatches the step being gathered still needs
    round_left: int  # the pushes the open round still needs (0: none open)

    def drops(self, staleness: int) -> str: ...


class Weights(Protocol):
    """What the policy reads of the Store (paramserver/store.py)."""

    rule: Gather
    version: int
    pulled: dict[int, int]  # client -> the version it last pulled


class Served(Protocol):
    """What the policy reads of paramserver/state.py's `ServerState`."""

    store: Weights
    waiting: list[int]  # client ranks still running
    present: int        # clients not lost (running or stopped)

    def client(self, rank: int) -> int: ...


def check_keys(settings) -> str:
    """Why the policy's keys are out of range (a ConfigError line), or ""."""
    modes = [m.value for m in ReplyMode]
    if settings.fresh_reply not in modes:
        return f"fresh_reply: expected {' or '.join(modes)}, got {settings.fresh_reply!r}"
    if settings.nesterov_reply not in ROUNDS:
        return f"nesterov_reply: expected {', '.join(ROUNDS)}, got {settings.nesterov_reply!r}"
    if settings.overdue != 0 and settings.overdue < 1:
        return f"overdue: must be 0 (off) or a factor of at least 1 of a client's mean compute time, got {settings.overdue}"
    return ""


ROUNDS = {"now": ReplyMode.AGAIN, "round": ReplyMode.WAIT, "auto": ReplyMode.AUTO}  # nesterov_reply's words


class ReplyPolicy:
    def __init__(self, mode: ReplyMode = ReplyMode.AGAIN, clock: Callable[[], float] = time.monotonic,
                 overdue: float = 0.0, windows: Windows | None = None, rounds: ReplyMode = ReplyMode.AGAIN):
        self.mode, self.rounds = mode, rounds  # a gathered push's reply; a round's early pushers'
        self.pace = Pace(clock, overdue=overdue) if ReplyMode.AUTO in (mode, rounds) else None
        self.windows = windows
        self.clock = clock
        self.deferred: list[int] = []  # client ranks whose replies wait for a step
        self.said: list[bool] | None = None   # server 0 of sharded servers: its answers, for the others
        self.told: deque[bool] | None = None  # a server > 0: server 0's answers, in the order it gave them

    def leads(self) -> None:
        """Server 0 of sharded servers: keep each answer for the other servers."""
        self.said = []

    def follows(self) -> None:
        """A server > 0: answer with server 0's word, and time no client (`wake_at`: never)."""
        self.told, self.pace = deque(), None

    def hear(self, said: Iterable[bool]) -> None:
        """Server 0's answers for the next message (those left of the last are void: a
        slice this server refused asked fewer questions)."""
        self.told = deque(said)

    def spoken(self) -> tuple[bool, ...]:
        """Server 0's answers since the last call, to tell the other servers."""
        said, self.said = tuple(self.said), []
        return said

    def _decide(self, decide: Callable[[], bool]) -> bool:
        """An answer: server 0's where this server follows it (none left: at once, never a
        wait on a word that does not come), else this one's, kept where others follow."""
        if self.told is not None:
            return bool(self.told) and self.told.popleft()
        answer = decide()
        if self.said is not None:
            self.said.append(answer)
        return answer

    @classmethod
    def for_run(cls, settings, rule, clients: int, clock: Callable[[], float] = time.monotonic) -> ReplyPolicy:
        """The run's policy: `fresh_reply` where the rule gathers, `nesterov_reply` where it
        steps by rounds, and DyLU's windows where `dylu` is on (`settings`: the server state's,
        paramserver/state.py, or a config: its keys by those names)."""
        mode = ReplyMode(settings.fresh_reply) if rule.gathers else ReplyMode.AGAIN
        rounds = ROUNDS[settings.nesterov_reply] if rule.rounds else ReplyMode.AGAIN
        return cls(mode, clock, settings.overdue, Windows.for_run(settings, clients), rounds)

    def grow(self) -> None:
        """One client more (a joiner): DyLU measures its speed from its first push; the
        pace, keyed by rank, times it from its first reply."""
        if self.windows is not None:
            self.windows.grow()

    def pushed(self, rank: int, client: int, minibatches: int) -> None:
        """A push of `minibatches` minibatches came in: the client's pace and speed."""
        if self.pace is not None:
            self.pace.pushed(rank)
        if self.windows is not None:
            self.windows.pushed(client, minibatches, self.clock())

    def replied(self, rank: int, client: int, running: list[int]) -> int:
        """Weights go to `rank` now: its next window (0: n_push), from the speeds of the
        clients still `running` (their numbers)."""
        if self.pace is not None:
            self.pace.replied(rank)
        return self.windows.reply(client, self.clock(), running) if self.windows else 0

    def waits(self, served: Served, rank: int, minibatches: int) -> bool:
        """Whether the sender of a push the rule gathered (of `minibatches` minibatches) waits
        for the step (the handler then defers it until `answered`)."""
        return self._decide(lambda: self.mode is ReplyMode.WAIT or (
            self.mode is ReplyMode.AUTO and self._paced_wait(served, rank, minibatches)))

    def holds(self, served: Served, rank: int) -> bool:
        """Whether `rank`, whose push into a round was just applied, waits for the round's
        momentum step: not when the round was just closed or can no longer complete
        without it; under `auto`, only where the pace says it completes before `rank`
        could push again."""
        if self.rounds is ReplyMode.AGAIN:
            return False
        return self._decide(lambda: not self._stranded(served, rank) and (self.rounds is ReplyMode.WAIT or self.pace.waits(
            rank, served.store.rule.round_left, [r for r in served.waiting if r not in self.deferred and r != rank])))

    def stranded(self, served: Served) -> bool:
        """Whether clients are held for a round that can no longer complete, or (`auto`)
        that the pace no longer expects before they could push again."""
        return self.rounds is not ReplyMode.AGAIN and bool(self.deferred) and self._decide(
            lambda: self._stranded(served) or self._overtaken(served))

    def _overtaken(self, served: Served) -> bool:
        """Under `auto`, a held client would now push again before the round completes: the
        pace learned since it held them that a push the round waits for is a whole window
        away (a failed client pulled to start its window afresh; the pace took it, past its
        expected push, as pushing at once). Answered, they go on as `now` would have them."""
        if self.rounds is not ReplyMode.AUTO:
            return False
        computing = [r for r in served.waiting if r not in self.deferred]
        return not all(self.pace.waits(r, served.store.rule.round_left, computing) for r in self.deferred)

    def _stranded(self, served: Served, rank: int | None = None) -> bool:
        """Nothing to hold for: the round was just closed, or it needs more pushes than the
        clients still computing (all running but those held and `rank`) can bring, one each."""
        left = served.store.rule.round_left
        computing = [r for r in served.waiting if r not in self.deferred and r != rank]
        return left == 0 or len(computing) < left

    def _paced_wait(self, served: Served, rank: int, minibatches: int) -> bool:
        """By the pace: wait unless the other clients still computing at weights the step
        would take cannot complete it before this one could push again. The step goes
        without those counted out, and without the push of each of the run's K clients
        lost and not replaced: its size was set for K (a push of every client, by
        default), and had the others computed again for a lost one's share, the first of
        their second pushes would take the step and the rest, a step late, be dropped
        (measured over MPI under churn: 16 % of the pushes)."""
        store = served.store
        out = self._counted_out(served, rank)
        computing = [r for r in served.waiting if r != rank and r not in self.deferred and r not in out
                     and not store.rule.drops(store.version - store.pulled.get(served.client(r), 0))]
        missing = max(0, store.rule.clients - served.present)
        needed = -(-store.rule.remaining // minibatches) - len(out) - missing
        return needed <= 0 or self.pace.waits(rank, needed, computing)

    def answered(self) -> list[int]:
        """The deferred ranks, answered now (a step was taken)."""
        ranks, self.deferred = self.deferred, []
        return ranks

    def _counted_out(self, served: Served, rank: int | None = None) -> list[int]:
        """The clients still computing (but `rank`, whose push is being handled) that the
        pace counts out as overdue."""
        if self.pace is None:
            return []
        return self.pace.counted_out([r for r in served.waiting if r not in self.deferred and r != rank])

    def release_due(self, served: Served, overdue: bool = False) -> bool:
        """Whether every client still running waits for a step being gathered (or, with
        `overdue`, is overdue): then no push will complete it, and the handler's `release`
        takes it (a driver finishes replies in flight first: the step changes the weights
        they may be reading). Overdue clients count only when a driver woke for them
        (`wake_at`), idle and with no message waiting: while messages queue at a busy
        server, an overdue client's push may be among them (measured: a server-bound
        simulation dropped one)."""
        if not self.deferred:
            return False
        out = self._counted_out(served) if overdue else []
        return self._decide(lambda: all(rank in self.deferred or rank in out for rank in served.waiting))

    def wake_at(self, served: Served) -> float | None:
        """When `release_due` comes true if no message comes first (None: only a message
        can make it so): a driver acts then, with the clients it waits for overdue."""
        if self.pace is None or not self.deferred:
            return None
        return self.pace.wake_at([r for r in served.waiting if r not in self.deferred])

    def state(self) -> dict:
        """What a checkpoint holds of the policy: DyLU's speeds (the pace is measured afresh)."""
        return self.windows.state() if self.windows else {}

    def load_state(self, arrays: dict) -> None:
        if self.windows is not None:
            self.windows.load_state(arrays)
