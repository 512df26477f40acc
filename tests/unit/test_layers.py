"""The house's promises about imports: MPI only where it must be, nothing on import.

Each check runs a fresh interpreter in which `import mpi4py` fails, so a module that
pulls MPI in (and would start it) breaks the check instead of passing by accident.
"""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

BLOCK_MPI = "import sys; sys.modules['mpi4py'] = None\n"
CORE = ["paramserver.config", "paramserver.protocol", "paramserver.store", "paramserver.rules",
        "paramserver.server", "paramserver.inprocess", "clients.loop", "clients.driver",
        "experiments.simulator", "experiments.launch", "experiments.cli", "experiments.sweep",
        "plots.analysis", "plots.rules"]


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_MPI + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_core_imports_without_mpi():
    result = python("import importlib\nfailed = []\n"
                    f"for module in {CORE!r}:\n"
                    "    try:\n        importlib.import_module(module)\n"
                    "    except ImportError as error:\n        failed.append(f'{module}: {error}')\n"
                    "print(failed)")
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


def test_a_simulated_run_and_a_refusal_need_no_mpi(tmp_path, tiny_npz):
    run = tmp_path / "run"
    result = python("from experiments.cli import main\n"
                    f"sys.exit(main(['train', '--backend', 'sim', '--clients', '2', '--steps', '3', '--data', "
                    f"'{tiny_npz}', '--batch-size', '32', '--eval-samples', '50', '--quiet', '--out', '{run}']))")
    assert result.returncode == 0, result.stderr
    assert (run / "summary.json").exists()
    refused = python("from experiments.cli import main\nsys.exit(main(['train', '--n-sync', '0']))")
    assert refused.returncode == 2 and refused.stderr.strip() == "asgd: error: n_sync: must be at least 1, got 0"


def test_every_atomic_writer_makes_its_folder(tmp_path):
    from paramserver.runlog import write_json_atomic

    path = tmp_path / "results" / "deeper" / "bench.json"
    write_json_atomic(path, {"wire": [1, 2]})
    assert path.read_text().startswith("{")
