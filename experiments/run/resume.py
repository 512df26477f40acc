"""`asgd train --resume RUN_DIR`: continue a run from its last checkpoint.

A checkpoint records, with the weights, how far every client had got (the step of its
last push the server handled) and how many rows the logs held at that moment. Resuming
cuts the logs back to those rows, drops snapshots taken after the checkpoint, and
starts each client at the step after its last handled push, with its data order
sought to that point (the order is a pure function of seed, client and epoch). So the
finished logs hold every minibatch and every applied push exactly once. What is not
restored: the clients' momentum buffers (they restart at zero), an EASGD client's own
weights (it restarts from the center) and the minibatches a client had run but not
pushed when the job died (they are run again). The server's rule state (DC-ASGD's
copies, Adagrad's sums, momentum) is in the checkpoint and restored exactly.

Clients that joined are in the checkpoint too, each with its seat (shard, and where in
its order it began): the job's rank of a slot goes on as the slot's last holder, a joiner
where one took a lost client's shard (`ResumePoint.holder`; the server's side is
paramserver/membership.py's `resumed`), so no shard is drawn twice however the clients
holding it changed.

`--steps` may grow on resume, to extend a finished run; the settings that shape the
run (model, data, clients, learning rates...) may not change.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from paramserver.membership import holders, share_of
from runconfig.load import load_config
from runconfig.settings import USER_CODE, USER_CODE_KEYS, ConfigError, RunConfig
from rundir.checkpoint import Checkpoint
from rundir.durable import CorruptFile, load_arrays, read_jsonl, truncate_jsonl, write_json_atomic
from rundir.layout import RunDir
from rundir.lock import RunDirError
from rundir.measure import METRIC_HIGHER, METRIC_NAME
from rundir.status import COMPLETE
from rundir.summary import SUMMARY, discard

# The one list of settings a resume may change: how the run is handled, never what it
# trains (every other config key, whoever adds it, must keep the run's recorded value).
CHANGEABLE = {"steps", "epochs", "quiet", "stall_timeout", "eval_samples", "eval_live", "metric", "stop_at_error",
              "stop_at_loss", "stop_at_metric", "keep_snapshots", "keep_best", "device", "server_device",
              "server_kernel", "resume", "inject_fault", "out", "threads", "debug", "tensorboard",
              "checkpoint_every"}
RULE_DEFAULTED = ("server_lr", "dc_lambda")  # keys whose default follows the rule: config.json's KEY_used
RECORD_ONLY = {"provenance", "num_params", "train_size", "resumed", "momentum_used", "outer_lr_used", "outer_momentum_used",
               *(f"{key}_used" for key in RULE_DEFAULTED),
               "data_fingerprint", "speeds_used", METRIC_NAME, METRIC_HIGHER}  # config.json keys that are not config


@dataclass(frozen=True)
class ResumePoint:
    """Where each client starts again; broadcast from rank 0 to every rank."""

    time: float                # the run's clock at the checkpoint
    client_steps: list[int]    # minibatches each client had run and pushed
    client_pushes: list[int]
    optimizer: dict[str, np.ndarray] = field(default_factory=dict)  # every client's, where one for all
    client_optimizers: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)  # client -> its own
    outer: dict[str, np.ndarray] = field(default_factory=dict)  # local-sgd's outer step's state (every rank's)
    seats: list[tuple[int, int]] = field(default_factory=list)  # each client's (slot, position): a joiner's too

    def holder(self, slot: int) -> int:
        """The client that goes on on the job's slot `slot`: the last seated on it (a joiner,
        where one took a lost client's shard; paramserver/membership.py's `resumed`)."""
        return holders(self.seats).get(slot, slot)

    def position(self, client: int) -> int:
        """Where in its shard's order `client` began (a joiner's seat; 0 for the job's)."""
        return self.seats[client][1] if client < len(self.seats) else 0

    def steps_of(self, client: int, steps: int, run_budget: bool) -> int:
        """The most minibatches `client` counts to as it goes on, where every client's plan
        says `steps`: a joiner seated into its shard's order counts to what that order had
        left (as its Welcome said), unless the run's budget is what stops it."""
        return share_of(steps, self.position(client), run_budget)

    def optimizer_of(self, client: int) -> dict[str, np.ndarray]:
        """The optimizer state `client` goes on with ({}: a fresh one)."""
        return self.client_optimizers.get(client, self.optimizer)

    def only(self, clients: list[int]) -> "ResumePoint":
        """This point with the own states of `clients` alone (what one rank needs of it)."""
        return replace(self, client_optimizers={c: s for c, s in self.client_optimizers.items() if c in clients})


def resumed_config(asked: dict[str, Any]) -> RunConfig:
    """The run named by `asked["resume"]`, with the few settings a resume may change.

    `asked` holds every setting given, from flags and a config file alike (the `resume`
    key of a TOML file too), so a resume however asked for meets the same checks: a
    setting that would change the run is refused, one line naming it."""
    run_dir = asked["resume"]
    stored = recorded_config(run_dir)
    for key, value in asked.items():
        if key not in CHANGEABLE and not _same_setting(key, value, stored.get(key)):
            raise ConfigError(f"resume: {key} cannot change when resuming (run has {stored.get(key)!r}, "
                              f"asked for {value!r})")
    if stored.get("epochs") and "steps" in asked:
        raise ConfigError(f"steps: {run_dir} counts epochs ({stored['epochs']}); pass --epochs to train on")
    if asked.get("out") and Path(asked["out"]).resolve() != Path(run_dir).resolve():
        raise ConfigError(f"out: a resume writes into its own run directory {run_dir}, not {asked['out']}")
    if not RunDir(run_dir).checkpoint_path.exists():
        raise ConfigError(f"resume: {run_dir} has no checkpoint to resume from")
    try:
        Checkpoint.verify(RunDir(run_dir))
    except CorruptFile as error:
        raise ConfigError(f"resume: {error}") from None
    handling = {key: value for key, value in asked.items() if key in CHANGEABLE}  # the rest: as recorded
    cfg = load_config(None, {**stored, **handling, "out": run_dir, "resume": run_dir})
    _refuse_unseated_joiners(run_dir, cfg.clients)  # the recorded count, checked as the config's
    summary = Path(run_dir) / SUMMARY
    if summary.exists() and _read_record(summary).get("status") == COMPLETE \
            and cfg.steps <= stored.get("steps", RunConfig.steps) and cfg.epochs <= stored.get("epochs", 0):
        raise ConfigError(f"resume: {run_dir} is complete; pass a larger --{'epochs' if cfg.epochs else 'steps'} "
                          "to train on")
    return cfg


def _refuse_unseated_joiners(run_dir: str, clients: int | None) -> None:
    """Clients joined the run, and its checkpoint, of a version before checkpoints held
    the membership, does not say which shard each trained on: the resume could not tell
    whom the job's ranks go on as."""
    arrays = load_arrays(RunDir(run_dir).checkpoint_path, checksummed=True)
    if clients is not None and len(arrays.get("tally.client_steps", ())) > clients and "members.seats" not in arrays:
        raise ConfigError(f"resume: clients joined {run_dir} while it ran, and its checkpoint (of an earlier version) "
                          "does not say which shard each trained on")


def _same_setting(key: str, asked: Any, recorded: Any) -> bool:
    """Whether a setting given on resume is the run's: equal, or user code of the same
    module and name where one of the two names no folder (typed in a folder the module is
    not found in, or recorded before runs recorded folders): the recorded one is imported."""
    if asked == recorded:
        return True
    if key not in USER_CODE_KEYS or not isinstance(asked, str) or not isinstance(recorded, str):
        return False
    typed, kept = USER_CODE.fullmatch(asked), USER_CODE.fullmatch(recorded)
    return bool(typed and kept and typed["module"] and (typed["module"], typed["name"]) ==
                (kept["module"], kept["name"]) and not (typed["folder"] and kept["folder"]))


def recorded_config(run_dir: str | Path) -> dict[str, Any]:
    """The config keys of a run's config.json, as it ran (what it recorded beside them left out):
    a key its rule defaulted takes the value it ran with, which a later version's rule
    may not give it."""
    record = _read_record(Path(run_dir) / "config.json")
    stored = {k: v for k, v in record.items() if k not in RECORD_ONLY}
    stored.update({key: record[f"{key}_used"] for key in RULE_DEFAULTED
                   if stored.get(key) is None and f"{key}_used" in record})
    if stored.get("server_lr") is None and "server_lr_used" not in record and "lr" in stored:
        stored["server_lr"] = stored["lr"]  # recorded before rules had defaults: every rule's server lr was lr
    stored["inject_fault"] = ""  # a test's fault is for the run it was given to
    return stored


def _read_record(path: Path) -> dict[str, Any]:
    """A JSON object the run wrote (config.json, summary.json), refused in one line when
    missing, damaged or edited into something else."""
    if not path.exists():
        raise ConfigError(f"resume: cannot read {path} (no such file)")
    try:
        return RunDir(path.parent).record(path.stem)
    except RunDirError as error:
        raise ConfigError(f"resume: {error}") from None


def verify_logs(run_dir: str, steps: int, whole_run: bool) -> None:
    """Refuse (one line naming the file and line) a run whose logs do not hold, whole, the
    rows its checkpoint accounts for: resuming it would lose or repeat minibatches. No
    silent repair. A torn last line of eval.jsonl (a kill mid-evaluation) is cut back.
    The budget may not be less than what has been run: `steps` fewer than a client has
    run, or, where the budget is the run's (`whole_run`: a fast client ran more than its
    steps), clients x `steps` fewer than the clients have run together."""
    run = RunDir(run_dir)
    try:
        checkpoint = Checkpoint.load(run)
    except CorruptFile as error:
        raise ConfigError(f"resume: {error}") from None
    ran, clients = checkpoint.client_steps, len(checkpoint.client_steps)
    if whole_run and steps * clients < (done := int(sum(ran))):
        raise ConfigError(f"steps: {steps} x {clients} clients is fewer than the {done} minibatches the {clients} "
                          f"clients of {run_dir} have already run; pass --steps {-(-done // clients)} or more")
    if not whole_run and steps < (done := int(max(ran, default=0))):
        raise ConfigError(f"steps: {steps} is fewer than the {done} minibatches a client of {run_dir} has already "
                          f"run; pass --steps {done} or more")
    for log, lines in zip(("server", "clients"), checkpoint.lines):
        _whole_rows(run.path / f"{log}.jsonl", lines)
    evals = run.path / "eval.jsonl"
    if evals.exists():
        _whole_rows(evals, len(evals.read_bytes().splitlines()) - 1)


def _whole_rows(path: Path, needed: int) -> None:
    """The first `needed` lines of a log are whole JSON objects."""
    if needed <= 0:
        return
    if not path.exists():
        raise ConfigError(f"resume: {path} is missing; its checkpoint accounts for {needed} rows of it")
    count = 0
    with open(path, "rb") as lines:
        for count, line in enumerate(lines, start=1):
            if count > needed:
                return
            if not line.endswith(b"\n") or not _json_object(line):
                raise ConfigError(f"resume: {path} line {count} is damaged (its checkpoint accounts for {needed} "
                                  "rows); restore the file, or start a new run")
    if count < needed:
        raise ConfigError(f"resume: {path} holds {count} rows, its checkpoint accounts for {needed}; "
                          "restore the file, or start a new run")


def _json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def resume_hint(run_dir: str | Path) -> str:
    """What the console adds after a run stopped short: how to go on and what a resume runs
    again (the minibatches recorded after the checkpoint, besides those run but not yet
    pushed); '' where there is no checkpoint to go on from."""
    run = RunDir(run_dir)
    if not run.checkpoint_path.exists():
        return ""
    hint, reached = f"; resume with: asgd train --resume {run_dir}", Checkpoint.reached(run)
    if reached is None:
        return hint
    minibatches, rows = reached
    after = max(_count_rows(run.path / "clients.jsonl") - rows, 0)
    return f"{hint} (from its checkpoint at minibatch {minibatches:,}, running again the {after:,} recorded after it)"


def _count_rows(path: Path) -> int:
    try:
        with open(path, "rb") as log:
            return sum(block.count(b"\n") for block in iter(lambda: log.read(1 << 20), b""))
    except OSError:
        return 0


def resume_point(run_dir: str) -> ResumePoint:
    checkpoint = Checkpoint.load(RunDir(run_dir))
    seats = checkpoint.store.get("members.seats", np.zeros((0, 2), np.int64))
    return ResumePoint(checkpoint.time, [int(s) for s in checkpoint.client_steps],
                       [int(p) for p in checkpoint.client_pushes], checkpoint.optimizer, checkpoint.client_optimizers,
                       checkpoint.outer, [(int(slot), int(position)) for slot, position in seats])


def cut_back(run: RunDir, checkpoint: Checkpoint, steps: int, record: dict[str, Any],
             metric: dict[str, Any] | None = None) -> None:
    """Make the run directory what it was at the checkpoint, and note the resume in
    config.json, with what the cut takes away that must stay on record: how the run
    ended before (its summary's status) and the clients it had lost since. `metric`: the
    metric this resume measures with (`metric` and, where there is one, its name and
    direction), which a resume may change, so that the run's record reads its curve in it."""
    version = checkpoint.version
    before = {"status": run.status(),
              "lost": [row for row in run.rows("server")[checkpoint.lines[0]:] if "lost" in row]}
    for log, lines in zip(("server", "clients"), checkpoint.lines):
        truncate_jsonl(run.path / f"{log}.jsonl", lines)
    for snapshot_version, path in run.snapshots():
        if snapshot_version > version:
            run.drop_snapshot(path)
    evals = run.path / "eval.jsonl"
    if evals.exists():
        kept = sum(1 for row in read_jsonl(evals) if row["version"] <= version)
        truncate_jsonl(evals, kept)
    discard(run)
    config = run.record("config")
    config["resumed"] = [*config.get("resumed", []), {**record, "before": before}]
    config["steps"] = steps  # a resume may extend the run
    if metric is not None:
        for key in ("metric", METRIC_NAME, METRIC_HIGHER):
            config.pop(key, None)
        config.update(metric)
    config["out"] = str(run.path)  # a copy of a run, resumed, is a run of its own
    write_json_atomic(run.path / "config.json", config)
