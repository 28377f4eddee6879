"""``POST /v1/embeddings``: OpenAI's embeddings on the gateway's routing, dispatch and lifecycle.

The body (``input`` a string, strings, token ids or arrays of them; ``encoding_format`` float or
base64; ``dimensions`` for Matryoshka models) is validated at the edge, the model must be an entry
of ``kind: embed``, and then the request goes through the one pipeline every front door shares
(``gateway.pipeline.serve``) as ``Embedding`` work: ``choose()`` ranks the backends serving the
model, dispatch tries them in order until one answers (an embedding is a whole answer of one chunk,
``Embedded``, failing over before the first byte), a client that leaves cancels it, and
``RequestLife`` counts it under the ``embeddings`` route and logs it. Backends of an embedding
model are built as embedders (``gateway.fleet.engines.build_embedder``).
"""

from __future__ import annotations

import base64
import random
import struct
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backends.base import BackendError, Chunk, ErrorKind, Usage
from backends.embed_base import Embedder, EmbedRequest, EmbedResult, normalized
from gateway.config import LimitsConfig
from gateway.doors.body_errors import param_path, validation_error
from gateway.http.errors import ApiError, bad_request
from gateway.pipeline.refusals import no_candidates
from gateway.pipeline.surfaces import Answer
from routing.features import features
from values import value

if TYPE_CHECKING:
    from gateway.fleet.entry import Entry
    from gateway.http.exchange import Exchange
    from gateway.state import Runtime
    from gateway.telemetry.tracing import RequestTrace
    from routing.decisions import Decision
    from routing.types import FleetSnapshot, RequestFeatures

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


@value(frozen=True, kw_only=True)
class Embedded(Chunk):
    """An embedding's answer as dispatch carries it: one finished chunk with the vectors."""

    result: EmbedResult


class Embedding:
    """An embeddings request as the pipeline carries it: routing measures its inputs, a target embeds
    them, the answer is one document (never a stream)."""

    events: Answer | None = None  # never a stream
    trace: RequestTrace | None = None

    def __init__(self, body: EmbeddingsBody, request_id: str, matryoshka: bool) -> None:
        self.body = body
        self.model = body.model
        self.caller: dict[str, Any] = {"user": body.user} if body.user is not None else {}
        self.request = EmbedRequest(request_id, body.model, inputs_of(body))
        self.clock = self.request.clock
        self._matryoshka = matryoshka

    async def features(
        self, ex: Exchange, rt: Runtime, snapshot: FleetSnapshot, headers: Mapping[str, str]
    ) -> RequestFeatures:
        inputs = self.request.inputs
        texts = [x if isinstance(x, str) else "" for x in inputs]
        exact = sum(len(x) for x in inputs if not isinstance(x, str)) or None
        return features(self.model, texts, 1, False, headers, exact, random.random())

    def admission(self, limits: LimitsConfig) -> tuple[int, int | None]:
        return 1, None  # an answer of no tokens; inputs given as text are counted as routing counts them

    def admitted(self, features: RequestFeatures) -> None:
        return None  # there is no answer length to bound

    def refusal(self, decision: Decision) -> ApiError:
        return no_candidates(decision, self.model, {}, frozenset())

    def reopen(self, target: Entry, error: BackendError) -> None:
        return None  # an embedding has no answer length to fit

    async def open_at(self, target: Entry) -> AsyncIterator[Chunk]:
        backend = target.backend
        if not isinstance(backend, Embedder):
            raise BackendError(ErrorKind.INTERNAL, f"{target.name} is not an embedding engine")
        request = self.request
        if self.trace is not None:  # the attempt's span context goes to the engine
            request = replace(request, headers=self.trace.outgoing(target.name))
        result = await backend.embed(request)
        yield Embedded(finish_reason="stop", usage=Usage(result.prompt_tokens, 0), result=result)

    def at_once(self, target: Entry) -> bool:
        return False  # its one chunk comes under the first token's deadline, as a generation's first would

    def whole(self, chunks: list[Chunk]) -> tuple[dict[str, Any], Usage | None]:
        embedded = chunks[0]
        assert isinstance(embedded, Embedded)  # what open_at yields
        result = embedded.result
        return document(self.body, self.model, result, self._matryoshka), Usage(result.prompt_tokens, 0)


class EmbeddingsDoor:
    """The front door: its requests are ``Embedding`` work; errors in OpenAI's shape."""

    route = "embeddings"

    def understood(self, data: Any, rt: Runtime, request_id: str) -> Embedding:
        body = parse(data)
        matryoshka = False
        if body.model in rt.model_names:  # an unknown model is the pipeline's to refuse
            entry = rt.loaded.model(body.model)
            if entry.kind != "embed":
                raise bad_request(
                    f"`{body.model}` generates text; it makes no embeddings (a model entry of `kind: embed` does).",
                    "model",
                    "model_not_embedding",
                )
            matryoshka = entry.matryoshka
        return Embedding(body, request_id, matryoshka)

    def error_body(self, error: ApiError) -> bytes:
        return error.json()


EMBEDDINGS = EmbeddingsDoor()
PATH = "/v1/embeddings"
