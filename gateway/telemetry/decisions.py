"""The last routing decisions, newest first, for ``GET /admin/decisions`` and the console: a bounded
ring on the app's state (one per app, no global), filled on the request path at the cost of one
tuple and one ``deque.append`` and rendered only when asked."""

from __future__ import annotations

import time
from collections import deque
from itertools import islice
from typing import Any

from routing.decisions import Decision
from routing.explain import to_dict
from routing.types import RequestFeatures

_Record = tuple[float, str, str, int, int | None, float | None, float | None, float | None, str | None, Decision]
"""(wall time, request id, model, prompt tokens, max tokens, ttft/latency/tpot budgets, tenant, the decision):
the features' small fields only, never their token ids or headers (a prompt's ids would keep it in memory)."""


class RecentDecisions:
    """The last ``size`` decisions."""

    def __init__(self, size: int) -> None:
        self._ring: deque[_Record] = deque(maxlen=size)

    @property
    def size(self) -> int:
        return self._ring.maxlen or 0

    def resized(self, size: int) -> RecentDecisions:
        """A ring of ``size`` holding the newest of these (a reload that changed ``admin.recent_decisions``)."""
        ring = RecentDecisions(size)
        ring._ring.extend(self._ring)
        return ring

    def record(self, request_id: str, f: RequestFeatures, decision: Decision) -> None:
        self._ring.append(
            (time.time(), request_id, f.model, f.prompt_tokens, f.max_tokens,
             f.ttft_budget_ms, f.latency_budget_ms, f.tpot_budget_ms, f.tenant, decision)
        )  # fmt: skip

    def documents(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` decisions as ``/admin/route/explain`` shows one, with when and which request."""
        out = []
        for at, rid, model, prompt, max_tokens, ttft, latency, tpot, tenant, decision in islice(
            reversed(self._ring), limit
        ):
            features = RequestFeatures(
                model, prompt, max_tokens, ttft_budget_ms=ttft, latency_budget_ms=latency, tpot_budget_ms=tpot,
                tenant=tenant,
            )  # fmt: skip
            out.append({"at": round(at, 3), "request_id": rid, **to_dict(decision, features)})
        return out
