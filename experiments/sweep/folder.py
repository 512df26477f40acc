"""A sweep folder bound to its spec: the points it holds keep the settings they ran with.

DIR/spec.toml is the spec the folder was started with, never rewritten. `asgd sweep`
run again on the folder accepts:
- one of the folder's own specs, or any that plans the same points with the same
  settings (another timeout, window or name, say): it goes on with every point the
  folder holds;
- a spec that adds points and drops none: the new points run with the new spec's
  settings, every earlier point keeps its own, the spec is kept beside the first as
  DIR/spec.N.toml, and index.json gives each point's settings (`config`: every key
  but those that only handle the run).
Anything else (a point dropped, or a point's settings changed and none added) is
refused, one line naming the settings or spec keys that changed. Since a
grown folder may hold points of different settings, `refuse_mixed` stops `asgd report`
comparing them.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from experiments.run.resume import CHANGEABLE, RECORD_ONLY
from experiments.sweep.run import SweepRunner
from experiments.sweep.spec import GRID_KEYS, VARIANT_KEYS, PlannedPoint, Spec, load_spec, read_spec, run_settings
from runconfig.settings import ConfigError
from runconfig.checks import USER_CODE, USER_CODE_KEYS
from rundir.durable import write_text_atomic
from rundir.layout import RunDir
from rundir.lock import FolderLock, RunDirError

FIRST = "spec.toml"
# config keys a sweep's points may differ in: the grid's, what follows from them (the
# warm start, the evaluation interval, the step and push times measured for the
# `measured` cost profile only), how a run is handled
PER_POINT = {*GRID_KEYS, *VARIANT_KEYS, *CHANGEABLE, "warm_start", "eval_every", "sim_step_time", "sim_apply_time"}


def run_sweep(spec_path: str, out: str | None, jobs: int, retry_failed: bool, quiet: bool,
              only: list[str] | None = None) -> int:
    """`asgd sweep`: the folder made and locked, bound to its spec, then its missing points
    run (with `only`, those of them that match it)."""
    spec = load_spec(spec_path)
    chosen = selected(spec.points, only) if only else None
    folder = Path(out or f"results/sweeps/{spec.name}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"out: cannot create the sweep folder {folder} ({error.strerror})") from None
    with FolderLock(folder):  # one sweep at a time in a folder
        bound = bind(spec, spec_path, folder)
        if chosen is not None:  # the folder's own points, of those an earlier spec planned too
            chosen = selected(bound.points, only)
        return SweepRunner(bound, folder, jobs, retry_failed, quiet, chosen).run()


def selected(points: list[PlannedPoint], only: list[str]) -> set[str]:
    """The ids of the points that match every `KEY=V1,V2` of `only` (one of its values):
    a grid axis or a config key, numbers compared as numbers. Refused, before any run: a
    filter not of that form, a key no point has, a slice of no point."""
    settings = {point.id: {**run_settings(point.config), **point.settings} for point in points}
    chosen = set(settings)
    for given in only:
        key, _, values = given.partition("=")
        if not key or not values:
            raise ConfigError(f"only: {given!r} is not KEY=VALUES (say clients=8 or n_sync=16,64)")
        if not any(key in own for own in settings.values()):
            raise ConfigError(f"only: no point has a key {key!r} (a grid axis or a config key)")
        wanted = values.split(",")
        chosen &= {i for i, own in settings.items() if key in own and any(_same(own[key], text) for text in wanted)}
    if not chosen:
        raise ConfigError(f"only: no point of the spec's {len(points)} matches {' and '.join(only)}")
    return chosen


def _same(value: Any, text: str) -> bool:
    """Whether a setting is the value a user typed (true/false for a flag; 16 for 16.0)."""
    if isinstance(value, bool):
        return text.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return str(value) == text


def bind(spec: Spec, spec_path: str, folder: Path) -> Spec:
    """The spec to run in `folder` (its lock held): `spec` in a new folder, else the
    folder's points and any `spec` adds (see the module docstring)."""
    text = Path(spec_path).read_text()
    files = spec_files(folder)
    if not files:
        write_text_atomic(folder / FIRST, text)
        return spec
    specs = [load_spec(str(file)).points for file in files]
    bound: dict[str, PlannedPoint] = {}
    for points in specs:
        for point in points:
            bound.setdefault(point.id, point)
    planned = {point.id: point for point in spec.points}
    dropped = [i for i in bound if i not in planned]
    added = [point for i, point in planned.items() if i not in bound]
    changed = {key for i in bound if i in planned for key in _differ(bound[i], planned[i])}
    if _settings(spec.points) in [_settings(points) for points in specs] or not (dropped or added or changed):
        return replace(spec, points=list(bound.values()))  # one of its own specs: go on
    if dropped or not added:
        keys = sorted(changed) if changed and not dropped else changed_keys(read_spec(str(files[-1])),
                                                                              read_spec(spec_path))
        what = f"drops {len(dropped)} of its points" if dropped else "changes its points' settings and adds none"
        raise ConfigError(f"sweep: {folder} was started with another spec ({folder / FIRST}); this one {what} "
                          f"({', '.join(keys)}); run the folder's own spec, or use another --out")
    write_text_atomic(folder / f"spec.{len(files) + 1}.toml", text)
    return replace(spec, points=[*bound.values(), *added])


def _settings(points: list[PlannedPoint]) -> dict[str, dict[str, Any]]:
    return {point.id: run_settings(point.config) for point in points}


def _differ(old: PlannedPoint, new: PlannedPoint) -> list[str]:
    """The settings two plans of one point differ in."""
    before, after = run_settings(old.config), run_settings(new.config)
    return [key for key in before if before[key] != after.get(key)]


def spec_files(folder: Path) -> list[Path]:
    """The specs a folder was run with, first to last."""
    later = [path for path in folder.glob("spec.*.toml") if path.stem.split(".", 1)[1].isdigit()]
    later.sort(key=lambda path: int(path.stem.split(".", 1)[1]))
    return [folder / FIRST, *later] if (folder / FIRST).exists() else []


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The keys (base.lr, grid.clients) whose values differ between two specs."""
    flat_old, flat_new = _flat(old), _flat(new)
    return sorted(key for key in flat_old.keys() | flat_new.keys() if flat_old.get(key) != flat_new.get(key))


SIZED = ("servers", "sim_apply_time")  # what `servers = auto` resolves for each point


def refuse_mixed(points: list[Any]) -> None:
    """Refuse (RunDirError, one line) to compare sweep points whose shared settings (every
    config key but the grid's axes, what follows from them and how a run is handled)
    differ, as a folder grown by a later spec may hold. A spec's tasks (its [tasks]: data,
    model, costs of their own) are compared each within itself. A simulated point that
    left `servers` at `auto` records the count its own costs and K picked (and, where
    several, a slice's push cost as `sim_apply_time`): those two are not compared for it,
    as points of one spec differ there by design."""
    seen: dict[tuple[Any, str], tuple[Any, str]] = {}
    axes = {key for point in points for key in point.settings}  # any key a grid of the spec varies
    for point in points:
        config = RunDir(point.run).record("config")
        task = point.settings.get("task")
        sized = config.get("provenance", {}).get("sim", {}).get("servers_asked") == "auto"
        for key in config.keys() - PER_POINT - RECORD_ONLY - axes - (set(SIZED) if sized else set()):
            value = _compared(key, config)
            first = seen.setdefault((task, key), (value, point.id))
            if first[0] != value:
                raise RunDirError(f"report: the points differ in {key} ({first[0]!r} in {first[1]}, "
                                  f"{value!r} in {point.id}); a report compares points of one setting: "
                                  "report a folder of one spec")


def _compared(key: str, config: dict[str, Any]) -> Any:
    """A setting as two points must agree on it. User code is recorded by where it was
    found (an absolute path), and a folder grown from two checkouts of one project records
    the same file twice: it is compared by its file or module and name, and data by the
    fingerprint of what it loaded (experiments/run/inputs.py) where one was recorded."""
    value = config[key]
    parts = USER_CODE.fullmatch(value) if key in USER_CODE_KEYS and isinstance(value, str) else None
    if parts is None:
        return value
    code = f"{Path(parts['file']).name if parts['file'] else parts['module']}:{parts['name']}"
    return (code, config["data_fingerprint"]) if key == "data" and "data_fingerprint" in config else code


def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            for n, item in enumerate(value):
                flat.update(_flat(item, f"{prefix}{key}[{n}]."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
