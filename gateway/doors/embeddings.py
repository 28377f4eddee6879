"""``POST /v1/embeddings``: OpenAI's embeddings on the gateway's routing, dispatch and lifecycle.

The body (``input`` a string, strings, token ids or arrays of them; ``encoding_format`` float or
base64; ``dimensions`` for Matryoshka models) is validated at the edge, the model must be an entry
of ``kind: embed``, and then the request is a generation request's twin: ``choose()`` ranks the
backends serving the model, dispatch tries them in order until one answers (an embedding is a whole
answer of one piece, under ``routing.answer_timeout_s``, failing over before the first byte), a
client that leaves cancels it, and ``RequestLife`` counts it under the ``embeddings`` route and
logs it. Backends of an embedding model are built as embedders (``gateway.fleet.engines.build_embedder``).
"""

from __future__ import annotations

import base64
import random
import struct
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Usage
from backends.embed_base import Embedder, EmbedRequest, EmbedResult, normalized
from gateway.doors.body_errors import param_path, validation_error
from gateway.http.errors import ApiError, bad_request, error_for_json, from_backend, model_not_found
from gateway.http.exchange import Exchange
from gateway.pipeline import dispatch
from gateway.pipeline.dispatch import Deadlines
from gateway.pipeline.lifecycle import RequestLife
from gateway.pipeline.refusals import no_candidates
from routing.features import InvalidHeader, features
from routing.policy import choose, priority_factor
from routing.types import Reason

if TYPE_CHECKING:
    from gateway.state import AppState

MAX_INPUTS = 2048
"""OpenAI's limit on inputs per request."""

Tokens = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class EmbeddingsBody(BaseModel):
    """The request body of ``POST /v1/embeddings``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: Annotated[str, Field(min_length=1)]
    input: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_INPUTS)]
        | Tokens
        | Annotated[list[Tokens], Field(min_length=1, max_length=MAX_INPUTS)]
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None


def parse(data: Any) -> EmbeddingsBody:
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_type")
    items = data.get("input")
    if items == [] or items == "":
        raise bad_request("Invalid 'input': it must not be empty.", "input", "invalid_value")
    if isinstance(items, list) and len(items) > MAX_INPUTS:  # before the costly validation
        raise bad_request(f"Invalid 'input': at most {MAX_INPUTS} inputs per request.", "input", "invalid_value")
    try:
        return EmbeddingsBody.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, lambda loc: param_path(loc, ())) from None


def inputs_of(body: EmbeddingsBody) -> tuple[str, ...] | tuple[tuple[int, ...], ...]:
    value = body.input
    if isinstance(value, str):
        return (value,)
    if all(isinstance(x, str) for x in value):
        return tuple(cast(list[str], value))
    if all(isinstance(x, int) for x in value):
        return (tuple(cast(list[int], value)),)
    return tuple(tuple(x) for x in cast(list[list[int]], value))


def _base64(vector: list[float]) -> str:
    """OpenAI's base64 form: the little-endian float32 bytes."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def document(body: EmbeddingsBody, model: str, result: EmbedResult, matryoshka: bool) -> dict[str, Any]:
    """The embeddings list; ``dimensions`` cuts Matryoshka vectors (and normalizes them again)."""
    vectors = result.vectors
    size = body.dimensions
    if size is not None and vectors and size != len(vectors[0]):
        if not matryoshka or size > len(vectors[0]):
            why = "it is not marked `matryoshka`" if size < len(vectors[0]) else "that is more than it has"
            raise bad_request(
                f"`{model}` makes {len(vectors[0])}-dimensional embeddings; 'dimensions' {size} cannot be "
                f"honoured ({why}).",
                "dimensions",
                "unsupported_parameter",
            )
        vectors = [normalized(v[:size]) for v in vectors]
    encode = _base64 if body.encoding_format == "base64" else None
    data = [
        {"object": "embedding", "index": i, "embedding": encode(v) if encode is not None else v}
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


class EmbeddingsDoor:
    """The front door's name and error shape (OpenAI's), as ``Gateway`` asks them of every door."""

    route = "embeddings"

    def error_body(self, error: ApiError) -> bytes:
        return error.json()


EMBEDDINGS = EmbeddingsDoor()
PATH = "/v1/embeddings"


async def serve(
    ex: Exchange, headers: Mapping[str, str], state: AppState, door: object, received: float | None = None
) -> None:
    """Answer one embeddings request on ``ex`` (``gateway.completions.serve``'s twin): errors before
    the answer raise ``ApiError``; the request's life records how it ended."""
    life = RequestLife(state, EMBEDDINGS.route, ex, received if received is not None else time.perf_counter())
    await life.run(_serve(ex, headers, state, life))


async def _serve(ex: Exchange, headers: Mapping[str, str], state: AppState, life: RequestLife) -> None:
    rt = state.runtime
    limits = rt.config.limits
    tenancy = state.tenancy
    key = await tenancy.authenticate(headers.get("authorization")) if tenancy is not None else None
    raw = await ex.body(limits.max_body_bytes, headers.get("content-length"))
    ex.watch()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise error_for_json(exc) from None
    body = parse(data)
    if body.model not in rt.model_names:
        raise model_not_found(body.model)
    entry = rt.loaded.model(body.model)
    if entry.kind != "embed":
        raise bad_request(
            f"`{body.model}` generates text; it makes no embeddings (a model entry of `kind: embed` does).",
            "model",
            "model_not_embedding",
        )
    life.model = body.model
    if body.user is not None:
        life.caller = {"user": body.user}
    request = EmbedRequest(ex.request_id, body.model, inputs_of(body))
    texts = [x if isinstance(x, str) else "" for x in request.inputs]
    exact = sum(len(x) for x in request.inputs if not isinstance(x, str)) or None
    try:
        feats = features(body.model, texts, 1, False, headers, exact, random.random())
    except InvalidHeader as exc:
        raise ApiError(400, str(exc), param=exc.name, code="invalid_header") from None
    snapshot = state.fleet.snapshot()
    if key is not None and tenancy is not None:
        spec = snapshot.models.get(body.model)
        feats = await tenancy.admit(key, feats, life, "x-priority" in headers, 1, spec.context if spec else None)
    decision = choose(feats, snapshot, rt.rules)
    state.metrics.decision(decision.reason.value, decision.candidates[0].backend if decision.candidates else "none")
    life.routed(body.model, decision, False, feats)
    if not decision.candidates or decision.reason is Reason.BUDGET_UNMEETABLE:
        raise no_candidates(decision, body.model, {}, frozenset())
    routing = rt.config.routing
    deadlines = Deadlines(
        routing.first_token_timeout_s,
        routing.answer_timeout_s,
        routing.max_queue_wait_s * priority_factor(feats.priority),
    )
    results: dict[str, EmbedResult] = {}

    async def embed_at(target: dispatch.Target, carrier: GenerationRequest) -> AsyncIterator[Chunk]:
        backend = target.backend
        if not isinstance(backend, Embedder):
            raise BackendError(ErrorKind.INTERNAL, f"{target.name} is not an embedding engine")
        result = await backend.embed(request)
        results[target.name] = result
        yield Chunk(finish_reason="stop", usage=Usage(result.prompt_tokens, 0))

    carrier = GenerationRequest(ex.request_id, body.model, max_tokens=1, clock=request.clock)
    targets = state.fleet.targets(c.backend for c in decision.candidates[: decision.max_attempts])
    try:
        committed = await dispatch.start(targets, carrier, deadlines, life, feats.prompt_tokens, True, None, embed_at)
    except BackendError as exc:
        life.engine_wait_s = request.clock.waited_s
        raise from_backend(exc) from exc
    life.committed(committed)
    result = results[committed.target.name]
    doc = document(body, body.model, result, entry.matryoshka)
    life.answered(Usage(result.prompt_tokens, 0))
    payload = orjson.dumps(doc)
    life.overhead_header(request.clock.waited_s)
    await ex.respond(200, payload)
