"""Modules over 400 lines, functions over 60, import circles and upward imports: a check.

    python scripts/sizes.py [--tests] [--module-lines 400] [--function-lines 60]

Reads the .py files under asgd, rundir, paramserver, clients, experiments and plots (and
tests with --tests) with `ast`, imports none of them, prints each module and function over
its limit, longest first, then the layering's offences (tests/layering.py, the checker
tests/unit/test_layering.py runs) and the totals. Exit status 1 when anything is listed,
so a CI step or a Makefile can run it; 0 when the tree is within every limit.
A function's length runs from its `def` to its last line, docstring and nested functions
included (a nested function is listed on its own as well).
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.layering import PACKAGES, breaches, circles, read_sources  # noqa: E402 - after the path


def functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, first line, length) of every function, methods and nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                yield name, node.lineno, node.end_lineno - node.lineno + 1
            yield from functions(node, name + ".")
        else:
            yield from functions(node, prefix)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", action="store_true", help="count tests/ too (sizes only)")
    parser.add_argument("--module-lines", type=int, default=400)
    parser.add_argument("--function-lines", type=int, default=60)
    args = parser.parse_args(argv)

    sources = read_sources(ROOT, PACKAGES + (("tests",) if args.tests else ()))
    long_modules, long_functions, n_functions = [], [], 0
    for path, source in sources.items():
        lines = len(source.splitlines())
        if lines > args.module_lines:
            long_modules.append((lines, path))
        for name, line, length in functions(ast.parse(source, filename=path)):
            n_functions += 1
            if length > args.function_lines:
                long_functions.append((length, f"{path}:{line}: {name}"))

    ours = {path: source for path, source in sources.items() if path.partition("/")[0] in PACKAGES}
    found_circles, (upward, excepted) = circles(ours), breaches(ours)
    for lines, path in sorted(long_modules, reverse=True):
        print(f"{path}: {lines} lines (module over {args.module_lines})")
    for length, where in sorted(long_functions, reverse=True):
        print(f"{where}: {length} lines (function over {args.function_lines})")
    for line in found_circles + upward:
        print(line)
    total = sum(len(s.splitlines()) for s in sources.values())
    print(f"total: {len(sources)} modules, {total} lines, {n_functions} functions; "
          f"modules over {args.module_lines} lines: {len(long_modules)}, "
          f"functions over {args.function_lines} lines: {len(long_functions)}, "
          f"import circles: {len(found_circles)}, layering offences: {len(upward)} "
          f"(and {len(excepted)} allowed by name in tests/layering.py's EXCEPTIONS)")
    return 1 if long_modules or long_functions or found_circles or upward else 0


if __name__ == "__main__":
    sys.exit(main())
