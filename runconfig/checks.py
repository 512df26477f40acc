"""The run config's checks, one function for each group of settings, and the words and
patterns they accept.

Every check runs as a RunConfig is made, so a bad run fails with one line
(`ConfigError`, naming the field) before any MPI process starts. The checks read the
config's fields by name and import nothing of runconfig.settings, which calls them.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import sys
from dataclasses import fields
from typing import Any, get_type_hints

from paramserver.faults import fault_ok
from paramserver.reply.policy import check_keys as reply_keys
from paramserver.rules import RULES, rule_class
from paramserver.schedule import parse_milestones
from paramserver.wire.compress import CODECS
from runconfig.require import ConfigError, parsed as _parsed, require as _require
from runconfig.fragchecks import check_fragments
from runconfig.simchecks import check_simulator
from rundir.modes import Mode

BACKENDS = ("mpi", "sim")
OPTIMIZERS = ("sgd", "adam", "adamw")  # the clients' (clients/optimizers.py); or a factory of the user's
PRECISIONS = ("fp32", "bf16", "fp16")
MODES = tuple(mode.value for mode in Mode)
FAILURE_POLICIES = ("abort", "continue")
AUTO_KEYS = ("momentum", "fresh_batch", "servers")  # keys that also take the word "auto"
LR_SCHEDULES = ("constant", "cosine", "step")
LR_SCALINGS = ("none", "linear", "sqrt", "adascale")
# user code named in a config (clients/user/code.py imports it): a .py file, or a module (recorded with
# the folder it was found in, FOLDER:module:name, so it imports again from any working directory), a name in it
USER_CODE = re.compile(r"(?:(?P<file>[^:]+\.py)|(?:(?P<folder>[^:]+):)?(?P<module>[A-Za-z_][\w.]*))"
                       r":(?P<name>[A-Za-z_][\w.]*)")
USER_CODE_KEYS = ("model", "data", "loss", "metric", "optimizer")  # the settings that may name user code


def check(cfg: Any) -> None:
    """Every field's type, then each group's values (a RunConfig's, as it is made)."""
    _check_types(cfg)
    if cfg.servers == "auto":
        _auto_servers(cfg)
    for concern in (_check_common, _check_inputs, _check_server, _check_schedule, _check_client,
                    _check_stragglers, _check_evaluation, check_simulator, _check_performance, check_fragments):
        concern(cfg)


@functools.cache
def base_types(config_class: type) -> dict[str, type]:
    """The base type of each field (Optional[int] -> int). Worked out once a process:
    `get_type_hints` evaluates every annotation anew (about 1 ms), and the command's
    parser and every RunConfig's checks ask for them."""
    hints = get_type_hints(config_class)
    base = {}
    for f in fields(config_class):
        args = getattr(hints[f.name], "__args__", None)
        base[f.name] = args[0] if args else hints[f.name]
    return base


def _check_types(cfg: Any) -> None:
    for name, kind in base_types(type(cfg)).items():
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


def _auto_servers(cfg: Any) -> None:
    """`servers = auto`, the default: left for the simulator to size from the costs
    (experiments/sim/costs.py, by experiments/run/sizing.py) where it knows them before
    the run, an async simulation the config lets have several servers; elsewhere one
    server, so no one who never typed --servers is refused for it. Over MPI the ranks are
    fixed before any rank could time a push (docs/training.md, How many servers); the
    collective modes have no server; a resume reads the count its run recorded before it
    gets here (experiments/run/resume.py). Whether more than one is allowed is asked of
    the checks themselves with two servers (adascale, a gathered gradient's
    clipping or noise scale refuse several, each in its own check), so no second list
    of them can drift from theirs."""
    if cfg.backend == "sim" and cfg.mode == Mode.ASYNC and not cfg.resume:
        try:
            dataclasses.replace(cfg, servers=2)
            return
        except ConfigError:
            pass  # a setting that needs one server, or a fault of the config's own that the checks below name
    object.__setattr__(cfg, "servers", 1)


def _check_magnitude(name: str, value: Any) -> None:
    """Numbers torch and numpy can take: an infinite rate or timeout trains on nothing or
    never ends, and ints past 64 bits overflow torch.manual_seed and numpy arrays."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}: must be a finite number, got {value}")
    if isinstance(value, int) and not -2**63 <= value < 2**63:
        raise ConfigError(f"{name}: must fit in 64 bits, got {value}")


def _at_least_one(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        _require(value is None or value >= 1, name, f"must be at least 1, got {value}")


def _check_common(cfg: Any) -> None:
    _require(cfg.backend in BACKENDS, "backend", f"unknown backend {cfg.backend!r} (choose from {', '.join(BACKENDS)})")
    _require(cfg.mode in MODES, "mode", f"unknown mode {cfg.mode!r} (choose from {', '.join(MODES)})")
    _require(cfg.clients is None or cfg.clients >= 1, "clients", f"must be at least 1, got {cfg.clients}")
    _require(cfg.epochs >= 0, "epochs", f"must be non-negative (0: steps decides), got {cfg.epochs}")
    _require(not (cfg.epochs and cfg.replay), "epochs", "a replay repeats a recorded run's steps; leave epochs out")
    _at_least_one(cfg, "n_sync", "steps", "batch_size")
    _require(cfg.budget in ("client", "run"), "budget", f"must be client or run, got {cfg.budget!r}")
    _require(cfg.lr > 0, "lr", f"must be positive, got {cfg.lr}")
    _require(cfg.momentum is None or cfg.momentum == "auto" or 0 <= cfg.momentum < 1, "momentum",
             f"must be in [0, 1), got {cfg.momentum}")
    _require(cfg.weight_decay >= 0, "weight_decay", f"must be non-negative, got {cfg.weight_decay}")
    _require(cfg.optimizer in OPTIMIZERS or is_user_code(cfg.optimizer), "optimizer",
             f"expected {', '.join(OPTIMIZERS)} or package.module:factory, got {cfg.optimizer!r}")
    _require(cfg.seed >= 0, "seed", f"must be non-negative, got {cfg.seed}")
    _require(cfg.warm_start >= 0, "warm_start", f"must be non-negative, got {cfg.warm_start}")
    _require(re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.device) is not None,
             "device", f"expected auto, cpu or cuda[:N], got {cfg.device!r}")


def _check_inputs(cfg: Any) -> None:
    """User code (the model, data, loss, metric and optimizer a setting may name) and
    the model factory's keywords."""
    for name in ("loss", "metric") + tuple(n for n in ("model", "data", "optimizer") if is_user_code(getattr(cfg, n))):
        value = getattr(cfg, name)
        _require(not value or USER_CODE.fullmatch(value) is not None, name,
                 f"expected package.module:name (or FOLDER:package.module:name) or path/file.py:name, "
                 f"got {value!r}")
    model_arguments(cfg)
    _require(not cfg.model_args or is_user_code(cfg.model), "model_args",
             f"only for a model factory of yours (package.module:factory); the built-in {cfg.model} takes none")


def _check_server(cfg: Any) -> None:
    """The server's settings; each rule's own keys and the reply policy's (whichever
    runs, as every key is checked), then the chosen rule's refusals: "field: reason" lines the rules write
    (paramserver/rules/)."""
    _at_least_one(cfg, "n_push", "n_fetch")
    _require(cfg.server_lr is None or cfg.server_lr > 0, "server_lr", f"must be positive, got {cfg.server_lr}")
    _require(cfg.server_momentum is None or 0 <= cfg.server_momentum < 1, "server_momentum",
             f"must be in [0, 1), got {cfg.server_momentum}")
    try:
        chosen = rule_class(cfg.rule)
    except ValueError as error:  # an unknown name: the rules' own line
        raise ConfigError(str(error)) from None
    problems = [rule.check_keys(cfg) for rule in RULES.values()] + [reply_keys(cfg), chosen.check(cfg)]
    for problem in problems:
        if problem:
            raise ConfigError(problem)
    _check_dylu(cfg, chosen)
    _check_outer(cfg, chosen)
    if cfg.servers == "auto":
        return  # the simulator picks (experiments/run/sizing.py) and checks its pick as it makes the run's config
    _require(cfg.servers >= 1, "servers", f"must be at least 1, got {cfg.servers}")
    _require(cfg.servers == 1 or cfg.mode == Mode.ASYNC, "servers", "more than one server needs --mode async")
    _require(cfg.servers == 1 or not cfg.resume or cfg.backend == "sim", "servers",
             "a run with more than one server cannot be resumed (its servers' slices are not checkpointed together)")


def _check_outer(cfg: Any, rule: Any) -> None:
    """An outer step's settings (their values are the nesterov rule's `check_keys`) only
    where one is taken: local-sgd's (synchronous DiLoCo) or the nesterov rule's
    (asynchronous DiLoCo); anywhere else they would be ignored without a word."""
    given = [name for name in ("outer_lr", "nesterov_momentum") if getattr(cfg, name) is not None]
    if not given or cfg.takes_outer_step:
        return
    taker = f"--mode {cfg.mode}" if cfg.mode != Mode.ASYNC else f"--rule {cfg.rule}"
    why = (" (its clients push gradients; the server's optimizer takes the step)" if rule.pushes == "gradient"
           and cfg.mode == Mode.ASYNC else "")
    raise ConfigError(f"{given[0]}: {taker} takes no outer step{why}; the outer step is --mode local-sgd's "
                      f"(synchronous DiLoCo) or --rule nesterov's (asynchronous DiLoCo)")


def _check_dylu(cfg: Any, rule: Any) -> None:
    """DyLU sets the window of a client's local steps (paramserver/reply/dylu.py): only where
    an async server measures the clients, and a window's work is the change a client
    pushes (a gradient rule's server steps with a window's gradients: `fresh` balances
    the clients by gathering a fixed batch)."""
    if not cfg.dylu:
        return
    _require(cfg.mode == Mode.ASYNC, "dylu", "needs --mode async (the server measures each client's speed from its "
                                          "pushes; the collective modes step in lockstep)")
    _require(rule.pushes == "delta", "dylu",
             f"needs a rule whose clients push their weight change (add, nesterov, ...); under {cfg.rule} they push "
             f"{'their weights' if rule.pushes == 'weights' else 'summed gradients, the server steps with them'}")
    _require(cfg.push_every == cfg.fetch_every, "dylu",
             f"needs n_push == n_fetch (each push fetches, and its reply sets the next window), got n_push "
             f"{cfg.push_every} and n_fetch {cfg.fetch_every}")
    _require(not cfg.replay, "dylu", "a replay repeats a recorded order of pushes; the windows would follow the "
                                     "replay's own speeds")


def _check_schedule(cfg: Any) -> None:
    for name in ("lr_warmup", "lr_scale_warmup"):
        _require(getattr(cfg, name) >= 0, name, f"must be non-negative, got {getattr(cfg, name)}")
    _require(cfg.lr_schedule in LR_SCHEDULES, "lr_schedule",
             f"unknown schedule {cfg.lr_schedule!r} (choose from {', '.join(LR_SCHEDULES)})")
    _require(0 <= cfg.lr_floor <= 1, "lr_floor", f"must be in [0, 1] (a fraction of the peak lr), got {cfg.lr_floor}")
    _require(0 < cfg.lr_step_factor <= 1, "lr_step_factor", f"must be in (0, 1], got {cfg.lr_step_factor}")
    _require(cfg.lr_scaling in LR_SCALINGS, "lr_scaling",
             f"unknown scaling {cfg.lr_scaling!r} (choose from {', '.join(LR_SCALINGS)})")
    _require(cfg.lr_scaling != "adascale" or cfg.mode == Mode.ASYNC, "lr_scaling",
             "adascale needs --mode async (its gain is from the gradient noise the server measures)")
    _require(cfg.lr_scaling != "adascale" or cfg.servers == 1, "lr_scaling",
             "adascale needs servers = 1 (each server sees only its slice's gradient norms)")
    milestones = _parsed(parse_milestones, cfg.lr_milestones)
    _require(milestones is not None, "lr_milestones",
             f"expected increasing positive sample counts separated by commas, got {cfg.lr_milestones!r}")
    _require(cfg.lr_schedule == "step" or not milestones, "lr_milestones", "needs lr_schedule = step")
    _require(cfg.lr_schedule != "step" or bool(milestones), "lr_schedule", "step needs lr_milestones")


def _check_client(cfg: Any) -> None:
    _require(cfg.clip_grad_norm >= 0, "clip_grad_norm", f"must be non-negative (0: none), got {cfg.clip_grad_norm}")
    _require(not cfg.nesterov or cfg.optimizer == "sgd", "nesterov", f"is sgd's, not {cfg.optimizer}'s")
    _require(not cfg.nesterov or cfg.momentum != 0, "nesterov", "needs momentum (torch's SGD refuses it at 0)")
    _require(cfg.precision in PRECISIONS, "precision", f"expected {', '.join(PRECISIONS)}, got {cfg.precision!r}")


def _check_stragglers(cfg: Any) -> None:
    """Stragglers, backup workers, and what a failure does."""
    _require(cfg.step_sigma >= 0, "step_sigma", f"must be non-negative, got {cfg.step_sigma}")
    _require(cfg.step_sigma <= 3, "step_sigma", f"must be at most 3 (a factor of e^3 per sigma), got {cfg.step_sigma}")
    _require(cfg.slow_clients >= 0, "slow_clients", f"must be non-negative, got {cfg.slow_clients}")
    _require(cfg.clients is None or cfg.slow_clients <= cfg.clients, "slow_clients",
             f"must be at most clients ({cfg.clients}), got {cfg.slow_clients}")
    _require(1 <= cfg.slow_factor <= 100, "slow_factor", f"must be in [1, 100], got {cfg.slow_factor}")
    _require(0 <= cfg.pause_prob < 1, "pause_prob", f"must be in [0, 1), got {cfg.pause_prob}")
    _require(0 <= cfg.pause_time <= 3600, "pause_time", f"must be in [0, 3600] seconds, got {cfg.pause_time}")
    _check_hardware(cfg)
    _require(cfg.backup_workers >= 0, "backup_workers", f"must be non-negative, got {cfg.backup_workers}")
    _require(not cfg.backup_workers or cfg.mode == Mode.SYNC, "backup_workers", "needs --mode sync")
    _require(cfg.clients is None or cfg.backup_workers < cfg.clients, "backup_workers",
             f"must be below clients ({cfg.clients}): a step needs one gradient, got {cfg.backup_workers}")
    _require(cfg.on_client_failure in FAILURE_POLICIES, "on_client_failure",
             f"expected {' or '.join(FAILURE_POLICIES)}, got {cfg.on_client_failure!r}")
    _require(cfg.on_client_failure == "abort" or cfg.mode == Mode.ASYNC, "on_client_failure",
             "continue needs --mode async (a collective cannot go on without a rank)")
    _require(cfg.stall_timeout > 0, "stall_timeout", f"must be positive, got {cfg.stall_timeout}")
    _require(fault_ok(cfg.inject_fault), "inject_fault", f"expected RANK:STEP, got {cfg.inject_fault!r}")
    _require(not cfg.joinable or cfg.mode == Mode.ASYNC, "joinable", "needs --mode async (a client joins the server)")
    _check_spares(cfg)
    _require(cfg.max_clients >= 0, "max_clients", f"must be non-negative (0: no bound), got {cfg.max_clients}")
    _require(not cfg.max_clients or cfg.joinable, "max_clients", "needs --joinable")
    _require(not cfg.max_clients or cfg.clients is None or cfg.max_clients >= cfg.clients, "max_clients",
             f"must be at least clients ({cfg.clients}), got {cfg.max_clients}")


def _check_spares(cfg: Any) -> None:
    """Spare ranks join only where a lost client leaves the run going, through server 0."""
    _require(cfg.spares >= 0, "spares", f"must be non-negative, got {cfg.spares}")
    if not cfg.spares:
        return
    _require(cfg.mode == Mode.ASYNC, "spares", "needs --mode async (a spare joins the server)")
    _require(cfg.on_client_failure == "continue", "spares",
             "needs --on-client-failure continue (under abort a lost client ends the run)")
    _require(not cfg.joins, "spares", "give --joins or --spares, not both (both number the joiners K, K+1, ...)")


def _check_hardware(cfg: Any) -> None:
    """Uneven speeds and failures (clients/stragglers.py)."""
    _require(0 <= cfg.speed_spread <= 1, "speed_spread",
             f"must be in [0, 1] (the slowest speed, a fraction of the fastest; 0: equal), got {cfg.speed_spread}")
    _require(not (cfg.speed_spread and cfg.client_speeds), "client_speeds", "give speed_spread or client_speeds, "
             "not both")
    if cfg.client_speeds:
        speeds = _parsed(parse_speeds, cfg.client_speeds)
        count = None if speeds is None else len(speeds)
        _require(speeds is not None, "client_speeds",
                 f"expected speeds in (0, 1] separated by commas, got {cfg.client_speeds!r}")
        _require(cfg.clients is None or count == cfg.clients, "client_speeds",
                 f"lists {count} speeds for {cfg.clients} clients")
    _require(cfg.mtbf == 0 or cfg.mtbf >= 1, "mtbf",
             f"must be at least 1 base minibatch time (0: no failures), got {cfg.mtbf}")
    _require(cfg.failure_length >= 0, "failure_length", f"must be non-negative, got {cfg.failure_length}")


def _check_evaluation(cfg: Any) -> None:
    for name in ("eval_every", "eval_samples"):
        _require(getattr(cfg, name) >= 0, name, f"must be non-negative (0: automatic), got {getattr(cfg, name)}")
    _require(cfg.eval_live in ("auto", "on", "off"), "eval_live", f"expected auto, on or off, got {cfg.eval_live!r}")
    _require(cfg.checkpoint_every >= 0, "checkpoint_every",
             f"must be non-negative seconds (0: at the curve's points only), got {cfg.checkpoint_every}")
    _require(0 <= cfg.stop_at_error < 1, "stop_at_error",
             f"must be an error in [0, 1) (0: none), got {cfg.stop_at_error}")
    _require(not cfg.stop_at_metric or cfg.metric, "stop_at_metric", "needs a metric to stop at (--metric)")
    for name in ("stop_at_error", "stop_at_loss", "stop_at_metric"):
        value = getattr(cfg, name)
        _require(math.isfinite(value), name, f"must be a finite number (0: none), got {value}")
        _require(not value or cfg.eval_live != "off", name,
                 "needs the curve while the run trains: eval_live on or auto, not off")


def _check_performance(cfg: Any) -> None:
    _require(cfg.threads >= 0, "threads", f"must be non-negative (0: automatic), got {cfg.threads}")
    _require(cfg.threads < 2**31, "threads", f"must be below 2**31 (torch takes a C int), got {cfg.threads}")
    _require(cfg.data_workers >= 0, "data_workers", f"must be non-negative, got {cfg.data_workers}")
    _require(not cfg.data_workers or cfg.backend == "mpi", "data_workers",
             "needs --backend mpi (the simulator's clients read on its virtual clock)")
    _require(re.fullmatch(r"cpu|cuda(:\d+)?", cfg.server_device) is not None, "server_device",
             f"expected cpu or cuda[:N], got {cfg.server_device!r}")
    _require(cfg.server_device == "cpu" or cfg.mode == Mode.ASYNC, "server_device",
             "needs --mode async (only async runs have a server)")
    _require(cfg.server_kernel in ("auto", "torch"), "server_kernel",
             f"expected auto or torch, got {cfg.server_kernel!r}")
    _require(cfg.compress in CODECS, "compress", f"expected {', '.join(CODECS)}, got {cfg.compress!r}")
    _require(cfg.compress == "none" or cfg.mode == Mode.ASYNC, "compress", "needs --mode async (pushes and pulls)")
    _require(not cfg.compress_pulls or cfg.compress != "none", "compress_pulls", "needs a --compress codec")


def parse_speeds(text: str) -> list[float]:
    """`client_speeds` as numbers; ValueError unless each is in (0, 1]."""
    speeds = [float(part) for part in text.split(",")]
    if not all(0 < s <= 1 for s in speeds):
        raise ValueError(text)
    return speeds


def is_user_code(spec: str) -> bool:
    """Whether a model or data setting names user code (`module:name`) rather than a
    built-in model, a dataset name, a .npz file or a folder."""
    return ":" in spec and not spec.endswith(".npz")


def model_arguments(cfg: Any) -> dict[str, Any]:
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
