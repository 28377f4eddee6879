"""The embedded default's embedding engine: a model's own token embeddings, mean-pooled, in process.

For a model entry of ``kind: embed`` served by ``engine: ctranslate2``. CTranslate2 runs decoder models
such as the demo one for generation only (its ``Generator`` returns logits, never hidden states), so
this engine embeds an input as the mean of the GGUF's ``token_embd.weight`` rows of its tokens,
L2-normalized: a static embedding (as word-vector averaging and Model2Vec models are), exact and
deterministic, with nothing to build or install beyond the base package. Texts are tokenized with the
model's own tokenizer (the ids llama.cpp and CTranslate2 use); token arrays are embedded as they are.
The table is read once, at start; an embedding costs one tokenization and a mean (numpy, in a thread
for big batches).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import numpy as np

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Health, Load
from backends.capabilities import PLAIN, Capabilities
from backends.embed_base import EmbedRequest, EmbedResult, no_text
from backends.gguf_file import GgufCache, read_gguf
from backends.hf_tokenizer import encode

INLINE_INPUTS_CHARS = 8192
"""Batches up to this many characters are embedded inline (well under a millisecond); bigger ones in a thread."""


class StaticEmbedder:
    capabilities: ClassVar[Capabilities] = PLAIN

    def __init__(self, name: str, model_name: str, gguf_path: Path, ggufs: GgufCache | None = None) -> None:
        ggufs = ggufs or GgufCache()
        self.name = name
        self._model = model_name
        header = ggufs.header(gguf_path)
        self.context = header.context_length
        self._table = read_gguf(gguf_path).tensors["token_embd.weight"].reshape(len(header.vocab.tokens), -1)
        self._tokenizer = ggufs.tokenizer(gguf_path)
        self._running = 0

    def _vectors(self, inputs: tuple[str, ...] | tuple[tuple[int, ...], ...]) -> EmbedResult:
        vectors: list[list[float]] = []
        tokens = 0
        for item in inputs:
            ids = encode(self._tokenizer, item).ids if isinstance(item, str) else list(item)
            if not ids:
                raise BackendError(ErrorKind.BAD_REQUEST, "An input is empty.", param="input")
            if len(ids) > self.context:
                raise BackendError(
                    ErrorKind.CONTEXT_LENGTH,
                    f"An input of {len(ids)} tokens is longer than the model's context ({self.context}).",
                    param="input",
                )
            if max(ids) >= len(self._table) or min(ids) < 0:
                raise BackendError(ErrorKind.BAD_REQUEST, "A token id is outside the vocabulary.", param="input")
            mean = self._table[ids].mean(axis=0, dtype=np.float64)
            norm = float(np.linalg.norm(mean))
            vectors.append((mean / norm if norm > 0 else mean).tolist())
            tokens += len(ids)
        return EmbedResult(vectors, tokens)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        size = sum(len(i) for i in request.inputs)
        self._running += 1
        try:
            if size <= INLINE_INPUTS_CHARS:
                return self._vectors(request.inputs)
            return await asyncio.to_thread(self._vectors, request.inputs)
        finally:
            self._running -= 1

    def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        return no_text(self.name, self._model)

    async def health(self) -> Health:
        return Health(ok=True)

    async def load(self) -> Load | None:
        return Load(running=self._running, waiting=0)

    def models(self) -> list[str]:
        return [self._model]

    async def aclose(self) -> None:
        return None
