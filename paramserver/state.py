"""Everything the server's `handle()` reads and changes (paramserver/handler.py), in one
object: the Store, the tallies, the reply policy, the wire's codecs and buffers, who may
join, and what a checkpoint must wait for. Apart from the handler so the drivers, the
recorder and the tests name what they hold without the handler's decisions. What it is
made from is `StateSettings`, taken from the run's config once per run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from paramserver.compute.arrays import ServerArrays
from paramserver.compute.quantkernel import make_codec
from paramserver.membership import Membership, resumed
from paramserver.reply.policy import ReplyPolicy
from paramserver.rules import RuleSettings, make_rule
from paramserver.schedule import Schedule
from paramserver.settings import RunSettings
from paramserver.store import Store
from paramserver.tally import RunBudget, ServerTally
from paramserver.wire import frame
from paramserver.wire.compress import Codec
from paramserver.wire.protocol import State, fragment_pieces, shard_bounds


@dataclass(frozen=True)
class StateSettings:
    """What a server's state reads of the run, for a run of a given number of clients:
    built once where the server role starts (experiments/run/serverrun.py's
    `ServerSettings`), so every server of a sharded run, and a resumed one, is made from
    the same values. The reply policy and DyLU read their keys here by the config's names
    (`fresh_reply`, `nesterov_reply`, `overdue`, `dylu`, `push_every`).

    `client_steps`: the most minibatches one client may compute (the run's budget where it
    has one); `schedule`: the server's lr schedule; `run_budget`: the server ends the run
    once the clients' steps make the run's budget."""

    rule: str
    rule_settings: RuleSettings
    server_device: str
    server_kernel: str
    servers: int
    spares: int
    max_clients: int
    client_steps: int
    compress: str
    compress_pulls: bool
    schedule: Schedule
    fresh_reply: str
    nesterov_reply: str
    overdue: float
    dylu: bool
    push_every: int
    fetch_every: int
    run_budget: bool
    fragments: int

    @classmethod
    def from_config(cls, cfg: RunSettings, clients: int) -> StateSettings:
        return cls(rule=cfg.rule, rule_settings=RuleSettings.from_config(cfg), server_device=cfg.server_device,
                   server_kernel=cfg.server_kernel, servers=cfg.servers, spares=cfg.spares,
                   max_clients=cfg.max_clients, client_steps=cfg.client_steps(clients), compress=cfg.compress,
                   compress_pulls=cfg.compress_pulls,
                   schedule=Schedule.for_run(cfg, clients, lr=cfg.effective_server_lr),
                   fresh_reply=cfg.fresh_reply, nesterov_reply=cfg.nesterov_reply, overdue=cfg.overdue,
                   dylu=cfg.dylu, push_every=cfg.push_every, fetch_every=cfg.fetch_every,
                   run_budget=cfg.run_budget, fragments=cfg.fragments)

    def store(self, weights: np.ndarray, clients: int, optimizer_factory: Callable | None = None) -> Store:
        """A store for these weights: the rule for `clients` clients, on the server's device
        (`optimizer_factory`: the user's optimizer, where the rule steps with it)."""
        rule = make_rule(self.rule, self.rule_settings, clients, optimizer_factory)
        return Store(weights, rule, backend=ServerArrays(self.server_device), kernel=self.server_kernel)


@dataclass
class ServerState:
    """Everything `handle` reads and changes: the Store, the tallies, the wire's buffers.

    `peers`: with sharded servers, the server ranks allowed to read this one's slice
    (a PULL from them is answered with the raw slice). `apply_cost`: seconds an apply is
    logged as taking (the simulator's virtual cost); None: measured. `schedule`: the
    run's lr schedule (paramserver/schedule.py), whose progress the replies carry and
    whose multiplier the rule applies with; None: a constant lr. `clock`: the run's
    (virtual in the simulator), by which a checkpoint is due `checkpoint_every` seconds
    after the last. `reply`: when to answer a push, and DyLU's windows (its own clock:
    the same). `stop`: whether the run reached a target (`stop_at_error`, `_loss`,
    `_metric`): every reply from then on tells its client to stop. `collects_states`: checkpoints hold the clients' optimizer states
    (see the module's doc); `client_states`: client -> the state its last push handled (or
    STOP) came with, where it came with one; `arrived_states`: those awaiting their push.
    `budget`: the run's, where the run has one (`budget = "run"`; paramserver/tally.py).
    `members`: who may join and each client's shard (paramserver/membership.py).
    `fragments`: P, the streamed fragments a push may come in (1: whole pushes only); their
    slices of the whole vector are the sharded servers' (`shard_bounds`), on the codec's
    blocks, and `pieces` are their pieces on this server's slice `shard` (its start and
    stop in the whole vector, and the whole's length; None: it holds all of it), empty
    where a fragment misses it (`fragment_pieces`).
    """

    store: Store
    client_ranks: list[int]
    eval_every: int = 0
    codec: Codec = field(default_factory=Codec)       # pushes'
    pull_codec: Codec = field(default_factory=Codec)  # replies' (`compress_pulls`)
    tally: ServerTally | None = None
    peers: tuple[int, ...] = ()
    apply_cost: float | None = None
    schedule: Schedule | None = None
    reply: ReplyPolicy = field(default_factory=ReplyPolicy)
    clock: Callable[[], float] = time.monotonic  # the run's clock
    stop: Callable[[], bool] = lambda: False
    collects_states: bool = False
    client_states: dict[int, State] = field(default_factory=dict)
    arrived_states: dict[int, State] = field(default_factory=dict)
    checkpoint_due: bool = False
    checkpoint_every: float = 0.0  # seconds of `clock` after which a checkpoint is due between curve points
    checkpointed_at: float = 0.0   # `clock` when the last was asked for (from the start: __post_init__)
    budget: RunBudget | None = None
    members: Membership | None = None
    fragments: int = 1
    shard: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        self.members = self.members or Membership.for_clients(len(self.client_ranks), 0)
        self.checkpointed_at = self.clock()
        self.tally = self.tally or ServerTally(len(self.client_ranks))
        self.buffer = frame.empty(self.store.size, np.float32)  # pushes, as float32
        compressed = self.codec.wire_dtype != np.float32
        self.landing = frame.empty(self.codec.wire_size(self.store.size), self.codec.wire_dtype) if compressed \
            else self.buffer  # as they come
        self.pieces = self._pieces() if self.fragments > 1 else []

    def _pieces(self) -> list[tuple[int, int]]:
        """Each fragment's piece of this server's slice, in the slice's own indices."""
        lo, hi, whole = self.shard or (0, self.store.size, self.store.size)
        cuts = [fragment_pieces(f, [(lo, hi)])[0] for f in shard_bounds(whole, self.fragments, self.codec.block)]
        return [(offset, offset + stop - start) for offset, start, stop in cuts]

    @classmethod
    def for_run(cls, settings: StateSettings, weights: np.ndarray, clients: int,
                optimizer_factory: Callable | None = None, secret: str | None = None, **options: Any) -> ServerState:
        """A server's state for its slice `weights` of a run of `clients` clients: its store
        (`optimizer_factory`: the user's optimizer, for its rule), the clients' ranks (after
        the servers'), the wire's codec, the lr schedule the server counts progress for and
        applies its rule's lr by, who may join (`secret`: None, not joinable) (`options`:
        the other fields). Spare ranks (`settings.spares`) follow the clients' ranks."""
        store = settings.store(weights, clients, optimizer_factory)
        clock = options.get("clock", time.monotonic)
        servers, steps, window = settings.servers, settings.client_steps, settings.fetch_every // settings.fragments
        first_spare = servers + clients
        members = Membership.for_clients(clients, steps, secret, settings.max_clients,
                                         list(range(first_spare, first_spare + settings.spares)))
        return cls(store, list(range(servers, servers + clients)),
                   codec=make_codec(settings.compress),
                   pull_codec=make_codec(settings.compress if settings.compress_pulls else "none"),
                   schedule=settings.schedule,
                   reply=ReplyPolicy.for_run(settings, store.rule, clients, clock),
                   budget=RunBudget(steps, window, ahead=window if settings.fragments > 1 else 0)
                   if settings.run_budget else None,
                   members=members, fragments=settings.fragments, **options)

    def arrays(self) -> dict[str, np.ndarray]:
        """What a checkpoint holds of the server: the Store's arrays, the reply policy's and
        who trains on which shard."""
        return {**self.store.state(), **self.reply.state(), **self.members.arrays()}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """The server as a checkpoint's `arrays` hold it, its tally (sized for every client
        it had) already the checkpoint's: the membership first, which grows the reply
        policy for the joiners."""
        resumed(self, arrays)
        self.store.load_state(arrays)
        self.reply.load_state(arrays)

    def counts(self) -> dict[str, Any]:
        """What the server counted, for the run's summary."""
        store, tally = self.store, self.tally
        return {
            "minibatches": tally.minibatches,
            "samples": tally.samples,
            "version": store.version,
            "fragments": self.fragments,  # a push's streamed fragments: each applied one moved the version
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
            "joined_clients": list(self.members.joined),
            "spares_left": len(self.members.spares),  # spare ranks never admitted
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
        own = self.store.rule.own_progress
        return batch * self.tally.steps if own is None else round(batch * own)

    @property
    def waiting(self) -> list[int]:
        """Client ranks still expected to send something."""
        return [self.client_ranks[c] for c in self.running]

    @property
    def present(self) -> int:
        """Clients in the run, running or stopped: every one not lost."""
        return len(self.client_ranks) - len(self.tally.lost)

    @property
    def running(self) -> list[int]:
        """The clients (indices) still expected to send something."""
        tally = self.tally
        return [c for c, r in enumerate(self.client_ranks) if r not in tally.stops and r not in tally.lost]

    @property
    def done(self) -> bool:
        return not self.waiting
