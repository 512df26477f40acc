"""A sweep's spec (TOML) and the points it plans, each a validated `RunConfig`.

A spec (TOML):

    name = "fig2-cold"        # the sweep's folder name
    scale = "proxy"           # shown in figure captions
    backend = "sim"           # or "mpi"
    timeout = 3600            # seconds per run
    warm_start = 300          # warm-start minibatches of the points with start = "warm"
    window = 400              # smoothing window for `asgd report`, in minibatches
    steps_per_client = "equal"  # or "sqrt": K clients run steps / sqrt(K) each
    samples = { 1 = 160000, 32 = 512000 }  # instead: budgets in samples by client count
    evaluations = 40          # with samples: about this many test evaluations a run
    study = "scaling"         # the scaling study's report (plots/scaling.py) ...
    targets = [0.13, 0.12]    # ... at these test errors, fixed before the runs
    [base]                    # asgd train config keys shared by every point
    steps = 200
    [grid]                    # every combination is a point
    clients = [1, 2, 4, 8]
    n_sync = [1, 4, 16]
    start = ["cold", "warm"]
    mode = ["async"]
    seed = [0]
    rule = ["add", "dcasgd"]  # these five name the point only where they depart from [base]
    momentum = [0.9, "auto"]
    speed_jitter = [0.0, 0.5]
    sim_profile = ["measured", "paper"]
    steps = [2000]            # minibatches a client (before steps_per_client)
    lr = [0.01, 0.02]         # any other config key is an axis too, named where it departs

`[[grid]]` tables instead of one `[grid]`: the points are the union of their grids (a
full grid for some rules, a smaller one for others), each point once.

Several tasks in one sweep (a map over tasks, `study = "links"`): `[tasks.NAME]` tables,
each of config keys laid over [base] (data, model, costs) and the task's own `targets`
and `samples`; a grid's `task = ["NAME", ...]` picks tasks (all, in the spec's order,
where it names none) and a point's id ends in `-NAME`. A task's targets are in its own
measure (an LM's perplexity beside a classifier's error), hence in the task, not the
spec. A grid's `variant = ["LABEL"]` names the column its points stand in on the links
report's map (index.json's `variants`: every label whose grid reached the point, as where
`servers = auto` picks one server and the "1 server" grid reaches the default's config);
neither key is a config key.

A paired sweep (`study = "paired"`, with `paired = { by = ["compress"], reference =
["none"] }`) compares settings seed by seed: its report gives each setting's final value
less the reference setting's in the same seed (plots/paired.py).

In the simulator every point uses one step time, measured once for the sweep (unless
`sim_step_time` is in [base]), so the points' virtual clocks are comparable
(experiments/sweep/run.py measures it).
"""
from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.run.resume import CHANGEABLE
from runconfig.load import field_types, load_config
from runconfig.settings import ConfigError, RunConfig
from rundir.smoothing import WINDOW
from rundir.modes import Mode

GRID_KEYS = ("clients", "n_sync", "start", "mode", "seed")
# Grid keys that are config keys as such: these five always in the index, with their
# part of a point id; any other config key may be an axis too (its tag: its name).
VARIANT_KEYS = ("rule", "momentum", "speed_jitter", "sim_profile", "steps")
VARIANT_TAGS = {"rule": "", "momentum": "m", "speed_jitter": "j", "sim_profile": "", "steps": "steps"}
SPEC_KEYS = {"name": str, "scale": str, "backend": str, "timeout": float, "warm_start": int, "window": int,
             "steps_per_client": str, "samples": (int, dict), "evaluations": int, "study": str, "targets": list,
             "base": dict, "grid": (dict, list), "tasks": dict, "paired": dict}  # key: the type load_spec reads it as
KIND_NAMES = {str: "a string", float: "a number", int: "an integer", dict: "a table", (dict, list): "a table",
              list: "a list", (int, dict): "an integer or a table of integers by client count"}
STUDIES = ("", "scaling", "links", "paired")  # `study`: which report a sweep gets (plots/scaling.py, links.py, paired.py)
LABELS = ("task", "variant")  # grid keys that label a point for its report, not config keys
MAX_TIMEOUT = 2**31 // 1000  # seconds (24 days): a point's wait is one poll() of a C int of milliseconds
# "sqrt": K clients run steps / sqrt(K) minibatches each (steps * sqrt(K) in all), so
# every point runs long enough to show a speedup of sqrt(K) or more at a fraction of the
# cost of every client running `steps`.
STEPS_PER_CLIENT = ("equal", "sqrt")
OWN_KEYS = {"clients", "n_sync", "mode", "seed", "warm_start", "out", "backend", "resume", "quiet"}


@dataclass(frozen=True)
class PlannedPoint:
    id: str
    settings: dict[str, Any]   # the grid values: clients, n_sync, start, mode, seed
    config: RunConfig          # the point's whole config


@dataclass(frozen=True)
class Spec:
    name: str
    scale: str
    backend: str
    timeout: float
    window: int
    points: list[PlannedPoint]
    meta: dict[str, Any]       # what the report reads beside the points: study, targets, samples


def read_spec(path: str) -> dict[str, Any]:
    """A spec file's TOML, unchecked; errors are one line (ConfigError)."""
    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, ValueError) as error:  # ValueError: not TOML, not UTF-8, an int of over 4300 digits
        raise ConfigError(f"sweep {path}: cannot read ({error})") from None


def load_spec(path: str) -> Spec:
    """The spec and every point's validated config; errors are one line (ConfigError)."""
    raw = read_spec(path)
    _check_spec_values(raw, path)
    grids = raw.get("grid", {})
    grids = grids if isinstance(grids, list) else [grids]
    if not all(isinstance(table, dict) for table in grids):
        raise ConfigError(f"sweep {path}: grid must be a table, or tables ([[grid]])")
    axes = {k for g in grids for k in g} - set(GRID_KEYS) - set(LABELS)
    unknown = sorted(set(raw) - SPEC_KEYS.keys()) + sorted(axes - (field_types().keys() - OWN_KEYS))
    clashing = sorted(set(raw.get("base", {})) & OWN_KEYS)
    _check_budgets(raw, axes, path)
    if unknown or clashing:
        raise ConfigError(f"sweep {path}: unknown key {unknown[0]!r}" if unknown else
                          f"sweep {path}: [base] may not set {clashing[0]!r} (the grid and spec do)")
    tasks = _tasks(raw, path)
    backend = raw.get("backend", "sim")
    references = {}
    for name, task in tasks.items():
        _check_budgets(task, axes, path)
        try:  # what [base] alone (with the task's keys) gives: point ids name departures
            references[name] = load_config(None, task.get("base", {}))
        except ConfigError as error:
            raise ConfigError(f"sweep {path}: [base]{f' with task {name}' if name else ''}: {error}") from None
    points: dict[str, PlannedPoint] = {}
    for table in grids:
        _add_grid(points, table, tasks, backend, references, sorted(axes - set(VARIANT_KEYS)), path)
    meta = {k: raw[k] for k in ("study", "targets", "samples", "evaluations", "paired") if k in raw}
    meta.update({"tasks": {name: {"targets": task.get("targets")} for name, task in tasks.items()}}
                if "tasks" in raw else {})
    return Spec(raw.get("name", Path(path).stem), raw.get("scale", "proxy"), backend,
                float(raw.get("timeout", 3600)), int(raw.get("window", WINDOW)), list(points.values()), meta)


def _add_grid(points: dict[str, PlannedPoint], table: dict[str, Any], tasks: dict[str | None, dict[str, Any]],
              backend: str, references: dict[str | None, RunConfig], axes: list[str], path: str) -> None:
    """One [grid]'s points into `points` (by id, each once, in order): every combination of
    its values, for each task it names; its variant label added to each point's."""
    grid = {key: table.get(key, default) for key, default in zip(GRID_KEYS, ([1], [1], ["cold"], ["async"], [0]))}
    grid.update({key: table[key] for key in table if key not in GRID_KEYS and key not in LABELS})
    labels = {key: table.get(key, default) for key, default in (("task", list(tasks)), ("variant", [None]))}
    if any(not isinstance(values, list) or not values for values in (*grid.values(), *labels.values())):
        raise ConfigError(f"sweep {path}: every [grid] entry must be a non-empty list")
    if len(labels["variant"]) > 1 or not set(labels["task"]) <= set(tasks):
        raise ConfigError(f"sweep {path}: a grid's variant is one label, its tasks among [tasks] "
                          f"({', '.join(map(str, tasks))}), got {labels}")
    variant = labels["variant"][0]
    for task, values in itertools.product(labels["task"], itertools.product(*grid.values())):
        point = _point(dict(zip(grid, values)), tasks[task], backend, references[task], axes)
        named = {**({"task": task} if task else {}), **({"variants": []} if variant is not None else {})}
        point = PlannedPoint(point.id + (f"-{task}" if task else ""), {**point.settings, **named}, point.config)
        point = points.setdefault(point.id, point)  # sync modes ignore n_sync: one point, not several
        if variant is not None and variant not in point.settings["variants"]:
            point.settings["variants"].append(variant)  # two columns' grids reach one config


def _tasks(raw: dict[str, Any], path: str) -> dict[str | None, dict[str, Any]]:
    """Each task's spec as the points read it: [base] with the task's config keys laid over
    it, the task's targets and samples where it has them; one task, None, without
    [tasks]. A task's targets are checked against its own measure."""
    if "tasks" not in raw:
        return {None: raw}
    if not raw["tasks"] or not all(isinstance(t, dict) for t in raw["tasks"].values()):
        raise ConfigError(f"sweep {path}: tasks must be tables ([tasks.NAME]) of config keys, targets and samples")
    out = {}
    for name, task in raw["tasks"].items():
        own = {k: v for k, v in task.items() if k in ("targets", "samples")}
        keys = {k: v for k, v in task.items() if k not in own}
        bad = sorted(set(keys) - (field_types().keys() - OWN_KEYS))
        if bad:
            raise ConfigError(f"sweep {path}: task {name}: unknown key {bad[0]!r}")
        out[name] = {**raw, **own, "base": {**raw.get("base", {}), **keys}}
        _check_spec_values(out[name], f"{path} (task {name})")
    return out


def _check_budgets(raw: dict[str, Any], axes: set[str], path: str) -> None:
    """A spec's (or a task's) budget is given once: in samples, or in steps by a grid."""
    if "samples" in raw and "steps" in raw.get("base", {}):
        raise ConfigError(f"sweep {path}: samples sets the points' steps; [base] may not set steps "
                          "(a grid may, for points that need a budget of their own)")
    if "epochs" in raw.get("base", {}) or "epochs" in axes:
        raise ConfigError(f"sweep {path}: epochs is for a run; a sweep's budget is steps or samples")


def _check_spec_values(raw: dict[str, Any], path: str) -> None:
    """The spec's own keys hold what load_spec reads them as: TOML allows any type anywhere."""
    for key, kind in SPEC_KEYS.items():
        value = raw.get(key)
        allowed = (int, float) if kind is float else kind
        if value is not None and (not isinstance(value, allowed) or isinstance(value, bool)):
            raise ConfigError(f"sweep {path}: {key} must be {KIND_NAMES[kind]}, got {value!r}")
    if not 0 < raw.get("timeout", 1) <= MAX_TIMEOUT:
        raise ConfigError(f"sweep {path}: timeout must be in (0, {MAX_TIMEOUT}] seconds, got {raw['timeout']!r}")
    if raw.get("steps_per_client", "equal") not in STEPS_PER_CLIENT:
        raise ConfigError(f"sweep {path}: steps_per_client must be {' or '.join(STEPS_PER_CLIENT)}, "
                          f"got {raw['steps_per_client']!r}")
    if raw.get("window", 1) < 1:
        raise ConfigError(f"sweep {path}: window must be at least 1, got {raw['window']!r}")
    budgets = raw.get("samples", 1)
    budgets = budgets if isinstance(budgets, dict) else {"1": budgets}
    if not all(k.isdigit() and int(k) >= 1 and isinstance(v, int) and v >= 1 for k, v in budgets.items()) \
            or "1" not in budgets:
        raise ConfigError(f"sweep {path}: samples must be a positive integer, or a table of them by client count "
                          f"starting at 1 (samples = {{ 1 = 160000, 32 = 640000 }}), got {raw['samples']!r}")
    if raw.get("evaluations", 1) < 1:
        raise ConfigError(f"sweep {path}: evaluations must be at least 1, got {raw['evaluations']!r}")
    if raw.get("study", "") not in STUDIES:
        raise ConfigError(f"sweep {path}: study must be {' or '.join(map(repr, STUDIES))}, got {raw['study']!r}")
    paired = raw.get("paired", {})
    if (raw.get("study") == "paired") != bool(paired) or paired and not (
            set(paired) == {"by", "reference"} and isinstance(paired["by"], list) and paired["by"]
            and isinstance(paired["reference"], list) and len(paired["by"]) == len(paired["reference"])):
        raise ConfigError(f"sweep {path}: study = \"paired\" takes paired = {{ by = [KEY, ...], reference = "
                          f"[VALUE, ...] }}, a value a key (and paired goes with that study), got {paired!r}")
    targets = raw.get("targets", [0.5])
    if _user_measure(raw):  # the runs' metric or loss, in its own units (a perplexity, a loss)
        if not targets or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < math.inf
                                  for t in targets):
            raise ConfigError(f"sweep {path}: targets must be positive numbers in the runs' measure, got {targets!r}")
    elif not targets or not all(isinstance(t, float) and 0 < t < 1 for t in targets):
        raise ConfigError(f"sweep {path}: targets must be errors in (0, 1), got {targets!r}")
    if "samples" in raw and raw.get("steps_per_client", "equal") != "equal":
        raise ConfigError(f"sweep {path}: samples sets every point's steps; leave steps_per_client out")


def _user_measure(raw: dict[str, Any]) -> bool:
    """Whether the runs are measured by the user's metric or loss rather than a test error
    (rundir/measure.py): [base] names a metric, or a loss of its own."""
    base = raw.get("base", {})
    return isinstance(base, dict) and bool(base.get("metric") or base.get("loss"))


def _point(settings: dict[str, Any], raw: dict[str, Any], backend: str, reference: RunConfig,
           axes: list[str]) -> PlannedPoint:
    """One point: its config and its id, which names what departs from [base]. `axes`: the
    spec's grid keys beyond GRID_KEYS and VARIANT_KEYS, in the index too."""
    if settings["start"] not in ("cold", "warm"):
        raise ConfigError(f"sweep: start must be cold or warm, got {settings['start']!r}")
    if settings["mode"] == Mode.SYNC:
        settings = {**settings, "n_sync": 1}
    base = raw.get("base", {})
    own_steps = "steps" in settings  # a grid's steps win over the budget in samples
    settings = {**settings, "steps": settings.get("steps", reference.steps)}  # before steps_per_client
    keys = {"clients": settings["clients"], "n_sync": settings["n_sync"], "mode": settings["mode"],
            "seed": settings["seed"], "backend": backend,
            "warm_start": raw.get("warm_start", 0) if settings["start"] == "warm" else 0,
            **{key: value for key, value in settings.items() if key not in GRID_KEYS}}
    if raw.get("steps_per_client") == "sqrt":
        keys["steps"] = max(1, math.ceil(settings["steps"] / math.sqrt(settings["clients"])))
    config = load_config(None, {**base, **keys})
    if "samples" in raw:
        config = _in_samples(config, raw, reference.batch_size, own_steps)
    if settings["start"] == "warm" and not config.warm_start:
        raise ConfigError("sweep: warm points need warm_start > 0 in the spec")
    point_id = f"{settings['mode']}-c{settings['clients']}-n{settings['n_sync']}-{settings['start']}-s{settings['seed']}"
    # a variant names the point where it departs from the spec's [base] (or asgd train's
    # default), so two grids that reach the same config reach the same point
    budgeted = "samples" in raw and not own_steps  # its steps follow from the budget: not a variant
    values = {key: settings["steps"] if key == "steps" and not budgeted else getattr(config, key)
              for key in (*VARIANT_KEYS, *axes)}
    point_id += "".join(f"-{VARIANT_TAGS.get(key, key)}{values[key]}" for key in (*VARIANT_KEYS, *axes)
                        if values[key] != getattr(reference, key) and (key != "steps" or not budgeted))
    # the index holds every variant's value, given or not, so the analysis can tell points apart
    return PlannedPoint(point_id, {**settings, **values}, config)


def budget(samples: int | dict[str, int], clients: int, batch_size: int, base_batch: int) -> int:
    """The samples a point trains on in all: `samples`, or from a table by client count the
    entry of the largest count at most the point's (clients x batch_size / [base]'s
    batch: one process at batch K x b counts as K), so larger K get the budget their
    slower statistics need and no point is cut short of its peers at the same K."""
    if not isinstance(samples, dict):
        return samples
    k = clients * batch_size / base_batch
    return samples[str(max(int(c) for c in samples if int(c) <= max(k, 1)))]


def _in_samples(config: RunConfig, raw: dict[str, Any], base_batch: int, own_steps: bool) -> RunConfig:
    """Steps from the budget in samples (K clients run budget / (K x batch) minibatches
    each; unless the grid set the point's steps, `own_steps`) and, with `evaluations`, about that many test evaluations a run, so that they
    are as far apart in samples for every point of a client count (eval_every counts
    the server's versions: a push of n_push minibatches, a step the rule gathers, or a
    step of every client)."""
    k, batch = config.clients or 1, config.batch_size
    total = config.steps * k * batch if own_steps else budget(raw["samples"], k, batch, base_batch)
    config = config_with(config, {"steps": max(1, math.ceil(total / (k * batch)))})
    if "evaluations" not in raw:
        return config
    versions = config.async_versions(k) if config.mode == Mode.ASYNC else config.steps
    return config_with(config, {"eval_every": max(1, round(versions / raw["evaluations"]))})


def run_settings(config: RunConfig) -> dict[str, Any]:
    """What a point runs with: every config key but those that only handle the run (a
    point runs its own steps, which a resume alone may extend). What index.json shows of
    each point, since a folder grown by a later spec may hold points of other settings."""
    return {key: value for key, value in config.to_dict().items() if key not in CHANGEABLE - {"steps"}}


def config_with(config: RunConfig, changes: dict[str, Any]) -> RunConfig:
    return RunConfig(**{**config.to_dict(), **changes})
