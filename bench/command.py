"""`asgd bench`: the bench's subcommand, handed to experiments.cli by asgd.command (the
bench measures the tool from outside it, so the command it lives in does not import it).

    asgd bench [--quick] [--only SECTION,...] [--cluster | --hosts H1,H2,H3] [--out FILE]
    asgd bench --compare A.json B.json
"""
from __future__ import annotations

import argparse
from pathlib import Path


class BenchCommand:
    name = "bench"

    def add(self, commands: argparse._SubParsersAction) -> None:
        bench = commands.add_parser("bench", help="measure the server, the wire, peers and the simulator (minutes)")
        bench.add_argument("--out", default="results/bench.json", help="where the figures go (default: %(default)s)")
        bench.add_argument("--markdown", help="the tables as a Markdown page (default: --out with the suffix .md; "
                                              "`make bench`: docs/results/bench.md)")
        bench.add_argument("--quick", action="store_true",
                           help="fewer repeats and sizes (a smoke run, not for the docs)")
        where = bench.add_mutually_exclusive_group()
        where.add_argument("--cluster", action="store_true",
                           help="also measure across hosts, on a test cluster the bench brings up and takes down "
                                "(scripts/cluster.sh: root and ip netns; where missing, the section says so)")
        where.add_argument("--hosts", metavar="H1,H2,H3",
                           help="also measure across these hosts: the server on the first, clients on the others, "
                                "reached as mpiexec reaches them (ssh); TMPDIR on a file system they share")
        bench.add_argument("--only", metavar="SECTION,...", help="measure only these sections (wire, load, idle, "
                           "server_bound, peers, simulator, hosts), keeping the others from --out")
        bench.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                           help="measure nothing: how far two runs' ratios are apart (does it repeat?)")

    def run(self, args: argparse.Namespace) -> int:
        """Its hosts and sections checked before anything is measured."""
        if args.compare:
            from bench.compare import compare, read_results

            print(compare(*(read_results(Path(path)) for path in args.compare)))
            return 0
        from bench.hosts import CLUSTER, parse_hosts
        from bench.suite import run_bench

        across = parse_hosts(args.hosts) if args.hosts else CLUSTER if args.cluster else None
        only = tuple(name.strip() for name in args.only.split(",")) if args.only else ()
        return run_bench(args.out, args.quick, args.markdown, across, only)
