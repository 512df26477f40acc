"""The example scripts, a user's own train.py, launched by the user's mpiexec: rank 0
serves, the other ranks train the script's model on its Dataset, and train() hands rank 0
the run's result."""
from __future__ import annotations

import json
import math
import sys

import pytest

from tests.conftest import MPIEXEC, ROOT, run_command

pytestmark = pytest.mark.mpi


def test_mpiexec_runs_a_users_script_with_rank_0_serving(tmp_path):
    out = tmp_path / "run"
    result = run_command(["env", "EXAMPLE_DATA=generated", "EXAMPLE_LIMIT=256", MPIEXEC, "-n", "3",
                          sys.executable, str(ROOT / "examples" / "fashion_resnet.py"), "--steps", "4",
                          "--batch-size", "16", "--eval-samples", "64", "--eval-every", "100", "--threads", "1",
                          "--quiet", "--out", str(out)], timeout=180)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["minibatches"] == 8 and summary["clock"] == "wall"
    # the script prints train()'s result where it holds the summary: on rank 0 alone
    said = [line for line in result.stdout.splitlines() if line.startswith(f"{out}: ")]
    assert said == [f"{out}: complete; final test error {summary['final_test_error']}"]
    config = json.loads((out / "config.json").read_text())
    assert [r["role"] for r in config["provenance"]["ranks"]] == ["server", "client", "client"]
    assert config["model"].endswith("examples/fashion_resnet.py:make_model")


@pytest.mark.long
def test_mpiexec_runs_the_char_lm_example_with_its_own_loss_and_metric(tmp_path):
    """The sequence example under the user's mpiexec: 1 server, 1 client; logits (B, T, V)
    through its token loss, its metric on the curve, AdamW with warmup and cosine."""
    out = tmp_path / "run"
    result = run_command([MPIEXEC, "-n", "2", sys.executable, str(ROOT / "examples" / "char_lm.py"), "--steps", "4",
                          "--batch-size", "8", "--eval-samples", "16", "--eval-every", "100", "--threads", "1",
                          "--quiet", "--out", str(out)], timeout=180)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["minibatches"] == 4 and summary["clock"] == "wall" and not summary["status"].startswith("failed")
    assert summary["final_test_metric"] == pytest.approx(math.exp(summary["final_test_loss"]), rel=1e-5)
    config = json.loads((out / "config.json").read_text())
    assert config["loss"].endswith("examples/char_lm.py:token_loss") and config["optimizer"] == "adamw"
    said = [line for line in result.stdout.splitlines() if line.startswith(f"{out}: ")]
    assert said == [f"{out}: {summary['status']}; validation loss {summary['final_test_loss']:.3f}, "
                    f"perplexity {summary['final_test_metric']:.2f}"]
