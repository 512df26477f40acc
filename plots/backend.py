"""The plotting backend, chosen once for every figure module: Agg, files only, no display needed."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

__all__ = ["plt"]
