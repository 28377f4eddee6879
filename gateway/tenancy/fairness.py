"""Fairness within a priority class: when the backend a request would go to is saturated (the request
would queue), a key holding more than an equal share of its class's work in flight waits its turn
(429 with a short Retry-After) and the others' requests go first.

The work is counted in tokens reserved, as virtual-token-counter scheduling counts service, so a key
of long requests gets fewer of them. Nothing is refused while backends have room (the gate is
work-conserving), nor when one key is alone in its class. The counts are this replica's: behind a
load balancer each replica keeps its own share, which is fair per replica.
"""

from __future__ import annotations


class FairShare:
    def __init__(self) -> None:
        self._classes: dict[int, dict[str, int]] = {}
        """priority -> key id -> tokens reserved by its requests in flight."""

    def start(self, klass: int, key: str, tokens: int) -> None:
        keys = self._classes.setdefault(klass, {})
        keys[key] = keys.get(key, 0) + tokens

    def end(self, klass: int, key: str, tokens: int) -> None:
        keys = self._classes.get(klass)
        if keys is None or key not in keys:
            return
        left = keys[key] - tokens
        if left > 0:
            keys[key] = left
        else:
            del keys[key]  # no longer active: the others' shares grow

    def over(self, klass: int, key: str) -> bool:
        """Whether ``key`` (its new request included) holds more than an equal share of its class."""
        keys = self._classes.get(klass)
        if not keys or len(keys) < 2:
            return False
        mine = keys.get(key, 0)
        return mine > sum(keys.values()) / len(keys)
