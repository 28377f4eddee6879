"""A routing decision as a readable table (CLI) or a JSON document (admin endpoint)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from routing import fallback
from routing.policy import choose
from routing.types import Decision, FleetSnapshot, RequestFeatures, Rules


def to_dict(decision: Decision, features: RequestFeatures) -> dict[str, Any]:
    return {
        "reason": decision.reason.value,
        "rule": decision.rule,
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
                "terms": {k: round(v, 4) for k, v in c.terms.items()},
            }
            for i, c in enumerate(decision.candidates)
        ],
        "excluded": decision.excluded,
    }


def render(decision: Decision, features: RequestFeatures, snapshot: FleetSnapshot) -> str:
    profiles = {b.name: b.profile for b in snapshot.backends}
    budget = ", ".join(
        f"{name} {value:g} ms"
        for name, value in (
            ("ttft", features.ttft_budget_ms),
            ("latency", features.latency_budget_ms),
            ("tpot", features.tpot_budget_ms),
        )
        if value is not None
    )
    lines = [
        f"request: model {features.model}, {features.prompt_tokens} prompt tokens, "
        f"{features.max_tokens if features.max_tokens is not None else 'default'} max tokens, "
        f"budget: {budget or 'none'}",
        f"decision: {decision.reason.value}"
        + (f" (rule {decision.rule})" if decision.rule else "")
        + f", up to {decision.max_attempts} attempts"
        + (f", retry after {decision.retry_after_s:.0f} s" if decision.retry_after_s else ""),
        "",
    ]
    header = (
        "#", "backend", "engine", "hardware", "cached", "ttft ms", "tpot ms", "e2e ms", "queue ms", "meets", "score"
    )  # fmt: skip
    rows = [header]
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
                f"{c.prediction.ttft_ms:.1f}",
                f"{c.prediction.tpot_ms:.2f}",
                f"{c.prediction.e2e_ms:.0f}",
                f"{c.prediction.queue_ms:.0f}",
                "yes" if c.meets_budget else "no",
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
    if decision.excluded:
        lines.append("")
        lines.append("excluded:")
        lines.extend(f"  {name}: {why}" for name, why in decision.excluded.items())
    return "\n".join(lines)


def explained(
    features: RequestFeatures,
    snapshot: FleetSnapshot,
    rules: Rules,
    chains: Mapping[str, Sequence[fallback.Step]],
) -> str:
    """The decision for the request's model as ``render`` shows it, then its fallback chain."""
    decision = choose(features, snapshot, rules)
    plan = fallback.planned(features, snapshot, rules, chains.get(features.model, ()))
    return render(decision, features, snapshot) + "\n\n" + fallback.render(features.model, decision, plan)
