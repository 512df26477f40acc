"""What every update rule shares: the settings it reads (`RuleSettings`), the facts of a
push it is given (`PushFacts`), the update it hands a fused kernel (`Update`), and `Rule`,
which is the `add` rule (w += d, the paper's) and the base of the others.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable

from paramserver.noise import NoiseScale

if TYPE_CHECKING:  # torch loads with the server's weights, not with the config that names a rule
    from torch import Tensor


@dataclass(frozen=True)
class RuleSettings:
    """The run config's keys a rule reads, taken from it once (`from_config`) where the
    server's state is set up; the config's checks hand the rules a RunConfig itself, which
    has every one of them."""

    effective_server_lr: float
    effective_server_momentum: float
    lr: float
    weight_decay: float
    dc_lambda: float | None
    easgd_beta: float
    batch_size: int
    push_every: int
    fetch_every: int
    lr_scaling: str
    fresh_batch: int | str
    max_staleness: int
    nesterov_every: int
    nesterov_momentum: float | None
    outer_momentum: float  # nesterov_momentum, or the default of the step that takes it
    outer_lr: float | None
    outer_step_lr: float  # outer_lr, or its default (1 - outer_momentum)
    nesterov_activation: float
    servers: int
    optimizer: str
    nesterov: bool
    clip_grad_norm: float

    @classmethod
    def from_config(cls, cfg: Any) -> RuleSettings:
        """These keys of `cfg` (a runconfig.settings.RunConfig: its properties too)."""
        return cls(**{key.name: getattr(cfg, key.name) for key in fields(cls)})


@dataclass(frozen=True, slots=True)
class PushFacts:
    """One push as a rule sees it, all it is told of it: made by the Store from what the
    handler knows, never set on the rule from outside."""

    d: Tensor             # the change, or gradient sum, as float32 where the weights live
    client: int
    staleness: int        # versions applied since the client pulled
    minibatches: int = 1  # the minibatches it covers (from the header's step, which every server of a sharded run gets)
    lr_factor: float = 1.0   # the lr schedule's multiplier at the server's progress before it (paramserver/schedule.py)
    scale_ramp: float = 1.0  # how far the batch-size scaling has ramped in (`lr_scale_warmup`)
    # the weights' slice a streamed fragment is for (d and the rule's w are that slice), and
    # the whole vector's length, by which a rule whose state is kept per slice sizes it
    piece: slice | None = None
    size: int = 0


@dataclass(slots=True)
class Update:
    """One push's update as a fused kernel runs it (paramserver/compute/fused.py): `code`, a few
    `name = expr;` statements in the common ground of C and Python (names, + - * /,
    brackets and sqrt), over w, d, `state` (None: a vector not made yet, read as zeros),
    `reads` and float32 `scalars`, writing w_out and NAME_out for each state vector
    (other names are float temporaries); `after`: the rule's own counting, once the push
    is known to be finite (fresh's and nesterov's)."""

    code: str
    scalars: dict[str, float] = field(default_factory=dict)
    state: dict[str, Tensor | None] = field(default_factory=dict)
    reads: dict[str, Tensor] = field(default_factory=dict)
    after: Callable[[], object] | None = None


def refusals(*checks: tuple[bool, str]) -> str:
    """The first failed check's "field: reason", or ""."""
    return next((reason for ok, reason in checks if not ok), "")


class Rule:
    """w += d: the paper's rule, and the base of the others. Stateless."""

    ADD = "w_out = w + d;"
    FORMULAS: tuple[str, ...] = (ADD,)  # every fused formula the rule's updates use

    pushes = "delta"   # what a client sends: its weight change ("delta"), "gradient" sums or "weights"
    # whether applying a push slice by slice, each to its slice of w, is applying it whole:
    # an elementwise update with no state of its own over the vector (a fragment is applied so)
    by_slice = True
    # whether the rule keeps its state slice by slice (nesterov): a fragment then reads and
    # updates only its slice's, and a whole push under fragments is applied as a push of
    # each slice in turn (Store.apply), so streamed fragments have a meaning with it too
    per_slice = False
    # whether a push may join a step taken later (fresh), or a round its N-th push steps
    # (nesterov): the reply policy (paramserver/reply/policy.py) may then answer it with it
    gathers = False
    rounds = False
    step_batch: int | None = None  # the minibatches a step gathers, for rules that gather (fresh)
    gain: float | None = None      # the lr gain of such a step now, under adascale (fresh)
    steps_with_optimizer = False  # whether the server's step is the run's optimizer (sgd, fresh)
    # the lr schedule's progress where the rule counts its own, in minibatches: the steps'
    # gains summed (fresh under adascale); None: the samples pushed are the progress
    own_progress: float | None = None
    # whether this rule's FORMULAS are its update with these settings (not, for the server's
    # Adam: then the fused paths stand aside and `apply` runs)
    formulas_fit = True
    # The rule's values of the settings a user leaves unset (None in the config), beside the
    # arithmetic they are for: where one rule's step is not another's (Adagrad's lr is not
    # SGD's), a default shared by every rule would suit one. docs/rules.md says why each.
    DEFAULTS: dict[str, float] = {}

    def __init__(self, settings: RuleSettings, clients: int):
        self.clients = clients
        self.base_lr = settings.effective_server_lr
        # Pushed gradients carry the gradient noise scale; other pushes do not.
        self.noise = NoiseScale(settings.batch_size, clients) if self.pushes == "gradient" else None

    @classmethod
    def check_keys(cls, settings: RuleSettings) -> str:
        """Why the rule's own keys are out of range (a ConfigError line), or "": checked
        whichever rule runs, as every key of the config is."""
        return ""

    @classmethod
    def setting(cls, settings: RuleSettings, key: str, otherwise: float | None = None) -> float | None:
        """`key` as the user gave it, else this rule's default, else `otherwise`."""
        given = getattr(settings, key)
        return given if given is not None else cls.DEFAULTS.get(key, otherwise)

    @classmethod
    def check(cls, settings: RuleSettings) -> str:
        """Why these settings cannot run this rule (a ConfigError line), or ""."""
        return ""

    @classmethod
    def client_elastic(cls, settings: RuleSettings, clients: int) -> float:
        """The elastic step a client takes back towards the server's answer (EASGD's), or 0."""
        return 0.0

    @classmethod
    def versions(cls, settings: RuleSettings, pushes: int, clients: int) -> int:
        """The versions `pushes` applied pushes make (each makes one, but for fresh's)."""
        return pushes

    def lr(self, push: PushFacts) -> float:
        """The rule's own lr for `push`: rules with one follow the schedule's curve, as the
        clients do."""
        return self.base_lr * push.lr_factor

    @property
    def remaining(self) -> int:
        """The minibatches the step being gathered still needs (0: the rule does not gather)."""
        return 0

    @property
    def round_left(self) -> int:
        """The pushes the open round still needs (0: none open, or the rule has no rounds)."""
        return 0

    @property
    def pending(self) -> bool:
        """Pushes taken in that no step has applied yet: the version waits for them."""
        return False

    def drops(self, staleness: int) -> str:
        """Why a push this stale is left out (counted, not applied, not an error), or ""."""
        return ""

    def apply(self, w: Tensor, push: PushFacts) -> None:
        w.add_(push.d)

    def fused(self, push: PushFacts) -> Update:
        """`apply` as one fused kernel's update."""
        return Update(self.ADD)

    @classmethod
    def fusable(cls) -> bool:
        """Whether `fused` is this rule's own arithmetic: a rule that overrides `apply`
        but not `fused` runs its torch arithmetic on a GPU too."""
        def owner(name: str) -> type:
            return next(k for k in cls.__mro__ if name in vars(k))
        return issubclass(owner("fused"), owner("apply"))

    def step(self, w: Tensor) -> None:
        """Apply what is pending now (the Store's `flush`: no more pushes can come for it)."""

    def pulled(self, client: int, w: Tensor) -> None:
        """`client` now holds the weights `w` (called before they are sent)."""

    def state(self) -> dict[str, Tensor]:
        return {}

    def load_state(self, state: dict[str, Tensor]) -> None:
        pass

    def scalars(self) -> dict[str, float]:
        """Numbers of the rule's state (saved in float64 beside `state`'s vectors)."""
        return {}

    def load_scalars(self, values: dict[str, float]) -> None:
        pass
