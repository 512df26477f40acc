"""Sweep specs as loaded: a scaling spec's `evaluations` (about that many test
evaluations a run, whatever a version is: a push, a step the rule gathers, a step of
every client), its targets in the runs' measure, and every spec the project ships."""
from __future__ import annotations

import pytest

from experiments.sweep.spec import load_spec
from runconfig.settings import ConfigError


def test_evaluations_count_the_versions_each_rule_makes(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\nbackend = "sim"\nevaluations = 10\nsamples = 64000\n[base]\nbatch_size = 64\n'
                    '[[grid]]\nclients = [8]\nrule = ["add", "fresh"]\nn_sync = [1, 2]\n'
                    '[[grid]]\nclients = [8]\nmode = ["sync"]\n')
    every = {(p.config.mode, p.config.rule, p.config.n_sync): p.config.eval_every for p in load_spec(str(path)).points}
    # 1,000 minibatches: 1,000 pushes of add, 500 of n_sync 2; fresh steps once per push of
    # every client (8 minibatches; at n_sync 2, 16: 63 steps of 63 pushes a client); sync 125 steps
    assert every == {("async", "add", 1): 100, ("async", "add", 2): 50, ("async", "fresh", 1): 12,
                     ("async", "fresh", 2): 6, ("sync", "fresh", 1): 12}


def test_every_shipped_spec_loads():
    """Each spec under experiments/configs expands into points whose configs pass their
    checks (a typo or a refused value fails here, not after an hour of a study)."""
    from pathlib import Path

    specs = sorted(Path(__file__).resolve().parents[2].glob("experiments/configs/*/*.toml"))
    assert len(specs) >= 10
    for spec in specs:
        assert load_spec(str(spec)).points, spec


@pytest.mark.parametrize("base, targets, ok", [
    ("", "[0.13, 0.12]", True), ("", "[13.0]", False), ("", "[1]", False),  # a classifier's: errors
    ('metric = "lm.py:perplexity"\n', "[10.0, 8.5]", True), ('loss = "lm.py:token_loss"\n', "[2]", True),
    ('metric = "lm.py:perplexity"\n', "[0.0]", False), ('metric = "lm.py:perplexity"\n', '["low"]', False),
    ('metric = "lm.py:perplexity"\n', "[inf]", False)])
def test_targets_are_errors_unless_the_runs_are_measured_by_their_own_metric_or_loss(tmp_path, base, targets, ok):
    """A language model's study sets its targets in its own measure (a perplexity, a loss);
    a classifier's stay errors in (0, 1), so a percent typed as 13 is refused."""
    path = tmp_path / "s.toml"
    path.write_text(f'name = "s"\nbackend = "sim"\nstudy = "scaling"\ntargets = {targets}\n[base]\n{base}'
                    '[[grid]]\nclients = [1]\n')
    if ok:
        assert load_spec(str(path)).meta["targets"]
    else:
        with pytest.raises(ConfigError, match="targets must be"):
            load_spec(str(path))
