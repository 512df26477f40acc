"""Learning-rate schedules as functions of global progress, in samples.

Progress is what the whole run has done before an update: in async mode the samples
the server has taken in pushes (`batch_size` times the sum of the clients' pushed
steps, which every server of a sharded run knows alike), so a client trains each
window at the lr of the weights it pulled and the server's own lr (the `sgd` and
`adagrad` rules) follows the same curve; in the collective modes `(step - 1) x K x
batch_size` before step `step`. With one client either is `(t - 1) x batch_size`
before step t, so `factor(e * batch_size)` is torch's `LambdaLR` multiplier after e
steps (tested against it).

    lr(s) = lr x scale x warmup(s) x decay(s)
    warmup(s) = min(1, (s + batch_size) / lr_warmup)         (1 without warmup)
    cosine:  decay(s) = floor + (1 - floor) (1 + cos(pi p)) / 2,
             p = min(1, (s - lr_warmup) / (planned - lr_warmup)) after the warmup, else 0
    step:    decay(s) = lr_step_factor ** (milestones <= s)

`scale` is the linear scaling rule (Goyal et al. 2017): with `lr_scaling = "linear"`,
the client minibatches one update averages (K in sync mode, K - backup_workers with
backup workers, 1 otherwise); the warmup it needs is the user's `lr_warmup`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from paramserver.config import RunConfig, parse_milestones


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
    scale: float = 1.0

    @classmethod
    def for_run(cls, cfg: RunConfig, clients: int, lr: float | None = None) -> "Schedule":
        """The run's schedule of `lr` (default: the clients' lr) for `clients` clients."""
        averaged = clients - cfg.backup_workers if cfg.mode == "sync" else 1
        return cls(cfg.lr if lr is None else lr, cfg.batch_size, clients * cfg.steps * cfg.batch_size,
                   cfg.lr_warmup, cfg.lr_schedule, cfg.lr_floor, parse_milestones(cfg.lr_milestones),
                   cfg.lr_step_factor, averaged if cfg.lr_scaling == "linear" else 1.0)

    @property
    def constant(self) -> bool:
        return self.kind == "constant" and not self.warmup

    def factor(self, samples: int) -> float:
        """lr(samples) / lr: every multiplier at once."""
        warm = min(1.0, (samples + self.batch_size) / self.warmup) if self.warmup else 1.0
        return self.scale * warm * self._decay(samples)

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
