"""What the server counts as it serves, for the summary and a checkpoint: minibatches,
samples, rejections, each client's last step and pushes, the clients that stopped or
were lost. Apart from the handler (paramserver/handler.py), which updates it, so a
checkpoint and a summary read it without the handler's machinery. And the run's budget
(`budget = "run"`), which the server spends by these counts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from paramserver.wire.protocol import Stop
from rundir.checkpoint import Checkpoint


@dataclass
class ServerTally:
    """What the summary and a checkpoint need from the serving loop."""

    clients: int
    minibatches: int = 0
    samples: int = 0
    rejected: int = 0
    stops: dict[int, Stop] = field(default_factory=dict)
    lost: dict[int, dict] = field(default_factory=dict)  # rank -> what the summary says of it

    def __post_init__(self) -> None:
        self.client_steps = np.zeros(self.clients, np.int64)   # step of each client's last push handled
        self.client_pushes = np.zeros(self.clients, np.int64)  # pushes handled, per client
        self.steps = 0  # client_steps' sum, kept as it changes: the lr schedule reads it on every push

    def grow(self) -> None:
        """One client more (a joiner: paramserver/membership.py), with nothing counted yet."""
        self.clients += 1
        self.client_steps = np.append(self.client_steps, 0)
        self.client_pushes = np.append(self.client_pushes, 0)

    def stepped(self, client: int, step: int) -> None:
        """`client`'s last push handled came at `step`."""
        self.steps += step - int(self.client_steps[client])
        self.client_steps[client] = step

    def wire_bytes(self) -> dict[str, int]:
        """The push and weights frames' bytes (headers, payloads, rows) the clients put on
        the wire, as each said in its STOP: every server's, which server 0 alone could not
        see; a lost client never said (so a run with one lost counts less)."""
        return {"bytes_pushed": sum(stop.pushed_bytes for stop in self.stops.values()),
                "bytes_pulled": sum(stop.pulled_bytes for stop in self.stops.values())}

    def client_busy(self) -> dict[str, float]:
        """The clients' computing share: their minibatches' seconds over the spans from
        each one's first minibatch to its last, as each said in its STOP (so a lost
        client's are missing, and a resumed run counts from its resume)."""
        span = sum(stop.span_s for stop in self.stops.values())
        return {"client_busy": sum(stop.computed_s for stop in self.stops.values()) / span} if span > 0 else {}

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> "ServerTally":
        tally = cls(len(checkpoint.client_steps), *checkpoint.counts)
        tally.client_steps[:] = checkpoint.client_steps
        tally.steps = int(tally.client_steps.sum())
        tally.client_pushes[:] = checkpoint.client_pushes
        return tally


@dataclass
class RunBudget:
    """The run's budget in minibatches (`budget = "run"`): a reply tells its client to stop
    once what the clients have pushed, plus what the others were told to run and have not
    pushed yet, makes the budget. Counting the windows under way, not only those in, is
    what makes the budget exact: at equal speeds each client runs `steps` (its own budget's
    count) instead of every client but the last running one window more. A lost client's
    window is not counted (it will not come); one that comes back is told afresh. A
    streamed-fragments client (`ahead`: n_push / P) computes on while its reply comes, so
    it runs that much past its push before it reads the reply, whatever the reply says."""

    total: int
    window: int  # the minibatches a reply that says go holds its client to: n_fetch (DyLU: the reply's)
    due: dict[int, int] = field(default_factory=dict)  # client -> the step its running window ends at
    ahead: int = 0  # the minibatches a client runs past its push before it reads the reply

    def spent(self, tally: ServerTally, client: int, running: list[int]) -> bool:
        """Whether `client` must stop: the run's minibatches are in or under way elsewhere
        (`running`: the clients still sending)."""
        owed = sum(max(0, self.due.get(c, 0) - int(tally.client_steps[c])) for c in running if c != client)
        return tally.steps + self.ahead + owed >= self.total

    def went(self, tally: ServerTally, client: int, window: int) -> None:
        """`client` was told to run `window` minibatches (0: n_fetch) from its last step."""
        self.due[client] = int(tally.client_steps[client]) + self.ahead + (window or self.window)
