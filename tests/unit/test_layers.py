"""The house's promises about imports: MPI only where it must be, nothing on import.

This tier's conftest makes `import mpi4py` fail in every unit test, so the in-process
checks here (a simulated run, a refusal) break if they pull MPI in instead of passing
by accident; the first test checks that the block is in force. What a module does on
import is checked in a fresh interpreter, where nothing was imported before.
"""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from tests.conftest import ROOT

BLOCK_MPI = "import sys; sys.modules['mpi4py'] = None\n"
CORE = ["runconfig.settings", "paramserver.wire.protocol", "paramserver.store", "paramserver.rules",
        "paramserver.events", "paramserver.handler", "paramserver.recorder", "paramserver.drivers.server",
        "paramserver.drivers.inprocess",
        "clients.loop", "clients.driver", "experiments.sim.simulator", "experiments.rank.entry", "experiments.cli",
        "experiments.sweep.spec", "experiments.sweep.run", "experiments.parent.claim", "experiments.run.assemble",
        "plots.analysis", "plots.scaling", "paramserver.schedule", "clients.stragglers"]


@pytest.mark.parametrize("module", ["mpi4py", "mpi4py.MPI", "paramserver.wire.transport"])
def test_mpi_cannot_be_imported_in_the_unit_tier(module):
    """Even when another tier's test imported it earlier in this process."""
    with pytest.raises(ImportError, match="mpi4py"):
        importlib.import_module(module)


def test_the_core_imports_without_mpi():
    result = subprocess.run([sys.executable, "-c", BLOCK_MPI + "import importlib\nfailed = []\n"
                             f"for module in {CORE!r}:\n"
                             "    try:\n        importlib.import_module(module)\n"
                             "    except ImportError as error:\n        failed.append(f'{module}: {error}')\n"
                             "print(failed)"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


def test_a_simulated_run_and_a_refusal_need_no_mpi(tmp_path, tiny_npz, capsys):
    from experiments.cli import main

    run = tmp_path / "run"
    assert main(["train", "--backend", "sim", "--clients", "2", "--steps", "3", "--data", str(tiny_npz),
                 "--batch-size", "32", "--eval-samples", "50", "--quiet", "--out", str(run)]) == 0
    assert (run / "summary.json").exists()
    capsys.readouterr()
    assert main(["train", "--n-sync", "0"]) == 2
    assert capsys.readouterr().err.strip() == "asgd: error: n_sync: must be at least 1, got 0"


def test_every_atomic_writer_makes_its_folder(tmp_path):
    from rundir.durable import write_json_atomic

    path = tmp_path / "results" / "deeper" / "bench.json"
    write_json_atomic(path, {"wire": [1, 2]})
    assert path.read_text().startswith("{")


def test_every_bench_module_imports_and_every_study_says_its_usage():
    """The bench is run by hand, not by the suite: a rename it depends on would break it
    unseen. Every module of bench/ imports (in a fresh interpreter, MPI allowed), and each
    study with a `main` parses `--help`."""
    script = ("import contextlib, importlib, io, pkgutil, sys\nimport bench\nfailed = []\n"
              "for found in pkgutil.walk_packages(bench.__path__, 'bench.'):\n"
              "    try:\n        module = importlib.import_module(found.name)\n"
              "    except Exception as error:\n        failed.append(f'{found.name}: {error!r}'); continue\n"
              "    if found.name.startswith('bench.studies.') and hasattr(module, 'main'):\n"
              "        sys.argv = [found.name, '--help']\n"
              "        try:\n            with contextlib.redirect_stdout(io.StringIO()) as said:\n"
              "                module.main()\n"
              "        except SystemExit as end:\n"
              "            if end.code not in (0, None) or 'usage' not in said.getvalue():\n"
              "                failed.append(f'{found.name} --help: exit {end.code}')\n"
              "        else:\n            failed.append(f'{found.name} --help: ran')\n"
              "print(failed)")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().splitlines()[-1] == "[]", result.stdout + result.stderr
