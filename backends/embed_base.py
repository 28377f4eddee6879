"""Embedding engines: the optional ability to turn inputs into vectors, beside ``Backend``.

A backend that embeds is still a ``Backend`` (health, load, models, close; the fleet polls it like any
other) and also an ``Embedder``. Its ``generate`` refuses at once: a model entry of ``kind: embed``
is never asked for text, and one of ``kind: generate`` never for vectors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

from backends.base import BackendError, Chunk, EngineClock, ErrorKind, GenerationRequest, Health, Load
from backends.capabilities import PLAIN, Capabilities


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    request_id: str
    model: str
    inputs: tuple[str, ...] | tuple[tuple[int, ...], ...]
    """Texts, or token id arrays (the model's own ids)."""
    clock: EngineClock = field(default_factory=EngineClock, compare=False, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """More HTTP headers for this attempt's request (``GenerationRequest.headers``: the trace context)."""


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


class InProcessEmbedder:
    """What the in-process embedders share: one model of a known context and vocabulary, inputs checked
    against them, no text, the gateway's own count of its work as load."""

    capabilities: ClassVar[Capabilities] = PLAIN

    def __init__(self, name: str, model_name: str, context: int, vocab_size: int) -> None:
        self.name = name
        self._model = model_name
        self.context = context
        self._vocab_size = vocab_size
        self._running = 0
        self._waiting = 0

    def check(self, ids: Sequence[int]) -> None:
        """Refuse an input the model cannot embed: empty, beyond its context, or ids outside its vocabulary."""
        if not ids:
            raise BackendError(ErrorKind.BAD_REQUEST, "An input is empty.", param="input")
        if len(ids) > self.context:
            raise BackendError(
                ErrorKind.CONTEXT_LENGTH,
                f"An input of {len(ids)} tokens is longer than the model's context ({self.context}).",
                param="input",
            )
        if max(ids) >= self._vocab_size or min(ids) < 0:
            raise BackendError(ErrorKind.BAD_REQUEST, "A token id is outside the vocabulary.", param="input")

    def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        return no_text(self.name, self._model)

    async def health(self) -> Health:
        return Health(ok=True)

    async def load(self) -> Load | None:
        return Load(running=self._running, waiting=self._waiting)

    def models(self) -> list[str]:
        return [self._model]
