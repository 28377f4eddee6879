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
from pathlib import Path

import numpy as np

from backends.embed_base import EmbedRequest, EmbedResult, InProcessEmbedder
from backends.gguf_file import GgufCache, read_gguf
from backends.hf_tokenizer import encode

INLINE_INPUTS_CHARS = 8192
"""Batches up to this many characters are embedded inline (well under a millisecond); bigger ones in a thread."""


class StaticEmbedder(InProcessEmbedder):
    def __init__(self, name: str, model_name: str, gguf_path: Path, ggufs: GgufCache | None = None) -> None:
        ggufs = ggufs or GgufCache()
        header = ggufs.header(gguf_path)
        vocab = len(header.vocab.tokens)
        super().__init__(name, model_name, header.context_length, vocab)
        self._table = read_gguf(gguf_path).tensors["token_embd.weight"].reshape(vocab, -1)
        self._tokenizer = ggufs.tokenizer(gguf_path)

    def _vectors(self, inputs: tuple[str, ...] | tuple[tuple[int, ...], ...]) -> EmbedResult:
        vectors: list[list[float]] = []
        tokens = 0
        for item in inputs:
            ids = encode(self._tokenizer, item).ids if isinstance(item, str) else list(item)
            self.check(ids)
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

    async def aclose(self) -> None:
        return None
