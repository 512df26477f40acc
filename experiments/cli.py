"""The `asgd` command.

    asgd train [CONFIG.toml] [--clients K --n-sync N ...]   start K clients + 1 server on MPI
    mpiexec -n K+1 asgd train [CONFIG.toml] [flags]           the same, launched by you
    asgd sweep SPEC.toml                                       a resumable grid of runs
    asgd report RUN_DIR | SWEEP_DIR                            summary, tables, findings, figures

Every input is checked here, before any MPI process starts: a bad one exits with
status 2 and one line saying which field is wrong and why.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import fields
from pathlib import Path

from paramserver.config import ConfigError, RunConfig, field_types, load_config

DEFAULT_CLIENTS = 2  # when asgd starts mpiexec itself and --clients is not given


class InputError(ValueError):
    """Bad input found before launch; one line."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage is in --help)."""

    def error(self, message: str):
        self.exit(2, f"asgd: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    try:
        if args.command == "train":
            return _train(args, argv)
        if args.command == "sweep":
            from experiments.sweep import run_sweep
            return run_sweep(args.spec, args.out, args.jobs, args.retry_failed, args.quiet)
        from experiments.report import report
        return report(args.path, args.window, args.figures, args.target)
    except (ConfigError, InputError) as error:
        return _error(str(error))


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="asgd", description="Asynchronous SGD with a parameter server.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train one run (on MPI)")
    train.add_argument("config", nargs="?", help="TOML config file; flags override it")
    kinds = field_types()
    for key in fields(RunConfig):
        flag = "--" + key.name.replace("_", "-")
        text = argparse.SUPPRESS if key.name == "inject_fault" else _help(key)
        if kinds[key.name] is bool:
            train.add_argument(flag, action="store_const", const=True, default=None, help=text)
        else:
            train.add_argument(flag, type=kinds[key.name], default=None, help=text, metavar=key.name.upper())
    sweep = commands.add_parser("sweep", help="run a grid of runs from a spec (resumable)")
    sweep.add_argument("spec", help="sweep spec (TOML); see experiments/configs/")
    sweep.add_argument("--out", help="sweep folder (default results/sweeps/<name>)")
    sweep.add_argument("--jobs", type=int, default=0, help="points run at once (default: cores for sim, 1 for mpi)")
    sweep.add_argument("--retry-failed", action="store_true", help="run failed points again")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    report = commands.add_parser("report", help="summarise a run or a sweep: tables, findings, figures")
    report.add_argument("path", help="a run directory or a sweep folder")
    report.add_argument("--window", type=int, help="smoothing window, in minibatches (default: the sweep "
                                                     "spec's, or 400)")
    report.add_argument("--figures", help="where a sweep's tables and figures go (default: SWEEP/figures)")
    report.add_argument("--target", type=float, help="target training error for speedups "
                                                       "(default: the 1-client run's final error + 5%%)")
    return parser


def _help(key) -> str:
    """The key's help line, with its default unless the line already says it."""
    text = key.metadata["help"]
    if key.default in (None, "", False) or "default:" in text:
        return text
    return f"{text} (default: {key.default})"


def _train(args: argparse.Namespace, argv: list[str]) -> int:
    from experiments import launch

    overrides = {f.name: getattr(args, f.name) for f in fields(RunConfig)}
    if args.resume:
        from experiments.resume import resumed_config
        cfg = resumed_config(args.resume, overrides)
    else:
        cfg = load_config(args.config, overrides)
    _check_inputs(cfg)
    out = cfg.out or _default_out(cfg)
    if cfg.backend == "sim":
        from experiments.simulator import run_sim
        return run_sim(cfg, out, cfg.clients or DEFAULT_CLIENTS)
    if launch.launcher_rank() is None:
        mpiexec = launch.find_mpiexec()
        if mpiexec is None:
            raise InputError("backend: no mpiexec found; run 'make setup' or install an MPI library")
        clients = cfg.clients or DEFAULT_CLIENTS
        servers = 1 if cfg.mode == "async" else 0
        launch.relaunch(mpiexec, [*argv, "--clients", str(clients), "--out", out], clients + servers)
    return launch.run_mpi(cfg, out)


def _check_inputs(cfg: RunConfig) -> None:
    """What the config alone cannot know: the data, the model, the run directory."""
    from clients.data import DataError, load_dataset
    from clients.models import MODELS

    if cfg.model not in MODELS:
        raise InputError(f"model: unknown model {cfg.model!r} (choose from {', '.join(MODELS)})")
    try:
        dataset = load_dataset(cfg.data, cfg.data_dir or None)
    except DataError as error:
        raise InputError(str(error)) from None
    if cfg.clients and len(dataset.train) // cfg.clients < cfg.batch_size:
        raise InputError(f"batch_size: {cfg.batch_size} is more than a client's shard of "
                         f"{len(dataset.train) // cfg.clients} samples")
    if cfg.init:
        from clients.models import build_model, flat_weights
        from experiments.start import StartError, checkpoint_weights
        try:
            size = flat_weights(build_model(cfg.model, dataset.shape, dataset.num_classes, cfg.seed)).size
            checkpoint_weights(cfg.init, size)
        except StartError as error:
            raise InputError(str(error)) from None
    out = Path(cfg.out) if cfg.out and not cfg.resume else None
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"out: {out} already exists and is not an empty directory; choose another --out")


def _default_out(cfg: RunConfig) -> str:
    stem = f"runs/{time.strftime('%Y%m%d-%H%M%S')}-c{cfg.clients or DEFAULT_CLIENTS}-n{cfg.n_sync}"
    out, n = stem, 1
    while Path(out).exists():
        n += 1
        out = f"{stem}-{n}"
    return out


def _error(message: str) -> int:
    """One line, printed once per job (by rank 0 when mpiexec started every rank)."""
    from experiments.launch import launcher_rank

    if launcher_rank() in (None, 0):
        print(f"asgd: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
