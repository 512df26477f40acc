"""The `asgd` command.

    asgd train [CONFIG.toml] [--clients K --n-sync N ...]   start K clients + 1 server on MPI
    mpiexec -n K+1 asgd train [CONFIG.toml] [flags]           the same, launched by you
    asgd sweep SPEC.toml [--only KEY=VALUES]                   a resumable grid of runs
    asgd report RUN_DIR | SWEEP_DIR                            summary, tables, findings, figures
    asgd export RUN_DIR [--out FILE] [--best]                  the last (or best) weights as a torch state_dict
    asgd tensorboard RUN_DIR | SWEEP_DIR                       TensorBoard event files, with HParams
    asgd bench                                                 measurements (bench/command.py, handed in by asgd.command)

Every input is checked here, before any MPI process starts: a bad one exits with
status 2 and one line saying which field is wrong and why.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Protocol

from experiments.run.inputs import absolute_paths
from experiments.parent.mpiexec import launcher_rank
from experiments.run.resume import resume_hint
from runconfig.load import config_values, field_types, flag_type, group_of
from runconfig.settings import GROUPS, ConfigError, RunConfig
from rundir.layout import RunDir
from rundir.lock import RunDirError
from rundir.smoothing import WINDOW
from rundir.modes import Mode

if TYPE_CHECKING:
    from experiments.result import TrainResult

DEFAULT_CLIENTS = 2  # when asgd starts mpiexec itself and --clients is not given


class InputError(ValueError):
    """Bad input found before launch; one line."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage is in --help)."""

    def error(self, message: str):
        self.exit(2, f"asgd: error: {_one_line(message)}\n")


class Interrupted(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C is: the run records `failed: interrupted` and can resume."""


def _interrupt(signum: int, frame) -> None:
    if launcher_rank() is not None:  # a rank records the run interrupted: the launcher's SIGTERM after
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # Slurm's (scancel signals both) must not cut that short
    raise Interrupted(signal.Signals(signum).name)


class Subcommand(Protocol):
    """A subcommand from above this package (the bench, which measures the tool from
    outside it): asgd.command hands it in, so experiments imports nothing above it."""
    name: str

    def add(self, commands: argparse._SubParsersAction) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def main(argv: list[str] | None = None, extra: Iterable[Subcommand] = ()) -> int:
    """The exit status; `asgd train`'s is the run's TrainResult (an int), which
    experiments.api.train hands back."""
    extra = {command.name: command for command in extra}
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(extra).parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        if args.command == "train":
            return _train(args, argv)
        if args.command == "sweep":
            from experiments.sweep.folder import run_sweep
            return run_sweep(args.spec, args.out, args.jobs, args.retry_failed, args.quiet, args.only)
        if args.command == "join":
            from experiments.rank.joiner import join
            return join(args.run)
        if args.command == "export":
            from experiments.export import export
            return export(args.run, args.out, args.best)
        if args.command == "tensorboard":
            from experiments.tensorboard import tensorboard
            return tensorboard(args.path, args.out)
        if args.command in extra:
            return extra[args.command].run(args)
        from experiments.report import report
        return report(args.path, args.window, args.figures, args.target, args.docs)
    except (ConfigError, InputError, RunDirError) as error:
        if args.command == "train" and launcher_rank() is not None:  # a rank: the job must end, not wait for it
            from experiments.rank.entry import refuse_job
            return refuse_job(_one_line(str(error)))
        return _error(str(error))
    except KeyboardInterrupt:  # before a run directory had anything to record
        print("asgd: interrupted", file=sys.stderr)
        return 130


def _parser(extra: Mapping[str, Subcommand]) -> argparse.ArgumentParser:
    parser = _Parser(prog="asgd", description="Asynchronous SGD with a parameter server.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train one run (on MPI)")
    train.add_argument("config", nargs="?", help="TOML config file; flags override it")
    _add_settings(train)
    sweep = commands.add_parser("sweep", help="run a grid of runs from a spec (resumable)")
    sweep.add_argument("spec", help="sweep spec (TOML); see experiments/configs/")
    sweep.add_argument("--out", help="sweep folder (default results/sweeps/<name>)")
    sweep.add_argument("--jobs", type=_count, default=0, help="points run at once (default: cores for sim, 1 for mpi)")
    sweep.add_argument("--retry-failed", action="store_true", help="run failed points again")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.add_argument("--only", action="append", default=[], metavar="KEY=VALUES",
                       help="run only the points whose KEY (a grid axis or a config key) is one of VALUES "
                            "(comma-separated; repeated: every one must hold), the others left pending: "
                            "the slice a result needs first, in the folder the whole grid goes on in")
    joiner = commands.add_parser("join", help="become a new client of a running --joinable run (docs/joining.md)")
    joiner.add_argument("run", help="the run directory of a run started with --joinable over MPI")
    export = commands.add_parser("export", help="a run's last weights as a torch state_dict (model.pt)")
    export.add_argument("run", help="a run directory")
    export.add_argument("--out", help="the file (default: RUN/model.pt; *.safetensors: safetensors)")
    export.add_argument("--best", action="store_true",
                        help="the weights of the curve's best point (a run trained with keep_best), not the last")
    board = commands.add_parser("tensorboard",
                                help="TensorBoard scalars and HParams of a run, or of every run of a sweep")
    board.add_argument("path", help="a run directory or a sweep folder")
    board.add_argument("--out", help="where the event files go (default: PATH/tensorboard)")
    for command in extra.values():
        command.add(commands)
    report = commands.add_parser("report", help="summarise a run or a sweep: tables, findings, figures")
    report.add_argument("path", help="a run directory or a sweep folder")
    report.add_argument("--window", type=int, help="smoothing window, in minibatches (default: the sweep spec's; "
                                                     f"for a run, a twentieth of its minibatches, at most {WINDOW})")
    report.add_argument("--figures", help="where a sweep's tables and figures go (default: SWEEP/figures)")
    report.add_argument("--target", type=float, help="target training error for speedups "
                                                       "(default: the 1-client run's final error + 5%%)")
    report.add_argument("--docs", help="also write a sweep's tables and findings, with where its runs were measured, "
                                       "to this Markdown page (the make targets: docs/results/<scale>/<figure>.md)")
    return parser


def _add_settings(train: argparse.ArgumentParser) -> None:
    """A flag for every config key, in a section for each of its groups (the common
    settings first), as a config file's tables group them."""
    kinds = field_types()
    sections = {name: train.add_argument_group(title, f"[{name}] in a config file") for name, title in GROUPS.items()}
    groups = group_of()
    for key in fields(RunConfig):
        flag = "--" + key.name.replace("_", "-")
        text = argparse.SUPPRESS if key.name == "inject_fault" else _help(key)
        section = sections[groups[key.name]]
        if kinds[key.name] is bool:
            section.add_argument(flag, action="store_const", const=True, default=None, help=text)
        else:
            section.add_argument(flag, type=flag_type(key.name), default=None, help=text, metavar=key.name.upper())


def _count(text: str) -> int:
    """A count where 0 means automatic (--jobs): a negative one would reach the thread pool."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0 (0: automatic), got {value}")
    return value


def _help(key) -> str:
    """The key's help line, with its default unless the line already says it."""
    text = key.metadata["help"]
    if key.default in (None, "", False) or "default:" in text:
        return text
    return f"{text} (default: {key.default})"


def _train(args: argparse.Namespace, argv: list[str]) -> TrainResult:
    from experiments.parent.mpiexec import MPIEXEC, find_mpiexec, refuse_torchrun

    flags = {f.name: getattr(args, f.name) for f in fields(RunConfig)}
    asked = absolute_paths(config_values(args.config, flags))
    if asked.get("epochs") and "steps" in asked:
        raise InputError("epochs: give steps or epochs, not both (epochs derives the steps)")
    if isinstance(asked.get("resume"), str) and asked["resume"]:  # by flag or config file: one door
        from experiments.run.resume import resumed_config
        cfg = resumed_config(asked)
    else:
        cfg = RunConfig(**asked)
    _check_inputs(cfg)
    out = cfg.out or _default_out(cfg)
    if cfg.backend == "mpi" and launcher_rank() is None:
        refuse_torchrun()
    mpiexec = find_mpiexec() if cfg.backend == "mpi" and launcher_rank() is None else ""
    if mpiexec is None:
        raise InputError(f"backend: no mpiexec found (${MPIEXEC}, beside python, on PATH); "
                         "run 'make setup' or install an MPI library")
    return _result(_run(cfg, out, argv, mpiexec), out)


def _run(cfg: RunConfig, out: str, argv: list[str], mpiexec: str) -> int:
    """The run, in this process (the simulator, or this MPI rank's part) or under an mpiexec
    started here; its exit status."""
    from experiments.parent.claim import claim
    from experiments.parent.mpiexec import Launcher

    lock = claim(cfg, out)
    try:
        if cfg.backend == "sim":
            from clients.devices import threads_kept
            from experiments.sim.simulator import run_sim
            with threads_kept():
                return run_sim(cfg, out, cfg.clients or DEFAULT_CLIENTS)
        if mpiexec:
            clients = cfg.clients or DEFAULT_CLIENTS
            servers = cfg.servers if cfg.mode == Mode.ASYNC else 0
            from experiments.parent.supervise import supervise
            launcher = Launcher.of(mpiexec)
            ranks = clients + servers + cfg.spares
            command = launcher.command(ranks, [*argv, "--clients", str(clients), "--out", out])
            return supervise(command, launcher.environment(), out, lock.fd, forwarded=launcher.kind == "openmpi")
        from clients.devices import threads_kept
        from experiments.rank.entry import run_mpi
        with threads_kept():
            return run_mpi(cfg, out)
    except KeyboardInterrupt:  # the simulator's, or a rank's (which recorded it: see serverrun)
        print(f"asgd: run {out} interrupted{resume_hint(out)}", file=sys.stderr)
        return 130
    except (ConfigError, InputError, RunDirError):
        raise
    except Exception as error:  # noqa: BLE001 - the simulator's run failed: one line, the trace kept
        from rundir.summary import log_traceback
        where = log_traceback(out, error, "simulator")
        if cfg.debug:
            traceback.print_exception(error)
        print(f"asgd: run {out} failed: {type(error).__name__}: {_one_line(str(error))} ({where})"
              f"{resume_hint(out)}", file=sys.stderr)
        return 1
    finally:
        if lock is not None:
            lock.release()


def _result(status: int, out: str) -> TrainResult:
    """The run's summary, on the process that records it (rank 0, the simulator's) or
    launched it (which reads it back after the job); the exit status alone elsewhere.
    A run that trained to its end but diverged exits non-zero (`status.exit_status`),
    said by the process the user started: not by a rank of a job `asgd train` supervises,
    whose launcher would take a rank's non-zero exit for a failure."""
    from experiments.parent.supervise import LOCKED_RUN
    from experiments.result import TrainResult
    from rundir.status import exit_status

    run_dir = str(Path(out).absolute())
    if launcher_rank() not in (None, 0):
        return TrainResult(status, run_dir)
    try:
        summary = RunDir(out).summary() or None
    except RunDirError:  # a damaged summary is no result; the run's exit status stands
        summary = None
    if status == 0 and summary is not None and LOCKED_RUN not in os.environ:
        status = exit_status(summary.get("status"))
    return TrainResult(status, run_dir, summary)


def _check_inputs(cfg: RunConfig) -> None:
    """What the config alone cannot know: the data, the model, the run directory."""
    from clients.user.check import check_user_code
    from clients.data import DataError, load_dataset
    from clients.models import model_factory
    from runconfig.settings import is_user_code

    if not is_user_code(cfg.model):
        try:
            model_factory(cfg.model)
        except ValueError as error:
            raise InputError(str(error)) from None
    try:
        dataset = load_dataset(cfg.data, cfg.data_dir or None)
    except DataError as error:
        raise InputError(str(error)) from None
    check_user_code(cfg, dataset)
    for key in ("device", "server_device"):
        _check_device(key, getattr(cfg, key))
    if cfg.tensorboard:
        import importlib.util
        if importlib.util.find_spec("tensorboard") is None:
            raise InputError("tensorboard: the tensorboard package is not installed; pip install tensorboard")
    # without --clients: asgd's default when it starts (or simulates) the job; under a
    # user's mpiexec every rank but the server, unknown here, so at least the whole set
    clients = cfg.clients or (DEFAULT_CLIENTS if cfg.backend == "sim" or launcher_rank() is None else 1)
    if clients > len(dataset.train):
        raise InputError(f"clients: {clients} clients need at least one training sample each; the data has "
                         f"{len(dataset.train)}")
    if len(dataset.train) // clients < cfg.batch_size:
        raise InputError(f"batch_size: {cfg.batch_size} is more than a client's shard of "
                         f"{len(dataset.train) // clients} samples")
    if cfg.init or cfg.resume:
        _check_start_weights(cfg, dataset)
    if cfg.resume:
        from experiments.run.inputs import check_fingerprint
        check_fingerprint(RunDir(cfg.resume).record("config").get("data_fingerprint"), dataset)


def _check_device(key: str, device: str) -> None:
    """A GPU asked for is there (the config checked the spelling)."""
    if not device.startswith("cuda"):
        return
    import torch

    index = int(device.partition(":")[2] or 0)
    if not torch.cuda.is_available():
        raise InputError(f"{key}: {device} asked for, but torch finds no CUDA GPU here (use cpu or auto)")
    if index >= torch.cuda.device_count():
        raise InputError(f"{key}: {device} asked for, but this host has {torch.cuda.device_count()} GPU(s)")


def _check_start_weights(cfg: RunConfig, dataset) -> None:
    """The checkpoint a run starts from (--resume's own, else --init's) fits the model this
    config builds: refused here in one line, not on every rank after MPI started."""
    from clients.models import flat_weights, run_model
    from experiments.run.assemble import StartError, checkpoint_weights, start_checkpoint

    size = flat_weights(run_model(cfg, dataset)).size
    try:
        checkpoint_weights(*start_checkpoint(cfg), size)
    except StartError as error:
        raise InputError(str(error)) from None


def _default_out(cfg: RunConfig) -> str:
    stem = f"runs/{time.strftime('%Y%m%d-%H%M%S')}-c{cfg.clients or DEFAULT_CLIENTS}-n{cfg.n_sync}"
    out, n = stem, 1
    while Path(out).exists():
        n += 1
        out = f"{stem}-{n}"
    return out


def _error(message: str) -> int:
    print(f"asgd: error: {_one_line(message)}", file=sys.stderr)
    return 2


def _one_line(message: str) -> str:
    """The message on one line, whatever line breaks a path or value in it carries."""
    return " ".join(message.splitlines())


if __name__ == "__main__":
    sys.exit(main())
