"""Sweep specs as loaded: a scaling spec's `evaluations` (about that many test
evaluations a run, whatever a version is: a push, a step the rule gathers, a step of
every client), and every spec the project ships."""
from __future__ import annotations

from experiments.sweep.spec import load_spec


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
