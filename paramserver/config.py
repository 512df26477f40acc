"""Run configuration: one frozen dataclass, loaded from TOML and overridden by flags.

Every value is checked when the object is created, so a bad run fails with one line
(`ConfigError`, naming the field) before any MPI process starts. Config keys and
command-line flags share names (`n_sync` is `--n-sync`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import sys
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional, get_type_hints

from paramserver.rules import RULES, rule_class
from paramserver.wire.compress import CODECS

BACKENDS = ("mpi", "sim")
OPTIMIZERS = ("sgd", "adam", "adamw")  # the clients' (clients/optimizers.py); or a factory of the user's
PRECISIONS = ("fp32", "bf16", "fp16")
MODES = ("async", "sync", "local-sgd")
FAILURE_POLICIES = ("abort", "continue")
AUTO_KEYS = ("momentum", "fresh_batch")  # keys that also take the word "auto"
LR_SCHEDULES = ("constant", "cosine", "step")
LR_SCALINGS = ("none", "linear", "sqrt")
SIM_PROFILES = ("measured", "paper")  # their values: experiments/simulator.py
# user code named in a config (clients/usercode.py imports it): a .py file, or a module (recorded with
# the folder it was found in, FOLDER:module:name, so it imports again from any working directory), a name in it
USER_CODE = re.compile(r"(?:(?P<file>[^:]+\.py)|(?:(?P<folder>[^:]+):)?(?P<module>[A-Za-z_][\w.]*))"
                       r":(?P<name>[A-Za-z_][\w.]*)")
USER_CODE_KEYS = ("model", "data", "loss", "metric", "optimizer")  # the settings that may name user code


class ConfigError(ValueError):
    """A config value is wrong; the message is one line: `field: reason`."""


class InjectedFault(RuntimeError):
    """Raised on purpose where `inject_fault` says, so tests can watch a job fail cleanly."""


@dataclass(frozen=True)
class Fault:
    """Where `inject_fault = RANK:AT` makes one rank fail on purpose: once its count (a
    client's minibatch step, the server's version) reaches `at`. The one way a test fails
    a run, for a client, a collective rank and the server alike."""

    at: int
    who: str   # "client 3", "the server"
    unit: str  # "step", "version"

    def strike(self, count: int) -> None:
        if count >= self.at:
            raise InjectedFault(f"injected fault on {self.who} at {self.unit} {count}")


def _key(default: Any, help: str) -> Any:
    """A config key: its default and the help line its command-line flag shows."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class RunConfig:
    """Every knob of a run; defaults give the demo (Fashion-MNIST, small CNN)."""

    out: str = _key("", "run directory (default: runs/<time>-c<K>-n<N>)")
    backend: str = _key("mpi", "mpi (real ranks) or sim (every rank in one process, on a virtual clock)")
    mode: str = _key("async", "async (parameter server), sync (allreduce gradients each step) or "
                              "local-sgd (average weights every n_sync steps)")
    clients: Optional[int] = _key(None, "number of clients K (default: every MPI rank but the server; "
                                        "every rank in sync modes)")
    n_sync: int = _key(1, "push the update and fetch the weights every N minibatches")
    n_push: Optional[int] = _key(None, "push every N minibatches (default: n_sync)")
    n_fetch: Optional[int] = _key(None, "fetch every N minibatches (default: n_sync)")
    steps: int = _key(500, "minibatches per client")
    epochs: int = _key(0, "instead of steps: passes over each client's shard of the training set (the smallest "
                          "shard's, whole minibatches); steps is then derived from it and recorded (0: steps decides)")
    batch_size: int = _key(64, "samples per minibatch")
    lr: float = _key(0.03, "learning rate of one minibatch (the clients', and the server's where it steps; "
                           "lr_scaling scales it for updates that average more)")
    lr_warmup: int = _key(0, "samples over which the lr ramps linearly up to its value (0: none); samples the "
                             "server has applied (async) or steps x clients x batch_size (sync modes)")
    lr_schedule: str = _key("constant", "constant, cosine (to lr_floor over the run's planned samples) or step "
                                        "(times lr_step_factor at each of lr_milestones)")
    lr_floor: float = _key(0.0, "cosine: the last lr, as a fraction of the peak")
    lr_milestones: str = _key("", "step: comma-separated sample counts at which the lr is multiplied")
    lr_step_factor: float = _key(0.1, "step: what the lr is multiplied by at each milestone")
    lr_scaling: str = _key("sqrt", "none, linear (the lr times the client minibatches n one update averages: "
                                   "K in sync mode, K - backup_workers with backup workers, fresh's gathered "
                                   "minibatches, 1 otherwise) or sqrt (the lr times sqrt(n))")
    lr_scale_warmup: int = _key(80, "updates (steps of the server, or of sync) over which lr_scaling's "
                                    "multiplier ramps linearly in from 1 (one minibatch's lr; Goyal et al.'s "
                                    "gradual warmup) to its value (0: at once)")
    momentum: float = _key(0.9, "client SGD momentum (the buffer stays on the client), or auto: lowered "
                                "with the number of clients to offset the momentum asynchrony adds")
    weight_decay: float = _key(5e-4, "client weight decay (L2 in sgd and adam, decoupled in adamw)")
    optimizer: str = _key("sgd", "the clients' optimizer: sgd, adam, adamw (torch's, at lr and weight_decay; "
                                 "momentum is sgd's), or package.module:factory (or file.py:factory) called "
                                 "as factory(params, lr=, momentum=, weight_decay=) with the keywords it takes, "
                                 "returning a torch.optim.Optimizer")
    clip_grad_norm: float = _key(0.0, "clip each minibatch's gradient to this total L2 norm before the client's "
                                      "step, as torch.nn.utils.clip_grad_norm_ (0: no clipping)")
    precision: str = _key("fp32", "the clients' forward and loss: fp32, bf16 (torch.autocast, CPU or GPU) or "
                                  "fp16 (torch.autocast with torch's GradScaler; for GPUs)")
    rule: str = _key("fresh", "server update rule: " + ", ".join(RULES) + " (docs/rules.md)")
    server_lr: Optional[float] = _key(None, "learning rate of the sgd and adagrad rules (default: lr)")
    server_momentum: Optional[float] = _key(None, "momentum of the server's SGD step, sgd and fresh rules "
                                                  "(default: the clients' momentum; 0.9 with momentum auto)")
    dc_lambda: float = _key(2.0, "dcasgd: lambda0 of the adaptive delay compensation (0: the add rule)")
    easgd_beta: float = _key(0.9, "easgd: the elastic coefficient is beta / clients")
    fresh_batch: int = _key(0, "fresh: minibatches of fresh gradients a step gathers (0: a push of every client, "
                               "clients x n_push; auto: from the gradient noise scale, in [1, 4 x clients])")
    max_staleness: int = _key(0, "fresh: versions a gathered gradient may be behind; staler pushes are dropped")
    fresh_reply: str = _key("auto", "fresh: a client whose push joins a step being gathered waits for the step "
                                    "(wait), computes again at the same weights (again), or either, whichever "
                                    "its measured pace says comes first (auto; wait with several servers)")
    nesterov_every: int = _key(0, "nesterov: pushes between the server's momentum updates (0: clients)")
    nesterov_momentum: float = _key(0.9, "nesterov: the server's momentum beta (0: w += d / nesterov_every)")
    seed: int = _key(0, "seed of the initial weights, shards and data order")
    warm_start: int = _key(0, "train this many minibatches on one client first; every client starts there")
    init: str = _key("", "start from the weights of this checkpoint (a run's checkpoint/latest.npz)")
    resume: str = _key("", "continue the run in this directory from its last checkpoint")
    data: str = _key("fashion-mnist",
                     "fashion-mnist, a .npz file (x, y[, x_test, y_test]), an image folder (train/, val/), or "
                     "package.module:factory (or file.py:factory) returning a train and a test torch Dataset "
                     "(docs/your-model.md)")
    data_dir: str = _key("", "folder holding Fashion-MNIST's four *-ubyte.gz files")
    model: str = _key("cnn", "cnn (small, for 28x28 data), convnet (cuda-convnet ImageNet network), or "
                             "package.module:factory (or file.py:factory) returning an nn.Module, called with "
                             "(input_shape, num_classes) or nothing (docs/your-model.md)")
    loss: str = _key("", "package.module:function (or file.py:function) taking (outputs, targets) and returning "
                         "a scalar tensor (default: cross-entropy)")
    metric: str = _key("", "package.module:function (or file.py:function) taking (outputs, targets) of a test "
                           "batch and returning a number, its mean over the batch: a column of the curve "
                           "(eval.jsonl test_metric, TensorBoard test/metric) and final_test_metric in the summary")
    model_args: str = _key("", "keyword arguments for your model factory, a JSON object ('{\"width\": 64}'; a "
                               "table in a config file, a dict in experiments.api.train)")
    data_workers: int = _key(0, "DataLoader worker processes that read each client's next minibatches ahead, in "
                                "the same order (into pinned memory for a GPU client); 0: the client reads them "
                                "itself. MPI backend")
    threads: int = _key(0, "torch threads per client (0: a node's cores shared by its client ranks; "
                           "all cores in the simulator)")
    device: str = _key("auto", "auto (cuda:<local rank mod GPUs> with CUDA, else cpu), cpu or cuda[:N]")
    server_device: str = _key("cpu", "where the server keeps the weights and applies pushes: cpu (numpy) or "
                                     "cuda[:N] (a GPU; weights go to MPI through a pinned host buffer)")
    server_kernel: str = _key("auto", "how the server applies a push: auto (the rule's fused formula as one kernel: "
                                      "compiled by g++ for the CPU where g++ is found, by cupy on a GPU; else "
                                      "torch) or torch (the rule's torch arithmetic, several passes a push)")
    eval_every: int = _key(0, "server versions between test evaluations (0: about 20 a run, fewer where "
                              "20 would take more than a quarter of training's compute)")
    eval_samples: int = _key(0, "test samples per point of the test-error curve, a fixed seeded subset "
                                "(0: 1,000, or the whole split if smaller); the final weights are always "
                                "measured on the whole test split")
    stop_at_error: float = _key(0.0, "end the run (every rank, with its last pushes recorded) once a point of the "
                                      "test-error curve reaches this error; the summary says complete: reached "
                                      "target (0: train every step)")
    eval_live: str = _key("auto", "measure the curve while the run trains, on a thread of the recording rank: on "
                                  "(a quarter of the thread's time), off (after training), or auto (on where its "
                                  "host has a core more than the run's ranks there; else at a trickle, a twentieth, "
                                  "so the curve shows while training keeps its cores)")
    stall_timeout: float = _key(600.0, "seconds any rank waits for a peer before failing the job")
    servers: int = _key(1, "server ranks (0..S-1), each holding a contiguous slice of the weights; "
                        "clients push and pull every slice at once")
    compress: str = _key("none", "none, fp16 or bf16: pushes (with error feedback) and pulls as 16-bit floats "
                         "on the wire; the server keeps float32 weights")
    on_client_failure: str = _key("abort", "abort (end the job naming the client; resumable) or continue "
                                  "(the server carries on with the other clients; async mode)")
    keep_snapshots: bool = _key(False, "keep the weight snapshots after evaluating them")
    keep_best: bool = _key(False, "keep the weights of the curve's point with the lowest test error in "
                                  "RUN/checkpoint/best.npz (asgd export --best exports them)")
    checkpoint_every: float = _key(60.0, "seconds of the run's clock (virtual in the simulator) after which a "
                                         "checkpoint is taken between the curve's points, so an interrupt loses "
                                         "at most about this much training (0: at the curve's points only)")
    quiet: bool = _key(False, "no progress bar or final line")
    debug: bool = _key(False, "on a failure, print the full traceback too (it always goes to RUN/error.log)")
    tensorboard: bool = _key(False, "also write TensorBoard scalars to RUN/tensorboard/ as the run goes")
    sim_profile: str = _key("measured", "sim: the costs below by default: measured (this host, this model) or "
                                        "paper (the paper's ImageNet model, GPUs and network; docs/simulator.md)")
    sim_step_time: float = _key(0.0, "sim: seconds per minibatch (0: the profile's; measured: from real steps)")
    sim_apply_time: float = _key(0.0, "sim: server seconds per push, checks, apply and logs (0: the profile's; "
                                      "measured: the real handler's)")
    sim_calibrate: str = _key("", "sim: the server's time a push as this MPI run directory's server measured it "
                                  "(its summary's server_push_us, but for taking the push off the wire, which "
                                  "the simulated transfer stands for); sim_apply_time, when set, comes first")
    sim_bandwidth: float = _key(0.0, "sim: bytes/s of a transfer (0: the profile's; measured: 1.1e10, MPI on "
                                     "the 2-core reference host)")
    sim_latency: float = _key(0.0, "sim: seconds added to every transfer (0: the profile's; measured: 2e-6)")
    sim_push_bytes: int = _key(0, "sim: bytes a push (and a pull) carries on the wire (0: the profile's; "
                                  "measured: the model's)")
    speed_jitter: float = _key(0.0, "sim: client i's step time is sim_step_time * U(1-j, 1+j), seeded")
    step_sigma: float = _key(0.0, "stragglers: each minibatch's compute time times a lognormal factor "
                                  "exp(sigma z) (median 1), seeded; simulated, or slept for real under MPI")
    slow_clients: int = _key(0, "stragglers: the last N clients compute slow_factor times slower")
    slow_factor: float = _key(2.0, "stragglers: how much slower the slow clients are")
    pause_prob: float = _key(0.0, "stragglers: chance that a minibatch is followed by a pause of pause_time")
    pause_time: float = _key(0.0, "stragglers: seconds a pause lasts")
    backup_workers: int = _key(0, "sync mode: each step averages the first K - b gradients to arrive and drops "
                                  "the b slowest (Chen et al. 2016)")
    replay: str = _key("", "sim: apply pushes in the order of this run directory's server.jsonl")
    inject_fault: str = _key("", "RANK:STEP; raise an exception there (for tests)")

    def __post_init__(self) -> None:
        _check_types(self)
        _check_values(self)

    @property
    def push_every(self) -> int:
        return self.n_push or self.n_sync

    @property
    def fetch_every(self) -> int:
        return self.n_fetch or self.n_sync

    def client_momentum(self, clients: int) -> float:
        """The clients' momentum: as set, or with `auto` (async runs) lowered to offset
        the implicit momentum of K asynchronous clients (see `auto_momentum`)."""
        if self.momentum != "auto":
            return self.momentum
        return auto_momentum(clients) if self.mode == "async" else AUTO_BASE_MOMENTUM

    @property
    def effective_server_lr(self) -> float:
        return self.lr if self.server_lr is None else self.server_lr

    @property
    def effective_server_momentum(self) -> float:
        """The server's SGD momentum: as set, or the clients' (so one client of `sgd` or
        `fresh` is torch.optim.SGD with the run's momentum)."""
        if self.server_momentum is not None:
            return self.server_momentum
        return AUTO_BASE_MOMENTUM if self.momentum == "auto" else self.momentum

    def fault_for(self, rank: int, who: str, unit: str = "step") -> Fault | None:
        """The fault `inject_fault` puts on `rank`, if any."""
        if not self.inject_fault:
            return None
        target, at = map(int, self.inject_fault.split(":"))
        return Fault(at, who, unit) if target == rank else None

    def async_versions(self, clients: int) -> int:
        """The versions an async run of `clients` makes: one a push, or as its rule gathers them."""
        return rule_class(self.rule).versions(self, clients * math.ceil(self.steps / self.push_every), clients)

    def for_data(self, train_size: int, clients: int) -> "RunConfig":
        """The config with the steps `epochs` makes for `clients` shards of `train_size`
        items (itself without epochs): known once the data are, at a rank's entry."""
        if not self.epochs:
            return self
        per_epoch = max(1, (train_size // clients) // self.batch_size)
        return dataclasses.replace(self, steps=self.epochs * per_epoch)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


AUTO_BASE_MOMENTUM = 0.9  # the momentum `auto` keeps in total, and gives one client


def auto_momentum(clients: int) -> float:
    """Explicit momentum for K asynchronous clients: K clients add implicit momentum of
    about 1 - 1/K (Mitliagkas et al. 2016), which passes a step on amplified K times as a
    momentum does by 1 / (1 - mu); the explicit momentum left, mu_K = 1 - K (1 - 0.9),
    keeps the product at one client's 10 (0.9 with one client, 0.8 with two, 0 from 10)."""
    return max(0.0, 1.0 - clients * (1.0 - AUTO_BASE_MOMENTUM))


def field_types() -> dict[str, type]:
    """The base type of each field (Optional[int] -> int)."""
    return dict(_field_types())


@functools.cache
def _field_types() -> dict[str, type]:
    """Worked out once a process: `get_type_hints` evaluates every annotation anew (about
    1 ms), and the command's parser and every RunConfig's checks ask for them."""
    hints = get_type_hints(RunConfig)
    base = {}
    for f in fields(RunConfig):
        args = getattr(hints[f.name], "__args__", None)
        base[f.name] = args[0] if args else hints[f.name]
    return base


def flag_type(name: str) -> Callable[[str], Any]:
    """How a command-line value of `name` is read: its field's type, and for momentum
    and fresh_batch also the word `auto`."""
    if name in AUTO_KEYS:
        kind = field_types()[name]

        def auto(text: str) -> float | int | str:
            return text if text == "auto" else kind(text)
        auto.__name__ = name  # argparse names it in a refusal: "invalid momentum value"
        return auto
    return field_types()[name]


def _check_types(cfg: RunConfig) -> None:
    for name, kind in field_types().items():
        value = getattr(cfg, name)
        if value is None or (name in AUTO_KEYS and value == "auto"):
            continue
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value) if abs(value) <= sys.float_info.max else math.inf  # refused just below
            object.__setattr__(cfg, name, value)
            ok = True
        if not ok:
            raise ConfigError(f"{name}: expected {kind.__name__}, got {value!r}")
        _check_magnitude(name, value)


def _check_magnitude(name: str, value: Any) -> None:
    """Numbers torch and numpy can take: an infinite rate or timeout trains on nothing or
    never ends, and ints past 64 bits overflow torch.manual_seed and numpy arrays."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}: must be a finite number, got {value}")
    if isinstance(value, int) and not -2**63 <= value < 2**63:
        raise ConfigError(f"{name}: must fit in 64 bits, got {value}")


def _require(ok: bool, field: str, reason: str) -> None:
    if not ok:
        raise ConfigError(f"{field}: {reason}")


def _check_values(cfg: RunConfig) -> None:
    _require(cfg.backend in BACKENDS, "backend", f"unknown backend {cfg.backend!r} (choose from {', '.join(BACKENDS)})")
    _require(cfg.mode in MODES, "mode", f"unknown mode {cfg.mode!r} (choose from {', '.join(MODES)})")
    _require(cfg.clients is None or cfg.clients >= 1, "clients", f"must be at least 1, got {cfg.clients}")
    _require(cfg.epochs >= 0, "epochs", f"must be non-negative (0: steps decides), got {cfg.epochs}")
    _require(not (cfg.epochs and cfg.replay), "epochs", "a replay repeats a recorded run's steps; leave epochs out")
    for name in ("n_sync", "n_push", "n_fetch", "steps", "batch_size"):
        value = getattr(cfg, name)
        _require(value is None or value >= 1, name, f"must be at least 1, got {value}")
    _require(cfg.lr > 0, "lr", f"must be positive, got {cfg.lr}")
    _require(cfg.server_lr is None or cfg.server_lr > 0, "server_lr", f"must be positive, got {cfg.server_lr}")
    for name in ("momentum", "server_momentum"):
        value = getattr(cfg, name)
        _require(value is None or value == "auto" and name == "momentum" or 0 <= value < 1, name,
                 f"must be in [0, 1), got {value}")
    _check_rule_keys(cfg)
    _require(cfg.weight_decay >= 0, "weight_decay", f"must be non-negative, got {cfg.weight_decay}")
    _require(cfg.optimizer in OPTIMIZERS or is_user_code(cfg.optimizer), "optimizer",
             f"expected {', '.join(OPTIMIZERS)} or package.module:factory, got {cfg.optimizer!r}")
    _require(cfg.clip_grad_norm >= 0, "clip_grad_norm", f"must be non-negative (0: none), got {cfg.clip_grad_norm}")
    _require(cfg.data_workers >= 0, "data_workers", f"must be non-negative, got {cfg.data_workers}")
    _require(not cfg.data_workers or cfg.backend == "mpi", "data_workers",
             "needs --backend mpi (the simulator's clients read on its virtual clock)")
    _require(cfg.eval_live in ("auto", "on", "off"), "eval_live", f"expected auto, on or off, got {cfg.eval_live!r}")
    _require(0 <= cfg.stop_at_error < 1, "stop_at_error",
             f"must be an error in [0, 1) (0: none), got {cfg.stop_at_error}")
    _require(not cfg.stop_at_error or cfg.eval_live != "off", "stop_at_error",
             "needs the curve while the run trains: eval_live on or auto, not off")
    _require(cfg.precision in PRECISIONS, "precision", f"expected {', '.join(PRECISIONS)}, got {cfg.precision!r}")
    _require(cfg.seed >= 0, "seed", f"must be non-negative, got {cfg.seed}")
    _require(cfg.warm_start >= 0, "warm_start", f"must be non-negative, got {cfg.warm_start}")
    for name in ("eval_every", "eval_samples", "threads"):
        _require(getattr(cfg, name) >= 0, name, f"must be non-negative (0: automatic), got {getattr(cfg, name)}")
    _require(cfg.checkpoint_every >= 0, "checkpoint_every",
             f"must be non-negative seconds (0: at the curve's points only), got {cfg.checkpoint_every}")
    _require(cfg.threads < 2**31, "threads", f"must be below 2**31 (torch takes a C int), got {cfg.threads}")
    for name in ("sim_step_time", "sim_apply_time", "sim_latency", "sim_bandwidth", "sim_push_bytes"):
        _require(getattr(cfg, name) >= 0, name, f"must be non-negative (0: the profile's), got {getattr(cfg, name)}")
    _require(cfg.sim_profile in SIM_PROFILES, "sim_profile",
             f"unknown profile {cfg.sim_profile!r} (choose from {', '.join(SIM_PROFILES)})")
    _require(0 <= cfg.speed_jitter < 1, "speed_jitter", f"must be in [0, 1), got {cfg.speed_jitter}")
    _require(not cfg.replay or (cfg.backend == "sim" and cfg.mode == "async"), "replay",
             "needs --backend sim and --mode async")
    _require(not cfg.sim_calibrate or (cfg.backend == "sim" and cfg.mode == "async"), "sim_calibrate",
             "needs --backend sim and --mode async (only the async server pushes)")
    _check_schedule(cfg)
    _check_stragglers(cfg)
    _require(cfg.servers >= 1, "servers", f"must be at least 1, got {cfg.servers}")
    _require(cfg.servers == 1 or (cfg.mode == "async" and cfg.backend == "mpi"), "servers",
             "more than one server needs --mode async --backend mpi")
    _require(cfg.servers == 1 or not cfg.resume, "servers",
             "a run with more than one server cannot be resumed (its servers' slices are not checkpointed together)")
    _require(cfg.compress in CODECS, "compress", f"expected {', '.join(CODECS)}, got {cfg.compress!r}")
    _require(cfg.compress == "none" or cfg.mode == "async", "compress", "needs --mode async (pushes and pulls)")
    _require(cfg.on_client_failure in FAILURE_POLICIES, "on_client_failure",
             f"expected {' or '.join(FAILURE_POLICIES)}, got {cfg.on_client_failure!r}")
    _require(cfg.on_client_failure == "abort" or cfg.mode == "async", "on_client_failure",
             "continue needs --mode async (a collective cannot go on without a rank)")
    _require(cfg.stall_timeout > 0, "stall_timeout", f"must be positive, got {cfg.stall_timeout}")
    _require(re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.device) is not None,
             "device", f"expected auto, cpu or cuda[:N], got {cfg.device!r}")
    _require(re.fullmatch(r"cpu|cuda(:\d+)?", cfg.server_device) is not None, "server_device",
             f"expected cpu or cuda[:N], got {cfg.server_device!r}")
    _require(cfg.server_device == "cpu" or cfg.mode == "async", "server_device",
             "needs --mode async (only async runs have a server)")
    _require(cfg.server_kernel in ("auto", "torch"), "server_kernel",
             f"expected auto or torch, got {cfg.server_kernel!r}")
    for name in ("loss", "metric") + tuple(n for n in ("model", "data", "optimizer") if is_user_code(getattr(cfg, n))):
        value = getattr(cfg, name)
        _require(not value or USER_CODE.fullmatch(value) is not None, name,
                 f"expected package.module:name (or FOLDER:package.module:name) or path/file.py:name, "
                 f"got {value!r}")
    _check_model_args(cfg)
    _require(_fault_ok(cfg.inject_fault), "inject_fault", f"expected RANK:STEP, got {cfg.inject_fault!r}")


def _check_model_args(cfg: RunConfig) -> None:
    model_arguments(cfg)
    _require(not cfg.model_args or is_user_code(cfg.model), "model_args",
             f"only for a model factory of yours (package.module:factory); the built-in {cfg.model} takes none")


def model_arguments(cfg: RunConfig) -> dict[str, Any]:
    """The keywords `model_args` passes the model factory ({} for none)."""
    return _json_object(cfg.model_args)


def _json_object(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        table = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"model_args: not JSON ({error}); expected an object such as '{{\"width\": 64}}'") \
            from None
    if not isinstance(table, dict):
        raise ConfigError(f"model_args: expected a JSON object of keyword arguments, got {text!r}")
    return table


def model_args_text(value: Any) -> str:
    """model_args as one canonical JSON object, keys sorted ("" for none), whether given as
    JSON text (a flag) or a table (a config file's, the API's dict): what config.json
    records, so a resume that gives the same arguments otherwise spelt compares equal."""
    table = _json_object(value) if isinstance(value, str) else value
    if not isinstance(table, dict):
        raise ConfigError(f"model_args: expected a JSON object (or a table) of keyword arguments, got {value!r}")
    try:
        return json.dumps(table, sort_keys=True, allow_nan=False) if table else ""
    except (TypeError, ValueError) as error:  # a TOML date, a Python object, NaN
        raise ConfigError(f"model_args: {table!r} is not plain JSON ({error})") from None


def _check_rule_keys(cfg: RunConfig) -> None:
    """Each rule's own keys (whichever runs, as every key is checked), then the chosen
    rule's refusals: "field: reason" lines the rules write (paramserver/rules.py)."""
    try:
        chosen = rule_class(cfg.rule)
    except ValueError as error:  # an unknown name: the rules' own line
        raise ConfigError(str(error)) from None
    for problem in [rule.check_keys(cfg) for rule in RULES.values()] + [chosen.check(cfg)]:
        if problem:
            raise ConfigError(problem)


def _check_schedule(cfg: RunConfig) -> None:
    for name in ("lr_warmup", "lr_scale_warmup"):
        _require(getattr(cfg, name) >= 0, name, f"must be non-negative, got {getattr(cfg, name)}")
    _require(cfg.lr_schedule in LR_SCHEDULES, "lr_schedule",
             f"unknown schedule {cfg.lr_schedule!r} (choose from {', '.join(LR_SCHEDULES)})")
    _require(0 <= cfg.lr_floor <= 1, "lr_floor", f"must be in [0, 1] (a fraction of the peak lr), got {cfg.lr_floor}")
    _require(0 < cfg.lr_step_factor <= 1, "lr_step_factor", f"must be in (0, 1], got {cfg.lr_step_factor}")
    _require(cfg.lr_scaling in LR_SCALINGS, "lr_scaling",
             f"unknown scaling {cfg.lr_scaling!r} (choose from {', '.join(LR_SCALINGS)})")
    try:
        milestones = parse_milestones(cfg.lr_milestones)
    except ValueError:
        milestones = None
    _require(milestones is not None, "lr_milestones",
             f"expected increasing positive sample counts separated by commas, got {cfg.lr_milestones!r}")
    _require(cfg.lr_schedule == "step" or not milestones, "lr_milestones", "needs lr_schedule = step")
    _require(cfg.lr_schedule != "step" or bool(milestones), "lr_schedule", "step needs lr_milestones")


def parse_milestones(text: str) -> tuple[int, ...]:
    """`lr_milestones` as sample counts ("" is none); ValueError unless positive and increasing."""
    milestones = tuple(int(part) for part in text.split(",")) if text.strip() else ()
    if any(m <= 0 for m in milestones) or list(milestones) != sorted(set(milestones)):
        raise ValueError(text)
    return milestones


def _check_stragglers(cfg: RunConfig) -> None:
    _require(cfg.step_sigma >= 0, "step_sigma", f"must be non-negative, got {cfg.step_sigma}")
    _require(cfg.step_sigma <= 3, "step_sigma", f"must be at most 3 (a factor of e^3 per sigma), got {cfg.step_sigma}")
    _require(cfg.slow_clients >= 0, "slow_clients", f"must be non-negative, got {cfg.slow_clients}")
    _require(cfg.clients is None or cfg.slow_clients <= cfg.clients, "slow_clients",
             f"must be at most clients ({cfg.clients}), got {cfg.slow_clients}")
    _require(1 <= cfg.slow_factor <= 100, "slow_factor", f"must be in [1, 100], got {cfg.slow_factor}")
    _require(0 <= cfg.pause_prob < 1, "pause_prob", f"must be in [0, 1), got {cfg.pause_prob}")
    _require(0 <= cfg.pause_time <= 3600, "pause_time", f"must be in [0, 3600] seconds, got {cfg.pause_time}")
    _require(cfg.backup_workers >= 0, "backup_workers", f"must be non-negative, got {cfg.backup_workers}")
    _require(not cfg.backup_workers or cfg.mode == "sync", "backup_workers", "needs --mode sync")
    _require(cfg.clients is None or cfg.backup_workers < cfg.clients, "backup_workers",
             f"must be below clients ({cfg.clients}): a step needs one gradient, got {cfg.backup_workers}")


def is_user_code(spec: str) -> bool:
    """Whether a model or data setting names user code (`module:name`) rather than a
    built-in model, a dataset name, a .npz file or a folder."""
    return ":" in spec and not spec.endswith(".npz")


def _fault_ok(text: str) -> bool:
    parts = text.split(":")
    return not text or (len(parts) == 2 and all(p.isdigit() for p in parts))


def load_config(path: str | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The config file's values, then the overrides (flags given on the command line)."""
    return RunConfig(**config_values(path, overrides))


def config_values(path: str | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings asked for, not yet checked against each other: the config file's
    values, then the overrides (None: not given). Unknown keys are refused here."""
    values: dict[str, Any] = {}
    if path:
        values.update(_read_toml(path))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if "model_args" in values:
        values["model_args"] = model_args_text(values["model_args"])
    known = {f.name for f in fields(RunConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{f'config {path}: ' if path else ''}unknown key {unknown[0]!r}")
    return values


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"config {path}: cannot read ({e.strerror})") from None
    except ValueError as e:  # TOMLDecodeError, bytes that are not UTF-8, an int of over 4300 digits
        raise ConfigError(f"config {path}: not valid TOML ({e})") from None
    nested = [k for k, v in table.items() if isinstance(v, dict) and k != "model_args"]
    if nested:
        raise ConfigError(f"config {path}: unknown section [{nested[0]}] (keys are top-level)")
    return table
