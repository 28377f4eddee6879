"""Fallback chains in the pipeline: when a request's model cannot serve it before its first token,
the next model of its chain whose causes cover why is routed and dispatched afresh (docs/traffic.md).

The chain is walked here, once for every front door whose work can be sent to another model
(``Retargetable``: the generation doors). A step's model is routed with the request's own features
measured again for it (its tokenizer, context, capabilities and budget fit); a step whose backends
lack a capability the request uses, or that the request's API key may not use, is skipped and the
reason logged. After the commit point nothing here runs: a stream that fails after its first token
ends in an error event (``gateway.pipeline.serve``), never in another model's answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from backends.base import ErrorKind
from gateway.fleet.entry import Entry
from gateway.http.errors import ApiError
from gateway.pipeline.dispatch import Committed
from gateway.pipeline.lifecycle import RequestLife
from routing import fallback
from routing.decisions import Reason
from routing.fallback import Step
from routing.types import RequestFeatures

log = logging.getLogger("enginegate.request")

_ERROR_CAUSES = {
    ErrorKind.CONNECT: fallback.UNAVAILABLE,
    ErrorKind.TIMEOUT: fallback.UNAVAILABLE,
    ErrorKind.UPSTREAM: fallback.UNAVAILABLE,
    ErrorKind.PROTOCOL: fallback.UNAVAILABLE,
    ErrorKind.INTERNAL: fallback.UNAVAILABLE,
    ErrorKind.OVERLOADED: fallback.OVERLOADED,
    ErrorKind.CONTEXT_LENGTH: fallback.CONTEXT_WINDOW,
    ErrorKind.CONTENT_REFUSED: fallback.CONTENT_REFUSED,
}
"""Why the last backend tried failed, as a fallback cause; a bad request (``BAD_REQUEST``) is none:
every model would refuse it."""


@runtime_checkable
class Retargetable(Protocol):
    """Work that can be sent to another model: the same request, answered in that model's name."""

    def serve_as(self, model: str) -> None: ...


Attempt = Callable[[RequestFeatures], Awaitable[Committed[Entry]]]
"""Route and dispatch the request's work (on its current model) with these features."""


def unaliased(data: Any, aliases: Mapping[str, str]) -> Any:
    """The body with an alias in ``model`` replaced by its model's name (every door names it there)."""
    if isinstance(data, dict):
        asked = data.get("model")
        if isinstance(asked, str) and asked in aliases:
            data["model"] = aliases[asked]
    return data


def anyone(model: str) -> bool:
    return True


def cause_of(error: ApiError, life: RequestLife) -> str | None:
    """The fallback cause of the refusal ``error`` (raised by routing or dispatch), or None."""
    if error.failure is not None:
        return _ERROR_CAUSES.get(error.failure.kind)
    decision = life.decision
    if decision is None or (decision.candidates and decision.reason is not Reason.BUDGET_UNMEETABLE):
        return None  # refused after routing took it (a key's fair share, say): not the model's doing
    return fallback.decision_cause(decision)


async def walk(
    chain: Sequence[Step],
    work: Retargetable,
    model: str,
    features: RequestFeatures,
    attempt: Attempt,
    measure: Callable[[], Awaitable[RequestFeatures]],
    allowed: Callable[[str], bool],
    life: RequestLife,
) -> Committed[Entry]:
    """The request on ``model``, then on its chain's models in turn while a cause a step covers stops
    it; raises the last refusal when none serves. ``measure``: the work's features for its current
    model; ``allowed``: whether the request's API key may use a model."""
    try:
        return await attempt(features)
    except ApiError as exc:
        error = exc
    cause = cause_of(error, life)
    for step in chain:
        if cause is None:
            break
        if cause not in step.when:
            continue
        if not allowed(step.model):
            life.fallback_skipped(step.model, cause, "the request's API key may not use it")
            continue
        work.serve_as(step.model)
        fresh = await measure()
        step_features = replace(fresh, priority=features.priority, key=features.key, team=features.team)
        try:
            committed = await attempt(step_features)
        except ApiError as exc:
            decision = life.decision
            if decision is not None and decision.reason is Reason.UNSUPPORTED:
                life.fallback_skipped(step.model, cause, exc.message)  # its backends lack what the request uses
                continue
            life.fell_back(model, step.model, cause)
            error, model, cause = exc, step.model, cause_of(exc, life)
            continue
        life.fell_back(model, step.model, cause)
        return committed
    raise error
