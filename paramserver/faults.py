"""Fault injection: `inject_fault = RANK:AT` makes one rank fail on purpose, the one way
a test fails a run (a client, a collective rank and the server alike)."""
from __future__ import annotations

from dataclasses import dataclass


class InjectedFault(RuntimeError):
    """Raised on purpose where `inject_fault` says, so tests can watch a job fail cleanly."""


@dataclass(frozen=True)
class Fault:
    """Where `inject_fault = RANK:AT` makes one rank fail on purpose: once its count (a
    client's minibatch step, the server's version) reaches `at`. The one way a test fails
    a run, for a client, a collective rank and the server alike."""

    at: int
    who: str   # "client 3", "the server"
    unit: str  # "step", "version"

    def strike(self, count: int) -> None:
        if count >= self.at:
            raise InjectedFault(f"injected fault on {self.who} at {self.unit} {count}")


def fault_ok(text: str) -> bool:
    """Whether `inject_fault` reads: empty (none) or RANK:AT in digits."""
    parts = text.split(":")
    return not text or (len(parts) == 2 and all(p.isdigit() for p in parts))


def fault_on(text: str, rank: int, who: str, unit: str) -> Fault | None:
    """The fault `inject_fault` (already checked) puts on `rank`, if any."""
    if not text:
        return None
    target, at = map(int, text.split(":"))
    return Fault(at, who, unit) if target == rank else None
