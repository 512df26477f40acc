"""The Slurm template names only files that exist."""
from __future__ import annotations

import re

from tests.conftest import ROOT

SBATCH = ROOT / "experiments" / "configs" / "paper" / "slurm.sbatch"


def test_every_path_the_slurm_template_names_exists():
    named = set(re.findall(r"(?:experiments|examples|scripts|docs)/[\w./-]*\w", SBATCH.read_text()))
    assert "experiments/configs/paper/starts.toml" in named
    assert [path for path in sorted(named) if not (ROOT / path).exists()] == []

