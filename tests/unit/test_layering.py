"""DESIGN.md's layering holds in the source: no import circles, no upward imports, the run
directory (rundir) imports nothing else of ours, plots reads run directories only, the wire
sits below the rest of paramserver, mpi4py only where it must be. The checker (tests/layering.py) reads files
with `ast` and imports nothing; scripts/sizes.py counts with it too.
"""
from __future__ import annotations

from tests.conftest import ROOT
from tests.layering import EXCEPTIONS, breaches, offences, read_sources


def test_the_tree_keeps_the_layering():
    found = offences(read_sources(ROOT))
    assert not found, "\n" + "\n".join(found)


def test_every_exception_still_occurs():
    """An exception whose import is gone is dropped from the list, so the list only shrinks."""
    stale = set(EXCEPTIONS) - breaches(read_sources(ROOT))[1]
    assert not stale, f"drop these from tests/layering.py's EXCEPTIONS: {sorted(stale)}"


def test_the_checker_names_each_offence_by_file_and_line():
    """Each rule fires on a made-up tree that breaks it, and is quiet where the order holds."""
    tree = {
        "paramserver/__init__.py": "",
        "paramserver/store.py": "import numpy\nfrom clients import client\nfrom rundir.layout import RunDir\n",
        "paramserver/wire/__init__.py": "",
        "paramserver/wire/frame.py": "from . import protocol\n\ndef f():\n    from paramserver.store import Store\n",
        "paramserver/wire/protocol.py": "",
        "paramserver/wire/transport.py": "from mpi4py import MPI\nfrom .frame import f\n",
        "rundir/__init__.py": "",
        "rundir/layout.py": "from paramserver import wire\n",
        "clients/__init__.py": "",
        "clients/client.py": "import paramserver.wire.protocol\nimport mpi4py.MPI\n",
        "experiments/__init__.py": "",
        "experiments/a.py": "from experiments import b\nimport plots.curves\n",
        "experiments/b.py": "if True:\n    from experiments.c import x\n",
        "experiments/c.py": "from experiments.a import y\n",
        "experiments/rank/__init__.py": "",
        "experiments/rank/entry.py": "from mpi4py import MPI\n",
        "plots/__init__.py": "",
        "plots/curves.py": "from rundir.layout import RunDir\nfrom paramserver import store\n",
    }
    assert sorted(offences(tree)) == sorted([
        "experiments/a.py:1: imports experiments.b (import circle: experiments.a -> experiments.b "
        "(experiments/a.py:1) -> experiments.c (experiments/b.py:2) -> experiments.a (experiments/c.py:1))",
        "paramserver/store.py:2: imports clients.client "
        "(upward: rundir <- paramserver <- runconfig <- clients <- experiments)",
        "paramserver/wire/frame.py:4: imports paramserver.store (the wire sits below the rest of paramserver)",
        "rundir/layout.py:1: imports paramserver.wire "
        "(rundir is the lowest layer: it imports nothing of the rest)",
        "clients/client.py:2: imports mpi4py.MPI (mpi4py only in the wire's transport, the launch code and the bench)",
        "plots/curves.py:2: imports paramserver.store (plots reads run directories only: rundir)",
    ])
    allowed = {("plots.curves", "paramserver.store"): "a named exception"}
    assert not [line for line in offences(tree, allowed) if line.startswith("plots/")]
