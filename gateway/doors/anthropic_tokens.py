"""``POST /v1/messages/count_tokens``: Anthropic's token count of a message's prompt, as the model would
see it: the chat rendered with the model's template, tools and prefill included, then tokenized.

Where the count comes from, first that can answer (the ``x-enginegate-token-count`` header says which):

- ``gguf``: the model's GGUF tokenizer, in the gateway (``gateway.catalog.PromptCounter``);
- ``engine:<backend>``: a healthy backend serving the model that has a tokenize route
  (``backends.base.Tokenizing``: vLLM's ``/tokenize``, TGI's ``/tokenize`` and ``/chat_tokenize``),
  which counts with the engine's own tokenizer and template;
- ``estimate``: the conversation rendered with the model entry's ``chat_template`` (ChatML without one),
  tools included, at four characters per token (``backends.text.estimate_tokens``).

Nothing is generated or routed. Errors are Anthropic's JSON, as on ``/v1/messages``.
"""

from __future__ import annotations

import asyncio
import logging

import orjson
from starlette.requests import Request
from starlette.responses import Response

from backends.base import BackendError, GenerationRequest, Tokenizing
from backends.capabilities import text_only
from backends.text import ChatRenderer, estimate_tokens
from gateway.doors.anthropic_api import parse_conversation, prompt_of
from gateway.doors.anthropic_events import error_doc
from gateway.http.errors import ApiError, error_for_json, from_backend, model_not_found
from gateway.pipeline.fallback import unaliased
from gateway.state import AppState

PATH = "/v1/messages/count_tokens"
SOURCE_HEADER = "x-enginegate-token-count"

log = logging.getLogger("enginegate.request")


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
    body = parse_conversation(unaliased(data, rt.aliases) if rt.aliases else data, rt.config.limits)
    if body.model not in rt.model_names or (key is not None and not key.allows(body.model)):
        raise model_not_found(body.model)
    gen = prompt_of(body, request.scope.get("enginegate.request_id", "count"))
    try:
        tokens, source = await counted(state, gen)
    except BackendError as exc:  # the conversation cannot be rendered (a prefill the template hides)
        raise from_backend(exc) from exc
    return Response(
        orjson.dumps({"input_tokens": tokens}), media_type="application/json", headers={SOURCE_HEADER: source}
    )


async def counted(state: AppState, gen: GenerationRequest) -> tuple[int, str]:
    """The prompt's tokens and where the count came from (see the module docstring)."""
    counter = state.runtime.counters.get(gen.model)
    exact = await counter.measure(gen) if counter is not None else None
    if exact is not None:
        return exact, "gguf"
    patience = state.runtime.config.routing.first_token_timeout_s
    for entry in list(state.fleet.entries.values()):
        backend = entry.backend
        if gen.model not in entry.profile.models or not entry.health.ok or not isinstance(backend, Tokenizing):
            continue
        try:
            async with asyncio.timeout(patience):  # an engine's tokenizer answers at once, or not at all
                return await backend.count_prompt(gen), f"engine:{entry.name}"
        except (BackendError, TimeoutError) as exc:  # another backend may answer; the estimate is the last resort
            detail = exc.detail if isinstance(exc, BackendError) else "timed out"
            log.warning("%s could not count a prompt: %s", entry.name, detail)
    return estimate(gen, state.runtime.loaded.model(gen.model).chat_template), "estimate"


def estimate(gen: GenerationRequest, template: str | None) -> int:
    """About how many tokens the rendered prompt holds: the template's markup and the tools count too."""
    if gen.messages is None:
        return estimate_tokens(gen.prompt or "")
    messages = [text_only(m) if isinstance(m.get("content"), list) else m for m in gen.messages]
    tools = list(gen.tools) if gen.tools and gen.tool_choice != "none" else None
    return estimate_tokens(ChatRenderer(template).render(messages, tools, gen.continue_final))
