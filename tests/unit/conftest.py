"""The unit tier: pure and in-process, without MPI.

`import mpi4py` (which starts MPI) fails in every unit test and while its module is
collected, so a unit test that pulls MPI in, directly or through a module it imports,
fails instead of passing by accident. Only this tier's tests run so: tests of other
tiers in the same pytest process import mpi4py in-process (tests/reliability/
test_messages.py, tests/sim/test_gpu.py). A module of ours that imported mpi4py
earlier in the process (paramserver.wire.transport, say) is hidden from the unit tests too,
so that importing it again fails here as it would in a fresh process.
"""
from __future__ import annotations

import importlib.abc
import sys
from contextlib import contextmanager
from types import ModuleType

import pytest

OURS = ("rundir", "paramserver", "clients", "experiments", "plots", "tests")


class NoMPI(importlib.abc.MetaPathFinder):
    """Refuses mpi4py and its submodules."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "mpi4py":
            raise ImportError(f"{name}: the unit tier runs without MPI (tests/unit/conftest.py)", name=name)
        return None


def _holds_mpi(module: ModuleType) -> bool:
    """Whether one of our modules holds an object of mpi4py (it imported it)."""
    for value in list(vars(module).values()):
        name = getattr(value, "__module__", None) if not isinstance(value, ModuleType) else value.__name__
        if isinstance(name, str) and name.partition(".")[0] == "mpi4py":
            return True
    return False


@contextmanager
def mpi_unimportable():
    """mpi4py refused, and what imported it hidden (from sys.modules and from its
    package's attributes), until the block ends."""
    hidden: dict[str, ModuleType] = {}
    if any(name.partition(".")[0] == "mpi4py" for name in sys.modules):  # else nothing of ours holds it
        hidden = {name: module for name, module in list(sys.modules.items())
                  if module is not None and (name.partition(".")[0] == "mpi4py" or
                                             (name.partition(".")[0] in OURS and _holds_mpi(module)))}
    parents = []
    for name, module in hidden.items():
        del sys.modules[name]
        package, _, leaf = name.rpartition(".")
        if package in sys.modules and getattr(sys.modules[package], leaf, None) is module:
            parents.append((sys.modules[package], leaf, module))
            delattr(sys.modules[package], leaf)
    finder = NoMPI()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(hidden)
        for package, leaf, module in parents:
            setattr(package, leaf, module)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    with mpi_unimportable():  # a unit test module that imports MPI fails to collect
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with mpi_unimportable():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with mpi_unimportable():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with mpi_unimportable():
        return (yield)
