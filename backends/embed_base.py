"""Embedding engines: the optional ability to turn inputs into vectors, beside ``Backend``.

A backend that embeds is still a ``Backend`` (health, load, models, close; the fleet polls it like any
other) and also an ``Embedder``. Its ``generate`` refuses at once: a model entry of ``kind: embed``
is never asked for text, and one of ``kind: generate`` never for vectors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from backends.base import BackendError, Chunk, EngineClock, ErrorKind


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    request_id: str
    model: str
    inputs: tuple[str, ...] | tuple[tuple[int, ...], ...]
    """Texts, or token id arrays (the model's own ids)."""
    clock: EngineClock = field(default_factory=EngineClock, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class EmbedResult:
    vectors: list[list[float]]
    """One per input, in order, L2-normalized as OpenAI's are."""
    prompt_tokens: int


@runtime_checkable
class Embedder(Protocol):
    async def embed(self, request: EmbedRequest) -> EmbedResult: ...


def refuse_generation(name: str, model: str) -> BackendError:
    return BackendError(
        ErrorKind.BAD_REQUEST,
        f"`{model}` is an embedding model: it makes embeddings, not text.",
        param="model",
    )


async def no_text(name: str, model: str) -> AsyncIterator[Chunk]:
    """``generate`` of an embedder: the request is refused before anything is sent."""
    raise refuse_generation(name, model)
    yield Chunk()  # pragma: no cover - makes this an async generator


def normalized(vector: list[float]) -> list[float]:
    norm = sum(x * x for x in vector) ** 0.5
    return [x / norm for x in vector] if norm > 0 else vector
