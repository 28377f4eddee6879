"""A routed request as the request log records it for a what-if replay, and read back from the log."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from routing.types import RequestFeatures

RECENT_REQUESTS = 2000
"""Requests a gateway with an admin API keeps for ``POST /admin/config/diff`` to replay (the newest)."""


@dataclass(slots=True)
class Replayed:
    """One request as routing saw it, and how long its answer was (not frozen: built per request, and a
    frozen dataclass costs microseconds to build)."""

    arrived_at: float
    """Seconds since the epoch (a trace's: seconds after its first request)."""
    features: RequestFeatures
    output_tokens: int | None
    """Answer tokens, where it got an answer."""


def log_fields(r: Replayed) -> dict[str, Any]:
    """What the request log line carries for a replay (``from_log`` reads it back); never prompt text,
    and of the headers only those rules match on (``routing.features.RULE_HEADERS``). Empty
    collections are left out: the line stays short for the common request."""
    f = r.features
    doc: dict[str, Any] = {
        "arrived_at": r.arrived_at, "est_prompt_tokens": f.prompt_tokens, "max_tokens": f.max_tokens,
        "ttft_budget_ms": f.ttft_budget_ms, "latency_budget_ms": f.latency_budget_ms,
        "tpot_budget_ms": f.tpot_budget_ms, "priority": f.priority, "tenant": f.tenant, "team": f.team,
    }  # fmt: skip
    if f.headers:
        doc["route_headers"] = dict(f.headers)
    if f.needs:
        doc["needs"] = sorted(f.needs)
    if f.extras:
        doc["extras"] = sorted(f.extras)
    return doc


def replayable(f: RequestFeatures) -> RequestFeatures:
    """Only what the log carries (no prompt blocks, token ids or random draw): a request the gateway kept
    routes in a replay as the same request read back from its log line."""
    return RequestFeatures(
        model=f.model, prompt_tokens=f.prompt_tokens, max_tokens=f.max_tokens, stream=f.stream,
        latency_budget_ms=f.latency_budget_ms, ttft_budget_ms=f.ttft_budget_ms, tpot_budget_ms=f.tpot_budget_ms,
        priority=f.priority, tenant=f.tenant, key=f.key, team=f.team, headers=tuple(sorted(f.headers)),
        needs=f.needs, extras=f.extras,
    )  # fmt: skip


def _number(doc: Mapping[str, Any], key: str) -> float | None:
    value = doc.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def from_log(doc: Mapping[str, Any]) -> Replayed | None:
    """A request log line's request; None for other lines and requests refused before routing."""
    if doc.get("msg") != "request" or not isinstance(doc.get("model"), str):
        return None
    arrived, prompt = _number(doc, "arrived_at"), _number(doc, "est_prompt_tokens")
    if arrived is None or prompt is None:
        return None  # refused before routing (no features), or a log from before these fields
    headers = doc.get("route_headers") or {}
    answer = _number(doc, "completion_tokens")
    max_tokens = _number(doc, "max_tokens")
    features = RequestFeatures(
        model=doc["model"],
        prompt_tokens=int(prompt),
        max_tokens=int(max_tokens) if max_tokens is not None else None,
        stream=bool(doc.get("stream")),
        ttft_budget_ms=_number(doc, "ttft_budget_ms"),
        latency_budget_ms=_number(doc, "latency_budget_ms"),
        tpot_budget_ms=_number(doc, "tpot_budget_ms"),
        priority=int(_number(doc, "priority") or 0),
        tenant=doc.get("tenant") if isinstance(doc.get("tenant"), str) else None,
        key=doc.get("key_id") if isinstance(doc.get("key_id"), str) else None,
        team=doc.get("team") if isinstance(doc.get("team"), str) else None,
        headers=tuple(sorted((str(k), str(v)) for k, v in headers.items())) if isinstance(headers, dict) else (),
        needs=frozenset(str(n) for n in doc.get("needs") or ()),
        extras=frozenset(str(n) for n in doc.get("extras") or ()),
    )
    return Replayed(arrived, features, int(answer) if answer is not None else None)
