"""DESIGN.md's layering, checked by reading the source with `ast` (nothing is imported).

    offences(read_sources(ROOT)) -> ["path:line: imports X (reason)", ...]

The rules: no import circle among the project's modules; rundir <- paramserver <-
runconfig <- clients <- experiments <- bench <- asgd, never upward; the run directory (rundir) imports nothing else of ours, so
every package reads it without reaching into another's; plots reads run directories only
(rundir); inside paramserver the wire imports nothing of the rest of it; mpi4py only in
the wire's transport, the launch code and the bench. Every import counts, at module level,
inside a function or under `if TYPE_CHECKING:`, since each is an edge someone must keep in
their head. The packages are walked, not listed, so the rules hold however modules move.
Used by tests/unit/test_layering.py and scripts/sizes.py.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("asgd", "bench", "rundir", "paramserver", "runconfig", "clients", "experiments", "plots")

# What each package may import of ours, by module-name prefix (its own modules included),
# and why not the rest. experiments may import plots: `asgd report` draws the figures.
MAY_IMPORT = {
    "rundir": (("rundir",), "rundir is the lowest layer: it imports nothing of the rest"),
    "paramserver": (("rundir", "paramserver"), "upward: rundir <- paramserver <- runconfig <- clients <- experiments"),
    "runconfig": (("rundir", "paramserver", "runconfig"), "upward: the run's config sits below clients"),
    "clients": (("rundir", "paramserver", "runconfig", "clients"), "upward: clients sit below experiments and plots"),
    "experiments": (("rundir", "paramserver", "runconfig", "clients", "experiments", "plots"),
                    "upward: experiments sits below asgd"),
    "bench": (("rundir", "paramserver", "runconfig", "clients", "experiments", "plots", "bench"),
              "the bench measures the tool from outside it: only asgd sits above it"),
    "asgd": (PACKAGES, "asgd, the public import and the command, is the top layer"),
    "plots": (("plots", "rundir"), "plots reads run directories only: rundir"),
}
# The bottom of paramserver: each imports only itself (the stdlib and third parties aside).
FLOORS = {
    "paramserver.wire": "the wire sits below the rest of paramserver",
}
# mpi4py starts MPI when imported: only the wire's transport, the launch code (the parent's
# side and the ranks') and the bench may import it.
MPI_MAY = ("paramserver.wire.transport", "experiments.parent", "experiments.rank", "bench")

# (importer, imported): why it is allowed for now. Each is a breach of the order above,
# kept visible here; the test fails once one no longer occurs, so the list only shrinks.
EXCEPTIONS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    path: str      # the importing file, relative to the root
    line: int
    importer: str  # its module name
    target: str    # one of our modules (the longest that names it), or the external name


def module_name(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_sources(root: Path, packages=PACKAGES) -> dict[str, str]:
    """{relative path: source} of every .py file under the packages, walked."""
    return {f.relative_to(root).as_posix(): f.read_text(encoding="utf-8")
            for pkg in packages for f in sorted((root / pkg).rglob("*.py"))}


def _ours(name: str, known: set[str]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The module a `from ... import` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(sources: dict[str, str]) -> list[Import]:
    """Every import in the sources; `from a import b` names a.b where that is a module of ours."""
    known = {module_name(p) for p in sources}
    found = []
    for path, source in sources.items():
        importer = module_name(path)
        for node in ast.walk(ast.parse(source, filename=path)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, importer, path.endswith("__init__.py"))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for name in dict.fromkeys(names):
                found.append(Import(path, node.lineno, importer, _ours(name, known) or name))
    return found


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _breach(imp: Import, known: set[str]) -> str | None:
    """Why an import breaks the order (None where it does not)."""
    if imp.target.partition(".")[0] == "mpi4py":
        if not _within(imp.importer, MPI_MAY):
            return "mpi4py only in the wire's transport, the launch code and the bench"
        return None
    if imp.target not in known or imp.target == imp.importer:
        return None
    may, why = MAY_IMPORT[imp.importer.partition(".")[0]]
    if not _within(imp.target, may):
        return why
    for floor, why in FLOORS.items():
        if _within(imp.importer, (floor,)) and not _within(imp.target, (floor,)):
            return why
    return None


def breaches(sources: dict[str, str], exceptions=EXCEPTIONS) -> tuple[list[str], set]:
    """Offences against the order, and the exceptions that were used."""
    known = {module_name(p) for p in sources}
    lines, used = [], set()
    for imp in imports(sources):
        why = _breach(imp, known)
        if why and (imp.importer, imp.target) in exceptions:
            used.add((imp.importer, imp.target))
        elif why:
            lines.append(f"{imp.path}:{imp.line}: imports {imp.target} ({why})")
    return lines, used


def _graph(sources: dict[str, str]) -> dict[str, dict[str, Import]]:
    """Our modules' edges: {importer: {imported: its first import}}."""
    known = {module_name(p) for p in sources}
    graph: dict[str, dict[str, Import]] = {m: {} for m in known}
    for imp in imports(sources):
        if imp.target in known and imp.target != imp.importer:
            graph[imp.importer].setdefault(imp.target, imp)
    return graph


def _components(graph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's)."""
    index, low, stack, groups = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _shortest_cycle(graph, group: list[str]) -> list[str]:
    """The shortest way from the group's first module back to it (breadth first)."""
    first = group[0]
    came = {first: None}
    frontier = [first]
    while frontier:
        nxt = []
        for v in frontier:
            if first in graph[v]:
                ring = [first]
                while v is not None:
                    ring.append(v)
                    v = came[v]
                return ring[::-1]
            for w in sorted(set(graph[v]) - set(came)):
                came[w] = v
                nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle through {first}")  # a strongly connected group has one


def circles(sources: dict[str, str]) -> list[str]:
    """One line per import circle: its first import, then the way round with each import's line."""
    graph = _graph(sources)
    lines = []
    for group in _components(graph):
        ring = _shortest_cycle(graph, group)
        steps = [graph[a][b] for a, b in zip(ring, ring[1:])]
        way = " -> ".join([ring[0]] + [f"{s.target} ({s.path}:{s.line})" for s in steps])
        more = f"; {len(group)} modules reach one another: {', '.join(group)}" if len(group) > len(ring) - 1 else ""
        lines.append(f"{steps[0].path}:{steps[0].line}: imports {steps[0].target} (import circle: {way}{more})")
    return lines


def offences(sources: dict[str, str], exceptions=EXCEPTIONS) -> list[str]:
    """Every offence, one line each: `path:line: imports X (reason)`."""
    return circles(sources) + breaches(sources, exceptions)[0]
