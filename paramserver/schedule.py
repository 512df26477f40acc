"""Learning-rate schedules as functions of global progress, in samples.

Progress is what the whole run has done before an update: in async mode the samples
the server has taken in pushes (`batch_size` times the sum of the clients' pushed
steps, which every server of a sharded run knows alike), so a client trains each
window at the lr of the weights it pulled and the server's own lr (the `sgd` and
`adagrad` rules) follows the same curve (under `lr_scaling = "adascale"`, `fresh`'s steps'
gains summed, times `batch_size`: AdaScale's gain-weighted progress, rules/fresh.py); in
the collective modes `(step - 1) x K x batch_size` before step `step`. With one client
either is `(t - 1) x batch_size` before step t, so `factor(e * batch_size)` is torch's
`LambdaLR` multiplier after e steps (tested against it).

    lr(s) = lr x scale(s) x warmup(s) x decay(s)
    warmup(s) = min(1, (s + batch_size) / lr_warmup)         (1 without warmup)
    scale(s) = 1 + (batch_scale - 1) x ramp(t),  ramp(t) = min(1, (t + 1) / lr_scale_warmup)
               (t the updates taken before: the server's version under a server rule, whose
               steps may drop pushes; s / (K x batch_size) in the collective modes)
    cosine:  decay(s) = floor + (1 - floor) (1 + cos(pi p)) / 2,
             p = min(1, (s - lr_warmup) / (planned - lr_warmup)) after the warmup, else 0
    step:    decay(s) = lr_step_factor ** (milestones <= s)

`batch_scale` is the batch-size scaling rule (`rules.scaling.batch_scale`): with `lr_scaling =
"linear"` the client minibatches n one update averages (K in sync mode, K -
backup_workers with backup workers, 1 otherwise; `fresh` applies it to the minibatches
each step gathers), with "sqrt" its root; "adascale" is 1 here and the measured gain in
`fresh`'s step, unramped. `lr_scale_warmup` ramps it in from one minibatch's lr over
that many updates (Goyal et al. 2017's gradual warmup), so one client's lr is
untouched; `lr_warmup` ramps the whole lr up from 0 over samples.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from paramserver.settings import RunSettings
from rundir.modes import Mode
from paramserver.rules.scaling import ramped_scale


@dataclass(frozen=True)
class Schedule:
    lr: float
    batch_size: int
    planned: int                  # the run's planned samples (cosine's length)
    warmup: int = 0
    kind: str = "constant"
    floor: float = 0.0
    milestones: tuple[int, ...] = ()
    step_factor: float = 0.1
    scaling: str = "none"
    averaged: int = 1             # the client minibatches one update averages (the scaling's n)
    scale_warmup: int = 0
    counted: int = 1              # the client minibatches progress counts an update (K in the collective modes)

    @classmethod
    def for_run(cls, cfg: RunSettings, clients: int, lr: float | None = None) -> "Schedule":
        """The run's schedule of `lr` (default: the clients' lr) for `clients` clients."""
        averaged = clients - cfg.backup_workers if cfg.mode == Mode.SYNC else 1
        counted = 1 if cfg.mode == Mode.ASYNC else clients  # a backup worker's gradient counts, unused
        return cls(cfg.lr if lr is None else lr, cfg.batch_size, clients * cfg.steps * cfg.batch_size,
                   cfg.lr_warmup, cfg.lr_schedule, cfg.lr_floor, parse_milestones(cfg.lr_milestones),
                   cfg.lr_step_factor, cfg.lr_scaling, averaged, cfg.lr_scale_warmup, counted)

    def factor(self, samples: int) -> float:
        """lr(samples) / lr: every multiplier at once."""
        warm = min(1.0, (samples + self.batch_size) / self.warmup) if self.warmup else 1.0
        updates = samples // (self.counted * self.batch_size)
        return ramped_scale(self.scaling, self.averaged, self.ramp(updates)) * warm * self._decay(samples)

    def ramp(self, updates: int) -> float:
        """How far the batch-size scaling has ramped in, 0 to 1, for the update after
        `updates` taken: its warmup counts updates, not samples, so it lasts as many steps
        at every K and whatever share of the pushes `fresh`'s steps drop (counted in samples
        pushed, the ramp under stragglers ended early, and with it the early steps' caution)."""
        return min(1.0, (updates + 1) / self.scale_warmup) if self.scale_warmup else 1.0

    def at(self, samples: int) -> float:
        """The lr after `samples` of progress."""
        return self.lr * self.factor(samples)

    def _decay(self, samples: int) -> float:
        if self.kind == "step":
            return self.step_factor ** sum(m <= samples for m in self.milestones)
        if self.kind == "cosine" and samples > self.warmup and self.planned > self.warmup:
            p = min(1.0, (samples - self.warmup) / (self.planned - self.warmup))
            return self.floor + (1 - self.floor) * (1 + math.cos(math.pi * p)) / 2
        return 1.0


def parse_milestones(text: str) -> tuple[int, ...]:
    """`lr_milestones` as sample counts ("" is none); ValueError unless positive and increasing."""
    milestones = tuple(int(part) for part in text.split(",")) if text.strip() else ()
    if any(m <= 0 for m in milestones) or list(milestones) != sorted(set(milestones)):
        raise ValueError(text)
    return milestones
