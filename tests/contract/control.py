"""Fault injection for the contract fakes: tests set it, the fake acts on it like the real engine would."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FakeControl:
    fail_next: str | None = None
    """Name of one of the engine's real failure modes (each fake documents the names it knows);
    the next generation request fails that way, then this resets to None."""
    delay_s: float = 0.0
    """Injected latency before the first token of every generation."""
    healthy: bool = True
    """False: the health route answers as the engine does when unhealthy."""
    loading: bool = False
    """True: the engine answers as it does while the model is still loading (where it has such a state)."""

    def take_fault(self) -> str | None:
        fault, self.fail_next = self.fail_next, None
        return fault
