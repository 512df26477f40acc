"""Run configuration: one frozen dataclass, loaded from TOML and overridden by flags.

Every value is checked when the object is created (runconfig/checks.py), so a
bad run fails with one line (`ConfigError`, naming the field) before any MPI process
starts. Config keys and command-line flags share names (`n_sync` is `--n-sync`).

The fields are declared group by group, each with its group's maker (`_schedule(...)`),
so the declaration is the one table of groups: `asgd train --help` shows a section for
each, and a config file may hold a group's keys in its table (`[schedule]`,
runconfig/file.py) or at top level; runconfig/load.py reads a file's and the flags' values.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from paramserver.faults import Fault, fault_on
from paramserver.rules import RULES, rule_class
from runconfig.checks import (PRECISIONS, USER_CODE, USER_CODE_KEYS, ConfigError, check, is_user_code,
                              model_args_text, model_arguments)
from rundir.modes import Mode

# what importers take from here; the checks' words and the fault live in runconfig/checks.py and faults
__all__ = ["GROUPS", "PRECISIONS", "USER_CODE", "USER_CODE_KEYS", "ConfigError", "Fault", "RunConfig",
           "auto_momentum", "is_user_code", "model_args_text", "model_arguments"]

# the groups of settings, in the order --help shows them: the table name in a config
# file (no field's name) -> the section's title
GROUPS = {
    "common": "common settings",
    "inputs": "model, data and starting weights",
    "server": "server and rules",
    "schedule": "learning-rate schedule",
    "client": "the optimizer's details",
    "stragglers": "stragglers and faults",
    "evaluation": "evaluation and records",
    "simulator": "simulator",
    "performance": "performance",
}


def _group(name: str) -> Callable[[Any, str], Any]:
    """The maker of one group's keys: a key's default and the help line its flag shows;
    its group rides in the field's metadata."""
    def key(default: Any, help: str) -> Any:
        return field(default=default, metadata={"help": help, "group": name})
    return key


_common, _inputs, _server, _schedule, _client, _stragglers, _evaluation, _simulator, _performance = map(_group, GROUPS)


@dataclass(frozen=True)
class RunConfig:
    """Every knob of a run; defaults give the demo (Fashion-MNIST, small CNN)."""

    # the settings most runs set ([common] in a config file)
    out: str = _common("", "run directory (default: runs/<time>-c<K>-n<N>)")
    backend: str = _common("mpi", "mpi (real ranks) or sim (every rank in one process, on a virtual clock)")
    mode: str = _common(Mode.ASYNC.value, "async (parameter server), sync (allreduce gradients each step) or local-sgd "
                                 "(average weights every n_sync steps)")
    clients: Optional[int] = _common(None, "number of clients K (default: every MPI rank but the server; every rank "
                                           "in sync modes)")
    n_sync: int = _common(1, "push the update and fetch the weights every N minibatches")
    steps: int = _common(500, "minibatches per client")
    epochs: int = _common(0, "instead of steps: passes over each client's shard of the training set (the smallest "
                             "shard's, whole minibatches); steps is then derived from it and recorded (0: steps "
                             "decides)")
    batch_size: int = _common(64, "samples per minibatch")
    lr: float = _common(0.03, "learning rate of one minibatch (the clients', and the server's where it steps; "
                              "lr_scaling scales it for updates that average more)")
    momentum: float = _common(0.9, "client SGD momentum (the buffer stays on the client), or auto: lowered with the "
                                   "number of clients to offset the momentum asynchrony adds")
    weight_decay: float = _common(5e-4, "client weight decay (L2 in sgd and adam, decoupled in adamw)")
    optimizer: str = _common("sgd", "the optimizer where the step is taken: the server's under a gradient rule "
                                    "(sgd, fresh), the clients' under a delta rule, and in every client's local steps: "
                                    "sgd, adam, adamw (torch's, at lr and weight_decay; momentum is sgd's), or "
                                    "package.module:factory (or file.py:factory) called as factory(params, lr=, "
                                    "momentum=, weight_decay=) with the keywords it takes, returning a "
                                    "torch.optim.Optimizer")
    rule: str = _common("fresh", "server update rule: " + ", ".join(RULES) + " (docs/rules.md)")
    seed: int = _common(0, "seed of the initial weights, shards and data order")
    warm_start: int = _common(0, "train this many minibatches on one client first; every client starts there")
    resume: str = _common("", "continue the run in this directory from its last checkpoint")
    data: str = _common("fashion-mnist", "fashion-mnist, a .npz file (x, y[, x_test, y_test]), an image folder "
                                         "(train/, val/), or package.module:factory (or file.py:factory) returning a "
                                         "train and a test torch Dataset (docs/your-model.md)")
    model: str = _common("cnn", "cnn (small, for 28x28 data), convnet (cuda-convnet ImageNet network), or "
                                "package.module:factory (or file.py:factory) returning an nn.Module, called with "
                                "(input_shape, num_classes) or nothing (docs/your-model.md)")
    device: str = _common("auto", "auto (cuda:<local rank mod GPUs> with CUDA, else cpu), cpu or cuda[:N]")
    quiet: bool = _common(False, "no progress bar or final line")

    # model, data and starting weights ([inputs] in a config file)
    init: str = _inputs("", "start from the weights of this checkpoint (a run's checkpoint/latest.npz)")
    data_dir: str = _inputs("", "folder holding Fashion-MNIST's four *-ubyte.gz files")
    model_args: str = _inputs("", "keyword arguments for your model factory, a JSON object ('{\"width\": 64}'; a "
                                  "table in a config file, a dict in experiments.api.train)")
    loss: str = _inputs("", "package.module:function (or file.py:function) taking (outputs, targets) and returning a "
                            "scalar tensor (default: cross-entropy)")

    # server and rules ([server] in a config file)
    servers: int = _server("auto", "server ranks (0..S-1), each holding a contiguous slice of the weights; clients "
                                   "push and pull every slice at once (auto: in the simulator, the fewest whose "
                                   "busiest is busy at most half the time (a third under fresh), from the costs; "
                                   "one over MPI; a resume's recorded count)")
    n_push: Optional[int] = _server(None, "push every N minibatches (default: n_sync)")
    n_fetch: Optional[int] = _server(None, "fetch every N minibatches (default: n_sync)")
    server_lr: Optional[float] = _server(None, "learning rate of the sgd, fresh and adagrad rules "
                                                "(default: the rule's, adagrad's 0.01; else lr)")
    server_momentum: Optional[float] = _server(None, "momentum of the server's SGD step, sgd and fresh rules "
                                                     "(default: the clients' momentum; 0.9 with momentum auto)")
    dc_lambda: Optional[float] = _server(None, "dcasgd: lambda0 of the adaptive delay compensation (0: the add rule; "
                                               "default: the rule's, DC-ASGD-a's 2)")
    easgd_beta: float = _server(0.9, "easgd: the elastic coefficient is beta / clients")
    fresh_batch: int = _server(0, "fresh: minibatches of fresh gradients a step gathers (0: a push of every client, "
                                  "clients x n_push; auto: from the gradient noise scale, in [1, 4 x clients])")
    max_staleness: int = _server(0, "fresh: versions a gathered gradient may be behind; staler pushes are dropped")
    fresh_reply: str = _server("auto", "fresh: a client whose push joins a step being gathered waits for the step "
                                       "(wait), computes again at the same weights (again), or either, whichever its "
                                       "measured pace says comes first (auto; with several servers server 0 decides)")
    overdue: float = _server(3.0, "fresh with fresh_reply auto: a step goes without a client that has computed for "
                                  "this many times its measured mean compute time (one likely down; its late push "
                                  "is dropped as stale); 0: the step waits for it")
    nesterov_every: int = _server(0, "nesterov: pushes between the server's momentum updates (0: clients)")
    nesterov_momentum: Optional[float] = _server(None, "the outer step's momentum: delayed Nesterov's beta (rule "
                                                       "nesterov) or synchronous DiLoCo's Nesterov momentum "
                                                       "(local-sgd); default 0: plain averaging of each round "
                                                       "(DiLoCo's published: 0.9)")
    outer_lr: Optional[float] = _server(None, "the outer step's lr: delayed Nesterov's eps (rule nesterov) or "
                                              "synchronous DiLoCo's outer SGD lr (local-sgd); default 1 - the outer "
                                              "momentum: amplification lr / (1 - momentum) 1 (DiLoCo's: 0.7)")
    nesterov_activation: float = _server(0.0, "nesterov: the activation c of delayed Nesterov, in [0, 1]: the share "
                                              "of the momentum's look-ahead taken at every push, not only the N-th")
    nesterov_reply: str = _server("auto", "nesterov: answer a push at once (now, Liu et al.'s Algorithm 3), hold the "
                                          "round's early pushers until its momentum step (round: at equal speeds "
                                          "with N = K, synchronous DiLoCo), or hold where the clients' measured pace "
                                          "says the round completes before the pusher could push again (auto; with "
                                          "several servers server 0 decides); paramserver/reply/policy.py")
    dylu: bool = _server(False, "dynamic local updates (Liu et al. 2024): each client's window of local minibatches "
                                "between pushes is n_sync (n_push) times its speed over the fastest running client's, "
                                "as the server measures them (floored, at least 1), so slow clients push as often as "
                                "fast ones; async mode, rules whose clients push their weight change (add, nesterov, "
                                "...)")

    # learning-rate schedule ([schedule] in a config file)
    lr_warmup: int = _schedule(0, "samples over which the lr ramps linearly up to its value (0: none); samples "
                                  "pushed to the server (async, dropped ones too) or steps x clients x batch_size "
                                  "(collective modes)")
    lr_schedule: str = _schedule("constant", "constant, cosine (to lr_floor over the run's planned samples) or step "
                                             "(times lr_step_factor at each of lr_milestones)")
    lr_floor: float = _schedule(0.0, "cosine: the last lr, as a fraction of the peak")
    lr_milestones: str = _schedule("", "step: comma-separated sample counts at which the lr is multiplied")
    lr_step_factor: float = _schedule(0.1, "step: what the lr is multiplied by at each milestone")
    lr_scaling: str = _schedule("sqrt", "none, linear (the lr times the client minibatches n one update averages: K "
                                        "in sync mode, K - backup_workers with backup workers, fresh's gathered "
                                        "minibatches, 1 otherwise), sqrt (the lr times sqrt(n)) or adascale (async, "
                                        "one server: fresh's step times AdaScale's gain from the measured gradient "
                                        "noise, 1 to n, and the schedule's progress counted in gain-weighted steps)")
    lr_scale_warmup: int = _schedule(80, "updates (steps of the server, or of sync) over which lr_scaling's "
                                         "multiplier ramps linearly in from 1 (one minibatch's lr; Goyal et al.'s "
                                         "gradual warmup) to its value (0: at once; adascale has none)")

    # the optimizer's details ([client] in a config file)
    nesterov: bool = _client(False, "sgd: Nesterov momentum (torch.optim.SGD's nesterov), on the clients and the server")
    clip_grad_norm: float = _client(0.0, "clip a step's gradient to this total L2 norm, as "
                                         "torch.nn.utils.clip_grad_norm_: each local step's, and under a gradient rule "
                                         "the gathered gradient the server steps with (0: no clipping)")
    precision: str = _client("fp32", "the clients' forward and loss: fp32, bf16 (torch.autocast, CPU or GPU) or fp16 "
                                     "(torch.autocast with torch's GradScaler; for GPUs)")

    # stragglers and faults ([stragglers] in a config file)
    step_sigma: float = _stragglers(0.0, "stragglers: each minibatch's compute time times a lognormal factor "
                                         "exp(sigma z) (median 1), seeded; simulated, or slept for real under MPI")
    slow_clients: int = _stragglers(0, "stragglers: the last N clients compute slow_factor times slower")
    slow_factor: float = _stragglers(2.0, "stragglers: how much slower the slow clients are")
    pause_prob: float = _stragglers(0.0, "stragglers: chance that a minibatch is followed by a pause of pause_time")
    pause_time: float = _stragglers(0.0, "stragglers: seconds a pause lasts")
    speed_spread: float = _stragglers(0.0, "uneven hardware: each client's speed drawn once from the seed, "
                                           "log-uniform in [speed_spread, 1] of the fastest; a minibatch takes its "
                                           "base time / speed (0: equal speeds)")
    client_speeds: str = _stragglers("", "uneven hardware: each client's speed listed, in (0, 1] of the fastest "
                                         "(\"1,0.5,0.25\": one a client)")
    budget: str = _stragglers("run", "uneven hardware: whose the steps are: run (clients x steps in all; async: "
                                     "every client computes until the server has had that many, so fast clients "
                                     "compute more and none idles) or client (each computes steps minibatches; the "
                                     "collective modes' clients step together, so there the two are one)")
    mtbf: float = _stragglers(0.0, "failures: mean time between a client's failures, in base minibatch times of "
                                   "computing (exponential, seeded); the work since its last push is lost (0: none)")
    failure_length: float = _stragglers(20.0, "failures: base minibatch times a failed client is down before it "
                                              "comes back with the server's weights")
    backup_workers: int = _stragglers(0, "sync mode: each step averages the first K - b gradients to arrive and "
                                         "drops the b slowest (Chen et al. 2016)")
    on_client_failure: str = _stragglers("abort", "abort (end the job naming the client; resumable) or continue (the "
                                                  "server carries on with the other clients; async mode)")
    stall_timeout: float = _stragglers(600.0, "seconds any rank waits for a peer before failing the job")
    inject_fault: str = _stragglers("", "RANK:STEP; raise an exception there (for tests)")
    joinable: bool = _stragglers(False, "async: clients may join the running job (asgd join RUN_DIR; the simulator: "
                                        "joins), each a new client on a lost client's shard or one of its own "
                                        "(docs/joining.md)")
    max_clients: int = _stragglers(0, "joinable: the most clients training at once; a join beyond it is refused "
                                      "(0: no bound)")
    spares: int = _stragglers(0, "async, continue, one server: ranks started with the job beyond its clients' (MPI: "
                                 "mpiexec -n K+1+N), each waiting to join in a lost client's place; the simulator "
                                 "models them (docs/joining.md)")

    # evaluation and records ([evaluation] in a config file)
    eval_every: int = _evaluation(0, "server versions between test evaluations (0: about 20 a run, fewer where 20 "
                                     "would take more than a quarter of training's compute)")
    eval_samples: int = _evaluation(0, "test samples per point of the test-error curve, a fixed seeded subset (0: "
                                       "1,000, or the whole split if smaller); the final weights are always measured "
                                       "on the whole test split")
    eval_live: str = _evaluation("auto", "measure the curve while the run trains, on a thread of the recording rank: "
                                         "on (a quarter of the thread's time), off (after training), or auto (on "
                                         "where its host has a core more than the run's ranks there; else at a "
                                         "trickle, a twentieth, so the curve shows while training keeps its cores)")
    stop_at_error: float = _evaluation(0.0, "end the run (every rank, with its last pushes recorded) once a point of "
                                            "the test-error curve reaches this error; the summary says complete: "
                                            "reached target (0: train every step); refused for outputs that do "
                                            "not classify")
    stop_at_loss: float = _evaluation(0.0, "end the run as stop_at_error does once a point of the curve's test loss "
                                           "is at or below this (0: none)")
    stop_at_metric: float = _evaluation(0.0, "end the run as stop_at_error does once a point of the curve's metric "
                                             "(your --metric) reaches this: at or below it, or at or above where the "
                                             "metric says higher_is_better (0: none; docs/your-model.md)")
    metric: str = _evaluation("", "package.module:function (or file.py:function) taking (outputs, targets) of a test "
                                  "batch and returning its mean, or a (total, count) pair summed over the test pass: "
                                  "a column of the curve (eval.jsonl test_metric) and final_test_metric in the "
                                  "summary, the curve's measure without classes (docs/your-model.md)")
    keep_best: bool = _evaluation(False, "keep the weights of the curve's best point (test error; without classes, "
                                         "the metric or the loss) in RUN/checkpoint/best.npz (asgd export --best "
                                         "exports them)")
    checkpoint_every: float = _evaluation(60.0, "seconds of the run's clock (virtual in the simulator) after which a "
                                                "checkpoint is taken between the curve's points, so an interrupt loses "
                                                "at most about this much training (0: at the curve's points only)")
    keep_snapshots: bool = _evaluation(False, "keep the weight snapshots after evaluating them")
    tensorboard: bool = _evaluation(False, "also write TensorBoard scalars to RUN/tensorboard/ as the run goes")
    debug: bool = _evaluation(False, "on a failure, print the full traceback too (it always goes to RUN/error.log)")

    # simulator ([simulator] in a config file)
    sim_profile: str = _simulator("measured", "sim: the costs below by default: measured (this host, this model) or "
                                              "paper (the paper's ImageNet model, GPUs and network; "
                                              "docs/simulator.md)")
    sim_step_time: float = _simulator(0.0, "sim: seconds per minibatch (0: the profile's; measured: from real steps)")
    sim_apply_time: float = _simulator(0.0, "sim: server seconds per push, checks, apply and logs, each "
                                            "server's for its slice (0: the profile's; measured: the real handler's)")
    sim_calibrate: str = _simulator("", "sim: the server's time a push as this MPI run directory's server measured "
                                        "it (its summary's server_push_us, but for taking the push off the wire, "
                                        "which the simulated transfer stands for); sim_apply_time, when set, comes "
                                        "first")
    sim_bandwidth: float = _simulator(0.0, "sim: bytes/s of a transfer (0: the profile's; measured: 1.1e10, MPI on "
                                           "the 2-core reference host)")
    sim_latency: float = _simulator(0.0, "sim: seconds added to every transfer (0: the profile's; measured: 2e-6)")
    sim_push_bytes: int = _simulator(0, "sim: bytes a push (and a pull) carries on the wire (0: the profile's; "
                                        "measured: the model's)")
    sim_client_links: str = _simulator("", "sim: each client's link, BYTES_PER_S or BYTES_PER_S@LATENCY_S, one for "
                                           "all or one for each client, separated by commas (default: its sends at "
                                           "sim_bandwidth after sim_latency; docs/simulator.md)")
    sim_regions: str = _simulator("", "sim: groups of clients that share one link, client indices or ranges in a "
                                      "group, groups separated by semicolons (0-3;4-7)")
    sim_region_bandwidth: float = _simulator(0.0, "sim: bytes/s of each region's link, each way (0: unlimited)")
    sim_region_latency: float = _simulator(0.0, "sim: seconds a region's link adds to each transfer")
    sim_server_bandwidth: float = _simulator(0.0, "sim: bytes/s of each server's link, each way, carrying its slice "
                                                  "of every push and reply (0: unlimited)")
    speed_jitter: float = _simulator(0.0, "sim: client i's step time is sim_step_time * U(1-j, 1+j), seeded")
    replay: str = _simulator("", "sim: apply pushes in the order of this run directory's server.jsonl")
    joins: str = _simulator("", "sim: C@T[,C@T...]: client C (K, K+1, ... in time order) joins the running job at "
                                "virtual second T, pulling the server's weights first (docs/joining.md)")

    # performance ([performance] in a config file)
    threads: int = _performance(0, "torch threads per client (0: a node's cores shared by its client ranks; all "
                                   "cores in the simulator)")
    data_workers: int = _performance(0, "DataLoader worker processes that read each client's next minibatches ahead, "
                                        "in the same order (into pinned memory for a GPU client); 0: the client "
                                        "reads them itself. MPI backend")
    server_device: str = _performance("cpu", "where the server keeps the weights and applies pushes: cpu (numpy) or "
                                             "cuda[:N] (a GPU; weights go to MPI through a pinned host buffer)")
    server_kernel: str = _performance("auto", "how the server applies a push: auto (the rule's fused formula as one "
                                              "kernel: compiled by g++ for the CPU where g++ is found, by cupy on a "
                                              "GPU; else torch) or torch (the rule's torch arithmetic, several "
                                              "passes a push)")
    compress: str = _performance("none", "none, fp16, bf16, int8 or int4: pushes on the wire as 16-bit floats, or "
                                         "8- or 4-bit integers with a float32 scale per block of 256, with error "
                                         "feedback; the server decodes them and keeps float32 weights")
    compress_pulls: bool = _performance(False, "pulls (the weights a reply carries) through the same codec too, "
                                               "rounded afresh each time (no error feedback: nothing accumulates)")
    fragments: int = _performance(1, "async, either backend: a push in P fragments (slices of the vector) sent in turn "
                                     "every n_sync/P minibatches while the client computes on (Streaming DiLoCo)")

    def __post_init__(self) -> None:
        check(self)

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
        return auto_momentum(clients) if self.mode == Mode.ASYNC else AUTO_BASE_MOMENTUM

    @property
    def outer_momentum(self) -> float:
        """The outer step's momentum: as set, or 0 (docs/rules.md measures why: it lags
        by about 1 / (1 - momentum) rounds, and did not pay on an LM at tens of rounds)."""
        return 0.0 if self.nesterov_momentum is None else self.nesterov_momentum

    @property
    def outer_step_lr(self) -> float:
        """The outer step's lr: as set, or 1 - its momentum, so that its amplification,
        outer lr / (1 - momentum), is 1: in steady state a round moves the weights by the
        clients' mean change, as plain averaging (the default, momentum 0) does."""
        return self.outer_lr if self.outer_lr is not None else round(1.0 - self.outer_momentum, 12)

    @property
    def takes_outer_step(self) -> bool:
        """Whether the run takes an outer step: local-sgd's (synchronous DiLoCo) or, in
        async mode, its rule's (nesterov: asynchronous DiLoCo)."""
        outer_rule = getattr(rule_class(self.rule), "outer_step", False)
        return self.mode == Mode.LOCAL_SGD or (self.mode == Mode.ASYNC and outer_rule)

    @property
    def effective_server_lr(self) -> float:
        """The server's lr: as set, else the rule's own (adagrad's), else the clients' lr."""
        return rule_class(self.rule).setting(self, "server_lr", self.lr)

    @property
    def rule_settings_used(self) -> dict[str, float]:
        """What the rule's settings took where the user gave none (config.json's `KEY_used`):
        the server's lr where the server steps on gradients, and every key the rule sets."""
        rule = rule_class(self.rule)
        used = {f"{key}_used": rule.setting(self, key) for key in rule.DEFAULTS}
        return {**used, "server_lr_used": self.effective_server_lr} if rule.pushes == "gradient" else used

    @property
    def effective_server_momentum(self) -> float:
        """The server's SGD momentum: as set, or the clients' (so one client of `sgd` or
        `fresh` is torch.optim.SGD with the run's momentum)."""
        if self.server_momentum is not None:
            return self.server_momentum
        return AUTO_BASE_MOMENTUM if self.momentum == "auto" else self.momentum

    def fault_for(self, rank: int, who: str, unit: str = "step") -> Fault | None:
        """The fault `inject_fault` puts on `rank`, if any."""
        return fault_on(self.inject_fault, rank, who, unit)

    def async_versions(self, clients: int) -> int:
        """The versions an async run of `clients` makes: one a push (a streamed fragment is
        one), or as its rule gathers them."""
        pushes = math.ceil(self.steps * self.fragments / self.push_every)
        return rule_class(self.rule).versions(self, clients * pushes, clients)

    @property
    def run_budget(self) -> bool:
        """Whether the server ends the run once its clients' steps sum to the run's budget:
        async only (a collective mode's clients step together, so each one's budget is the
        run's share already)."""
        return self.budget == "run" and self.mode == Mode.ASYNC

    def client_steps(self, clients: int) -> int:
        """The most minibatches one client may compute: its steps, or under a run-wide
        budget the run's (the server stops it sooner, once the run's are in)."""
        return self.steps * clients if self.run_budget else self.steps

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
