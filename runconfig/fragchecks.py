"""The checks of `fragments` (streamed fragments, docs/training.md): where a push in P
slices sent in turn has a meaning this tool gives it, and one line saying why not elsewhere.

A fragment is a slice of the client's weight change applied to the same slice of the
server's weights, so the rule must be one whose update of a slice reads only that slice's
change (`Rule.by_slice`: `add`, `scaled`, `staleness`) or that keeps its state slice by
slice (`Rule.per_slice`: `nesterov`, each slice its own rounds, so its answers are never
held for a round: `nesterov_reply` round is refused). Each fragment is pushed once a
window of n_sync minibatches, the P of them n_sync/P apart, so n_sync is a multiple of P,
and every fragment fetches its slice back (n_fetch = n_push). With sharded servers a
fragment goes to each server as its piece (`protocol.fragment_pieces`). The client does
not wait for a reply, so the collective modes (which have no server to stream to) and
the settings that reshape a client's windows or restart it (DyLU, failures, joins,
replays) are refused until they are given a meaning with fragments.
"""
from __future__ import annotations

from typing import Any

from paramserver.rules import rule_class
from rundir.modes import Mode
from runconfig.require import require as _require


def check_fragments(cfg: Any) -> None:
    """`fragments`: at least 1; above 1 only where streamed fragments are defined."""
    p = cfg.fragments
    _require(p >= 1, "fragments", f"must be at least 1 (1: whole pushes), got {p}")
    if p == 1:
        return
    _require(cfg.mode == Mode.ASYNC, "fragments", f"needs --mode async (a server to stream to), got {cfg.mode}")
    rule = rule_class(cfg.rule)
    _require(rule.pushes == "delta" and (rule.by_slice or rule.per_slice), "fragments",
             f"needs a rule that applies a weight change slice by slice (add, scaled, staleness, nesterov), "
             f"got {cfg.rule}")
    _require(not rule.rounds or cfg.nesterov_reply != "round", "fragments",
             "not with nesterov_reply round (a fragment's answer is never held for a round: now or auto)")
    _require(cfg.push_every % p == 0, "fragments",
             f"n_sync (n_push) must be a multiple of the {p} fragments (each pushed every n_sync/{p} minibatches), "
             f"got {cfg.push_every}")
    _require(cfg.fetch_every == cfg.push_every, "fragments", "needs n_fetch = n_push (each fragment fetches its slice)")
    for key, on in (("dylu", cfg.dylu), ("mtbf", cfg.mtbf), ("joinable", cfg.joinable), ("spares", cfg.spares),
                    ("replay", cfg.replay)):
        _require(not on, "fragments", f"not with {key} (no meaning given to a fragment there yet)")
