"""The `asgd` console command: experiments.cli's subcommands, and the bench's, which
measures the tool from outside it and so is handed in from here, the top layer."""
from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from bench.command import BenchCommand
    from experiments.cli import main as run

    return run(argv, extra=(BenchCommand(),))


if __name__ == "__main__":
    raise SystemExit(main())
