"""Why no backend takes a request, as the client is told it: without backend names (the log and
``/admin/route/explain`` have each backend's reason)."""

from __future__ import annotations

from gateway.http.errors import ApiError, clip, model_not_found
from routing.decisions import Decision, Reason


def _unsupported(decision: Decision, model: str, wanted: dict[str, str], extras: frozenset[str]) -> ApiError:
    """400 naming the field no backend serving the model can honour (which backend lacks what is the
    operator's to read, in ``/admin/route/explain``: backend names are not shown to clients)."""
    lacks = decision.lacks
    for extra in sorted(extras):
        if all(extra in items for items in lacks.values()):
            return ApiError(
                400,
                f"Unrecognized request argument supplied: {clip(extra)} (no backend serving `{model}` understands it).",
                param=clip(extra),
                code="unknown_parameter",
            )
    for feature, param in wanted.items():
        if all(feature in items for items in lacks.values()):
            return ApiError(
                400,
                f"'{param}' cannot be honoured for `{model}`: no backend serving it supports {feature}.",
                param=param,
                code="unsupported_parameter",
            )
    params = sorted({wanted.get(item, item) for items in lacks.values() for item in items})
    return ApiError(
        400,
        f"No backend serving `{model}` supports all of {', '.join(clip(p) for p in params)} together.",
        param=clip(params[0]) if params else None,
        code="unsupported_parameter",
    )


def no_candidates(decision: Decision, model: str, wanted: dict[str, str], extras: frozenset[str]) -> ApiError:
    if decision.reason is Reason.NO_BACKEND_FOR_MODEL:
        return model_not_found(model)
    if decision.reason is Reason.UNSUPPORTED:
        return _unsupported(decision, model, wanted, extras)
    if decision.reason is Reason.BUDGET_UNMEETABLE:
        return ApiError(
            429,
            f"No backend serving `{model}` is predicted to meet this request's latency budget.",
            type="rate_limit_error",
            code="budget_unmeetable",
            retry_after=decision.retry_after_s or 1.0,
        )
    if decision.reason is Reason.OVERLOADED:
        return ApiError(
            503,
            f"Every backend serving `{model}` is at capacity; retry after the Retry-After interval.",
            type="api_error",
            code="overloaded",
            retry_after=decision.retry_after_s or 1.0,
        )
    if decision.reason is Reason.NOTHING_FITS:
        # Why each backend cannot take it, without the backends' (or the rules') names.
        why = "; ".join(sorted({"a routing rule" if t.startswith("rule ") else t for t in decision.excluded.values()}))
        return ApiError(400, f"No backend can hold this request for `{model}` ({why}).", code="context_length_exceeded")
    return ApiError(
        503,
        f"No healthy backend serves `{model}` right now.",
        type="api_error",
        code="no_backend_available",
        retry_after=1.0,
    )
