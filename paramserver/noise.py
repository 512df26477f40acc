"""The gradient noise scale B_simple, measured live from pushed gradients.

McCandlish et al. 2018 (arXiv 1812.06162, appendix A): a gradient over B samples has
E|G_B|^2 = |G|^2 + tr(Sigma) / B, so the squared norms at two batch sizes give unbiased
estimates of |G|^2 and of tr(Sigma), the per-sample gradient variance summed over the
weights; their ratio B_simple = tr(Sigma) / |G|^2 is about the batch beyond which a
bigger one buys little (the critical batch, near which `fresh_batch = "auto"` sets its
step).

Here a push of a gradient rule is the sum of n minibatch gradients of b samples each:
the small batch is one push (G_i = d_i / n_i over B_i = n_i b samples), the large one a
window of W pushes (G_W = sum d_i / sum n_i over sum B_i samples). Over each window

    small = mean_i |G_i|^2,  1/B_small = mean_i 1/B_i    (E[small] = |G|^2 + tr / B_small)
    big   = |G_W|^2,         B_big = sum_i B_i
    tr    = (small - big) / (1/B_small - 1/B_big)
    g2    = small - tr / B_small

and, as the paper does, each of tr and g2 is smoothed by an exponential moving average
over windows (bias-corrected, `DECAY` a window) before the ratio is taken, since one
window's g2 is noisy. Norms are summed in float64 (a host kernel's in float32 blocks of
256 first, paramserver/compute/hostkernel.py).

The window's sum `total` is not cleared when a window closes: the next window's first
push replaces it (a pass over the weights saved a window). Where the server's host
kernel applies the pushes (paramserver/compute/hostkernel.py), it sums each push into `total`
in the same pass as the update and sets `norm` to its own squares, so no push is read
here again.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from torch import Tensor

DECAY = 0.9  # of the moving averages, per window


class NoiseScale:
    """B_simple over windows of `window` pushes (at least 2) of minibatches of `batch_size`."""

    def __init__(self, batch_size: int, window: int):
        self.batch_size, self.window = batch_size, max(2, window)
        self.total: Tensor | None = None  # the window's pushes summed (the last window's, before a push)
        self.norm: Callable[[Tensor], float] = squared_norm  # of `total`, as a window closes
        self.pushes = self.minibatches = 0
        self.small = self.inverse = 0.0   # the window's sums of |G_i|^2 and of 1 / B_i
        self.g2 = self.trace = 0.0        # the moving averages, not yet bias-corrected
        self.windows = 0
        self.mean_norm: float | None = None  # |G_W| of the last window closed: the gradient norm's curve

    @property
    def starts(self) -> bool:
        """Whether the next push starts a window (and replaces `total` rather than adds to it)."""
        return self.pushes == 0

    def add(self, d: Tensor, minibatches: int, squared: float | None = None, summed: bool = False) -> bool:
        """Count a push of `minibatches` minibatch gradients summed (`squared`: its |d|^2,
        where the apply summed it on the way; `summed`: the apply put d in `total` too);
        True when it closed a window."""
        n = max(1, minibatches)
        self.small += (squared_norm(d) if squared is None else squared) / n ** 2
        self.inverse += 1.0 / (n * self.batch_size)
        if self.total is None:
            self.total = d.clone()
        elif self.starts and not summed:
            self.total.copy_(d)
        elif not summed:
            self.total.add_(d)
        self.pushes, self.minibatches = self.pushes + 1, self.minibatches + n
        if self.pushes < self.window:
            return False
        big = self.norm(self.total) / self.minibatches ** 2
        self.mean_norm = big ** 0.5
        trace, g2 = window_estimates(self.small / self.pushes, self.pushes / self.inverse, big,
                                     self.minibatches * self.batch_size)
        self.trace = DECAY * self.trace + (1 - DECAY) * trace
        self.g2 = DECAY * self.g2 + (1 - DECAY) * g2
        self.windows += 1
        self.pushes = self.minibatches = 0
        self.small = self.inverse = 0.0
        return True

    @property
    def estimate(self) -> float | None:
        """B_simple in samples; None before the first window, or while the estimate of
        |G|^2 is not positive (the noise drowns the gradient: no batch is too big)."""
        if not self.windows or self.g2 <= 0:
            return None
        return self.trace / self.g2  # both averages carry the same bias correction, which cancels

    def scalars(self) -> dict[str, float]:
        return {"pushes": self.pushes, "minibatches": self.minibatches, "small": self.small,
                "inverse": self.inverse, "g2": self.g2, "trace": self.trace, "windows": self.windows}

    def load_scalars(self, values: dict[str, float]) -> None:
        for name in ("pushes", "minibatches", "windows"):
            setattr(self, name, int(values.get(name, 0)))
        for name in ("small", "inverse", "g2", "trace"):
            setattr(self, name, float(values.get(name, 0.0)))


def squared_norm(v: Tensor) -> float:
    """|v|^2 summed in float64 (the two norms are subtracted: float32 sums would cancel),
    from one float64 copy: a copy is most of the time this takes, once a push."""
    wide = v.double()
    return float(wide.dot(wide))


def window_estimates(small: float, b_small: float, big: float, b_big: float) -> tuple[float, float]:
    """(tr(Sigma), |G|^2) from the mean squared norm `small` of gradients over `b_small`
    samples (a harmonic mean where they differ) and the squared norm `big` of their mean
    over `b_big` samples (McCandlish et al., A.1)."""
    trace = (small - big) / (1.0 / b_small - 1.0 / b_big)
    return trace, small - trace / b_small


def summarise(rows: list[dict]) -> dict:
    """The noise scale over training, from server.jsonl's noise rows: how many windows,
    the first, median and last estimate, and about ten (samples, B_simple) points."""
    measured = [(r["samples"], r["noise_scale"]) for r in rows if r.get("noise_scale") is not None]
    if not measured:
        return {"windows": sum(1 for r in rows if "noise_scale" in r)}
    values = sorted(v for _, v in measured)
    step = max(1, len(measured) // 10)
    return {"windows": sum(1 for r in rows if "noise_scale" in r), "first": measured[0][1],
            "median": values[len(values) // 2], "last": measured[-1][1],
            "trace": [list(point) for point in measured[::step]]}
