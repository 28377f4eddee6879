"""Fallback chains: which other models a request may go to when its own cannot serve it, and why.

Pure data and functions (no I/O), shared by the gateway's pipeline, ``enginegate route explain``
and the config checks. A model's chain is its own ``fallbacks:`` in order, then, transitively, the
chains of those models (each step narrowed to the causes of the step that led to it), every model
once. The pipeline walks it in order: a step is tried when the last failure's cause is one it
covers (``Step.when``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from routing.types import Decision, Reason

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
