"""A routing decision as a readable table (CLI) or a JSON document (admin endpoint)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from routing import fallback
from routing.decisions import Decision
from routing.policy import with_rule_defaults
from routing.rules import Rules
from routing.types import FleetSnapshot, RequestFeatures

TERMS = ("budget", "cost")
"""The weighted terms of a candidate's score (``routing.weights``), in the table's order."""


def applied_budget(features: RequestFeatures, decision: Decision, rules: Rules | None) -> dict[str, dict[str, Any]]:
    """Each budget the decision used, and where it came from: the request (its headers or fields), the
    matched rule's default, or none (``rules``: the ones decided with; None: the request's own only)."""
    rule = next((r for r in rules.rules if r.name == decision.rule), None) if rules is not None else None
    applied = with_rule_defaults(features, rule)
    out: dict[str, dict[str, Any]] = {}
    for name, asked, used in (
        ("ttft_ms", features.ttft_budget_ms, applied.ttft_budget_ms),
        ("latency_ms", features.latency_budget_ms, applied.latency_budget_ms),
        ("tpot_ms", features.tpot_budget_ms, applied.tpot_budget_ms),
    ):
        source = "request" if asked is not None else (f"rule {decision.rule} default" if used is not None else None)
        out[name] = {"value": used, "source": source}
    return out


def to_dict(decision: Decision, features: RequestFeatures, rules: Rules | None = None) -> dict[str, Any]:
    """``rules``: the ones decided with, to say which budget was applied and why (``budget``)."""
    doc: dict[str, Any] = {
        "reason": decision.reason.value,
        "rule": decision.rule,
        "arm": decision.arm,
        "max_attempts": decision.max_attempts,
        "retry_after_s": decision.retry_after_s,
        "request": {
            "model": features.model,
            "prompt_tokens": features.prompt_tokens,
            "max_tokens": features.max_tokens,
            "ttft_budget_ms": features.ttft_budget_ms,
            "latency_budget_ms": features.latency_budget_ms,
            "tpot_budget_ms": features.tpot_budget_ms,
            "tenant": features.tenant,
        },
        "candidates": [
            {
                "rank": i + 1,
                "backend": c.backend,
                "score": c.score,
                "meets_budget": c.meets_budget,
                "ttft_ms": round(c.prediction.ttft_ms, 3),
                "tpot_ms": round(c.prediction.tpot_ms, 3),
                "e2e_ms": round(c.prediction.e2e_ms, 3),
                "queue_ms": round(c.prediction.queue_ms, 3),
                "cached_tokens": c.prediction.cached_tokens,
                "cache_saves_ms": round(c.saved_ms, 3),
                "cache_saves_gpu_ms": round(c.saved_gpu_ms, 3),
                "capacity_ms": round(c.capacity_ms, 3),
                "in_flight": c.in_flight,
                "load_bound": c.bound,
                "over_bound": c.over_bound,
                "conversations": int(c.terms.get("conversations", 0)),
                "home": bool(c.terms.get("home")),
                "terms": {k: round(v, 4) for k, v in c.terms.items()},
            }
            for i, c in enumerate(decision.candidates)
        ],
        "excluded": decision.excluded,
    }
    if rules is not None:
        doc["budget"] = applied_budget(features, decision, rules)
        doc["weights"] = {t: getattr(rules.weights, t) for t in TERMS}
        doc["load_bound"] = rules.load_bound
    return doc


def _budget_line(features: RequestFeatures, decision: Decision, rules: Rules | None) -> str:
    budget = applied_budget(features, decision, rules)
    parts = [
        f"{name.removesuffix('_ms')} {b['value']:g} ms ({b['source']})" for name, b in budget.items() if b["value"]
    ]
    return ", ".join(parts) or "none"


def render(decision: Decision, features: RequestFeatures, snapshot: FleetSnapshot, rules: Rules | None = None) -> str:
    """The decision as a table: each candidate's predictions, score terms and score, then the excluded."""
    profiles = {b.name: b.profile for b in snapshot.backends}
    lines = [
        f"request: model {features.model}, {features.prompt_tokens} prompt tokens, "
        f"{features.max_tokens if features.max_tokens is not None else 'default'} max tokens, "
        f"budget: {_budget_line(features, decision, rules)}",
        f"decision: {decision.reason.value}"
        + (f" (rule {decision.rule})" if decision.rule else "")
        + (f", split arm {decision.arm}" if decision.arm else "")
        + f", up to {decision.max_attempts} attempts"
        + (f", retry after {decision.retry_after_s:.0f} s" if decision.retry_after_s else ""),
        "",
    ]
    header = (
        "#", "backend", "engine", "hardware", "cached", "saves ms", "saves GPU-ms", "load/bound", "convs", "home",
        "ttft ms", "tpot ms", "e2e ms", "queue ms", "meets", *TERMS, "score",
    )  # fmt: skip
    rows: list[tuple[str, ...]] = [header]
    for i, c in enumerate(decision.candidates, start=1):
        p = profiles[c.backend]
        hardware = f"{p.gpu_count}x {p.gpu.name}" if p.gpu.name != "CPU" else "CPU"
        rows.append(
            (
                str(i),
                c.backend,
                p.engine,
                hardware,
                str(c.prediction.cached_tokens),
                f"{c.saved_ms:.1f}",
                f"{c.saved_gpu_ms:.1f}",
                f"{c.in_flight + 1}/{c.bound}" + ("!" if c.over_bound else ""),
                str(int(c.terms.get("conversations", 0))),
                "yes" if c.terms.get("home") else "no",
                f"{c.prediction.ttft_ms:.1f}",
                f"{c.prediction.tpot_ms:.2f}",
                f"{c.prediction.e2e_ms:.0f}",
                f"{c.prediction.queue_ms:.0f}",
                "yes" if c.meets_budget else "no",
                *(f"{c.terms.get(t, 0.0):.3f}" for t in TERMS),
                f"{c.score:.3f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append(
            "  ".join(
                cell.rjust(w) if j >= 4 else cell.ljust(w) for j, (cell, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
        )
    if rules is not None and decision.candidates:
        w = rules.weights
        lines.append(
            f"score = ({w.budget:g}×budget + {w.cost:g}×cost) / {w.budget + w.cost:g} (routing.weights); each term "
            "0..1, higher is better; the budget is judged on the predicted times plus the GPU time a backend "
            "takes beyond the least costly one, scaled by how busy the fleet is"
        )
        lines.append(
            f"ranked: meeting the budget, the rule's preference, within the load bound (load/bound: requests in "
            f"flight with this one / at most {rules.load_bound:g}x the fair share, routing.prefix.load_bound; "
            "! over it), score, then the conversation's home"
        )
    if decision.excluded:
        lines.append("")
        lines.append("excluded:")
        lines.extend(f"  {name}: {why}" for name, why in decision.excluded.items())
    return "\n".join(lines)


def explained(
    decision: Decision,
    features: RequestFeatures,
    snapshot: FleetSnapshot,
    rules: Rules,
    chains: Mapping[str, Sequence[fallback.Step]],
) -> str:
    """The decision for the request's model as ``render`` shows it, then its fallback chain (if any)."""
    text = render(decision, features, snapshot, rules)
    chain = chains.get(features.model, ())
    if not chain:
        return text
    plan = fallback.planned(features, snapshot, rules, chain)
    return text + "\n\n" + fallback.render(features.model, decision, plan)
