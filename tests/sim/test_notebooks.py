"""Every notebook in plots/ runs headlessly against a sweep made by the simulator."""
from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT

NOTEBOOKS = sorted((ROOT / "plots").glob("*.ipynb"))


def test_there_is_a_notebook_per_figure_family():
    assert {p.stem for p in NOTEBOOKS} == {"fig1_single_client", "start_curves", "speedup", "staleness_modes"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_a_simulated_sweep(path, small_sweep, monkeypatch):
    monkeypatch.setenv("ASGD_SWEEP", str(small_sweep))
    monkeypatch.setenv("ASGD_WINDOW", "8")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # it drew its figure
