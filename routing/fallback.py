"""Fallback chains: which other models a request may go to when its own cannot serve it, and why.

Pure data and functions (no I/O), shared by the gateway's pipeline, ``enginegate route explain``
and the config checks. A model's chain is its own ``fallbacks:`` in order, then, transitively, the
chains of those models (each step narrowed to the causes of the step that led to it), every model
once. The pipeline walks it in order: a step is tried when the last failure's cause is one it
covers (``Step.when``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from routing.decisions import Decision, Reason
from routing.policy import choose
from routing.rules import Rules
from routing.types import FleetSnapshot, RequestFeatures

UNAVAILABLE = "unavailable"
OVERLOADED = "overloaded"
BUDGET = "budget"
CONTEXT_WINDOW = "context_window"
CONTENT_REFUSED = "content_refused"
CAUSES: tuple[str, ...] = (UNAVAILABLE, OVERLOADED, BUDGET, CONTEXT_WINDOW, CONTENT_REFUSED)
"""Why a model could not serve a request, as fallback steps name them (``when:``) and metrics count them."""

_DECISION_CAUSES = {
    Reason.NO_HEALTHY_BACKEND: UNAVAILABLE,
    Reason.NO_BACKEND_FOR_MODEL: UNAVAILABLE,
    Reason.OVERLOADED: OVERLOADED,
    Reason.BUDGET_UNMEETABLE: BUDGET,
    Reason.NOTHING_FITS: CONTEXT_WINDOW,
}
"""Refusals of routing another model may cure. ``UNSUPPORTED`` is not one: a request using what its
model's backends lack is the client's to change (a 400 naming the field)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One model of a chain and the causes it is tried for."""

    model: str
    when: frozenset[str] = frozenset(CAUSES)


def decision_cause(decision: Decision) -> str | None:
    """The fallback cause of a routing decision that takes no backend; None: not one a fallback cures."""
    return _DECISION_CAUSES.get(decision.reason)


def cycle(graph: Mapping[str, Sequence[Step]]) -> list[str] | None:
    """A cycle of fallbacks (``[a, b, a]``), or None when the graph has none."""
    done: set[str] = set()

    def visit(model: str, path: list[str]) -> list[str] | None:
        if model in path:
            return [*path[path.index(model) :], model]
        if model in done:
            return None
        for step in graph.get(model, ()):
            found = visit(step.model, [*path, model])
            if found is not None:
                return found
        done.add(model)
        return None

    for start in graph:
        found = visit(start, [])
        if found is not None:
            return found
    return None


def chains(graph: Mapping[str, Sequence[Step]]) -> dict[str, tuple[Step, ...]]:
    """Every model's whole chain (see the module); ``graph`` must have no cycle (``cycle``)."""
    memo: dict[str, tuple[Step, ...]] = {}

    def chain(model: str) -> tuple[Step, ...]:
        if model in memo:
            return memo[model]
        own = graph.get(model, ())
        out: dict[str, Step] = {s.model: s for s in own}
        for step in own:
            for further in chain(step.model):
                if further.model != model and further.model not in out:
                    when = further.when & step.when
                    if when:
                        out[further.model] = Step(further.model, when)
        memo[model] = tuple(out.values())
        return memo[model]

    return {model: chain(model) for model in graph if graph[model]}


def next_steps(chain: Sequence[Step], cause: str) -> list[Step]:
    """The steps of ``chain`` tried for ``cause``, in order."""
    return [s for s in chain if cause in s.when]


def planned(
    features: RequestFeatures, snapshot: FleetSnapshot, rules: Rules, chain: Sequence[Step]
) -> list[tuple[Step, Decision]]:
    """Each step of ``chain`` with the routing decision its model would make for this request now
    (what ``route explain`` shows: what would be tried, and whether it could take the request)."""
    return [(step, choose(replace(features, model=step.model), snapshot, rules)) for step in chain]


def _verdict(decision: Decision) -> str:
    if decision.reason is Reason.UNSUPPORTED:
        lacks = sorted({item for items in decision.lacks.values() for item in items})
        return f"skipped: its backends lack {', '.join(lacks)}"
    cause = decision_cause(decision)
    if cause is not None:
        return f"cannot take it either ({decision.reason.value}): the chain goes on for {cause}"
    return f"would take it: {decision.candidates[0].backend} first ({decision.reason.value})"


def to_dicts(primary: Decision, plan: Sequence[tuple[Step, Decision]]) -> list[dict[str, Any]]:
    """The chain as ``/admin/route/explain`` returns it."""
    cause = decision_cause(primary)
    return [
        {
            "model": step.model,
            "when": sorted(step.when),
            "tried_now": cause is not None and cause in step.when,
            "reason": decision.reason.value,
            "verdict": _verdict(decision),
        }
        for step, decision in plan
    ]


def render(model: str, primary: Decision, plan: Sequence[tuple[Step, Decision]]) -> str:
    """The chain as ``enginegate route explain`` prints it under the decision."""
    if not plan:
        return f"fallbacks: {model} has none"
    cause = decision_cause(primary)
    head = f"fallbacks of {model}, tried in order before the first token when {model} cannot serve " + (
        f"(now: {cause}, so the steps for {cause} are tried):" if cause is not None else "(now it can):"
    )
    lines = [head]
    width = max(len(step.model) for step, _ in plan)
    for i, (step, decision) in enumerate(plan, start=1):
        when = "any cause" if step.when == frozenset(CAUSES) else ", ".join(c for c in CAUSES if c in step.when)
        mark = "*" if cause is not None and cause in step.when else " "
        lines.append(f" {mark}{i}. {step.model.ljust(width)}  when {when}: {_verdict(decision)}")
    return "\n".join(lines)
