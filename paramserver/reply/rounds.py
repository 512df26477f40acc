"""Whether a client that pushed into a round of delayed Nesterov (`--rule nesterov`) waits
for the round's momentum step before it is answered (`nesterov_reply = "round"`), or is
answered at once (`now`, the rule's paper: Liu et al. 2024, Algorithm 3), or either
(`auto`): held where the clients' measured pace (paramserver/reply/pace.py, as `fresh`'s
`auto` reply) says the round's other pushes come before this client could push again
(equal speeds), answered at once where it could push first (a straggler keeps the round
open); with several servers `auto` holds as `round` does (timing would differ between
the servers' slices).

Answered at once, the first N - 1 pushers of a round pull weights that hold their own
share of the round (eps d / N each) but neither the rest of it nor the momentum's
look-ahead, which comes only at the N-th push: at equal speeds with N = K, K - 1 of the
K clients run every round from a point the momentum step then leaves behind, and their
next changes, applied on top of it, are a round stale against a momentum that amplifies
each round's change by up to eps / (1 - beta) (7 at the published 0.7, 0.9). Measured
on examples/char_lm.py, 4 clients, H = 16 (docs/rules.md): validation loss 3.18 against
synchronous DiLoCo's 2.80 at the published step, 2.79 held (the issue that found it:
1.785 against 0.438 on a held-back LM, while one client, or momentum 0, agreed).

Held, every client of a round at equal speeds pulls the same weights after the
round's momentum step: with N = K the run is synchronous DiLoCo (the Nesterov step on
the clients' mean change), as the sync mode's outer step (clients/outer.py) computes
it but for float32's order of additions (tests/sim/test_diloco.py). A client is held
only while the round can still complete: when fewer clients are still computing than
the round needs pushes (a client stopped, failed or was lost, or the run's budget ends
it), the held clients are answered with the weights as they are and the round goes on
with the pushes that come.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from runconfig.settings import RunConfig
from paramserver.reply.pace import Pace
from paramserver.store import Store


class ServerState(Protocol):
    """What the policy reads of paramserver/handler.py's `ServerState`."""

    store: Store
    pace: Pace | None    # under `auto`, the clients' pace (paramserver/reply/pace.py)
    deferred: list[int]  # client ranks whose replies wait

    @property
    def waiting(self) -> list[int]: ...  # client ranks still running


@dataclass(frozen=True)
class Rounds:
    """The `round` policy over the nesterov rule's count of the round's pushes."""

    @classmethod
    def for_run(cls, cfg: RunConfig) -> Rounds | None:
        """The policy where the run may hold replies for the round (None: answered at once)."""
        return cls() if cfg.mode == "async" and cfg.rule == "nesterov" and cfg.nesterov_reply != "now" else None

    def holds(self, state: ServerState, rank: int) -> bool:
        """Whether `rank`, whose push was just applied, waits for its round's momentum
        step: not when its push was the round's N-th (the step is taken), nor when the
        round can no longer complete without it; under `auto` (the rule's `paced`), only
        when the clients' pace says the round completes before `rank` could push again."""
        if self.stranded(state, rank):
            return False
        if state.pace is None:
            return True
        rule = state.store.rule
        computing = [r for r in state.waiting if r not in state.deferred and r != rank]
        return state.pace.waits(rank, rule.every - rule.count, computing)

    def stranded(self, state: ServerState, rank: int | None = None) -> bool:
        """Whether nothing is left to hold for: the round was just closed, or it needs
        more pushes than the clients still computing (all running but those held and
        `rank`, which would be) can bring, one each."""
        rule = state.store.rule
        computing = [r for r in state.waiting if r not in state.deferred and r != rank]
        return rule.count == 0 or len(computing) < rule.every - rule.count
