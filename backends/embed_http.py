"""Embedding engines reached over HTTP, all through OpenAI's ``POST /v1/embeddings``: vLLM serving an
embedding (pooling) model, llama.cpp's ``llama-server --embeddings``, and Hugging Face's
text-embeddings-inference (``engine: tgi`` for an embedding model: TGI's sibling for embeddings).

Each is the engine's own adapter (its health and load) plus ``embed``; vectors and token counts come
back as the engine computed them. Token arrays go out as token arrays.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

import orjson

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest
from backends.capabilities import PLAIN, Capabilities
from backends.embed_base import EmbedRequest, EmbedResult, no_text
from backends.http_base import HttpBackend
from backends.llama_server import LlamaServerBackend
from backends.vllm import VLLMBackend


def parse_embeddings(name: str, body: bytes, count: int) -> EmbedResult:
    """OpenAI's embeddings list, in input order; anything else is the engine's protocol error."""
    try:
        doc = orjson.loads(body)
        data = sorted(doc["data"], key=lambda d: d["index"])
        vectors = [[float(x) for x in d["embedding"]] for d in data]
        usage = doc.get("usage") or {}
        tokens = int(usage.get("prompt_tokens") or usage.get("total_tokens") or 0)
    except (ValueError, KeyError, TypeError) as exc:
        raise BackendError(ErrorKind.PROTOCOL, f"{name}: not an embeddings list: {exc}") from exc
    if len(vectors) != count:
        raise BackendError(ErrorKind.PROTOCOL, f"{name}: {len(vectors)} embeddings for {count} inputs")
    return EmbedResult(vectors, tokens)


class OpenAIEmbeddings(HttpBackend):
    """``embed`` over ``/v1/embeddings``; ``generate`` refuses (an embedding model writes no text)."""

    capabilities: ClassVar[Capabilities] = PLAIN
    embeddings_path = "/v1/embeddings"

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        inputs: list[Any] = [x if isinstance(x, str) else list(x) for x in request.inputs]
        payload = {"model": self.settings.served_model, "input": inputs, "encoding_format": "float"}
        carrier = GenerationRequest(request.request_id, request.model, clock=request.clock, headers=request.headers)
        async with self.open_stream(carrier, self.embeddings_path, payload) as response:
            body = await self.read_body(response, request.clock)
        return parse_embeddings(self.name, body, len(inputs))

    def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        return no_text(self.name, self._model)


class VLLMEmbeddings(OpenAIEmbeddings, VLLMBackend):
    """vLLM with ``--runner pooling`` (``--task embed`` before 0.10)."""


class LlamaServerEmbeddings(OpenAIEmbeddings, LlamaServerBackend):
    """``llama-server --embeddings`` (with ``--pooling mean`` or the model's own pooling)."""


class TeiEmbeddings(OpenAIEmbeddings):
    """text-embeddings-inference: ``/health``; its queue is counted by this gateway."""

    engine = "tei"
    health_path = "/health"
    metrics_path = None
