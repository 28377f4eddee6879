"""``POST /v1/messages/count_tokens``: Anthropic's token count of a message's prompt, as the model
would see it (the chat rendered with the model's template, tools included, then tokenized), or the
gateway's estimate for a model whose tokenizer is not at hand. Nothing is generated or routed.
Errors are Anthropic's JSON, as on ``/v1/messages``.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.doors.anthropic_api import parse_conversation, prompt_of
from gateway.doors.anthropic_events import error_doc
from gateway.http.errors import ApiError, error_for_json, model_not_found
from gateway.pipeline.serve import prompt_texts
from gateway.state import AppState
from routing.features import estimate_tokens

PATH = "/v1/messages/count_tokens"


async def count_tokens(request: Request) -> Response:
    state: AppState = request.app.state.enginegate
    try:
        return await _count(request, state)
    except ApiError as exc:
        return Response(orjson.dumps(error_doc(exc)), exc.status, exc.headers(), media_type="application/json")


async def _count(request: Request, state: AppState) -> Response:
    rt = state.runtime
    headers = request.headers
    if state.tenancy is not None:
        authorization = headers.get("authorization")
        if authorization is None and "x-api-key" in headers:
            authorization = "Bearer " + headers["x-api-key"]
        key = await state.tenancy.authenticate(authorization)
    else:
        key = None
    raw = await request.body()
    if len(raw) > rt.config.limits.max_body_bytes:
        raise ApiError(413, f"Request body is larger than {rt.config.limits.max_body_bytes} bytes.")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise error_for_json(exc) from None
    body = parse_conversation(data, rt.config.limits)
    if body.model not in rt.model_names or (key is not None and not key.allows(body.model)):
        raise model_not_found(body.model)
    gen = prompt_of(body, request.scope.get("enginegate.request_id", "count"))
    counter = rt.counters.get(body.model)
    exact = await counter.measure(gen) if counter is not None else None
    tokens = exact if exact is not None else estimate_tokens(prompt_texts(gen))
    return Response(orjson.dumps({"input_tokens": tokens}), media_type="application/json")
