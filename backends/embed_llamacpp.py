"""llama.cpp in process as an embedding engine (``embedding=True``, mean pooling, L2-normalized),
for a model entry of ``kind: embed`` served by ``engine: llama_cpp``.

One embedding at a time per backend, in a worker thread (llama.cpp's context is not shared between
threads); a batch of inputs is one call. Token arrays are embedded as the ids they are.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from backends.base import BackendError, ErrorKind
from backends.embed_base import EmbedRequest, EmbedResult, InProcessEmbedder, normalized
from backends.gguf_file import GgufCache


class LlamaCppEmbedder(InProcessEmbedder):
    def __init__(
        self,
        name: str,
        model_name: str,
        gguf_path: Path,
        *,
        threads: int = 1,
        n_ctx: int | None = None,
        max_queue: int = 64,
        ggufs: GgufCache | None = None,
    ) -> None:
        import llama_cpp

        gguf = (ggufs or GgufCache()).header(gguf_path)
        context = min(n_ctx or gguf.context_length, gguf.context_length)
        super().__init__(name, model_name, context, len(gguf.vocab.tokens))
        self._llama: Any = llama_cpp.Llama(
            str(gguf_path),
            embedding=True,
            pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            n_ctx=self.context,
            n_batch=self.context,
            n_ubatch=self.context,  # an input is pooled in one batch
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        self._lock = asyncio.Semaphore(1)
        self._context = threading.Lock()
        """Held by the worker thread: a cancelled request's thread runs on, and the next waits for it."""
        self._max_queue = max_queue

    def _vectors(self, inputs: tuple[str, ...] | tuple[tuple[int, ...], ...]) -> EmbedResult:
        """On the worker thread. Each input is one sequence decoded alone, pooled by llama.cpp; this
        is what ``Llama.embed`` does inside (its batch and context, pinned with llama-cpp-python),
        taking token ids as well as text."""
        with self._context:
            return self._embed_all(inputs)

    def _embed_all(self, inputs: tuple[str, ...] | tuple[tuple[int, ...], ...]) -> EmbedResult:
        import llama_cpp

        llama = self._llama
        size = llama.n_embd()
        vectors: list[list[float]] = []
        tokens = 0
        for item in inputs:
            ids = llama.tokenize(item.encode()) if isinstance(item, str) else list(item)
            self.check(ids)
            batch = llama._batch
            batch.reset()
            batch.add_sequence(ids, 0, True)
            llama._ctx.kv_cache_clear()
            llama._ctx.decode(batch)
            batch.reset()
            vectors.append(normalized(list(llama_cpp.llama_get_embeddings_seq(llama._ctx.ctx, 0)[:size])))
            tokens += len(ids)
        return EmbedResult(vectors, tokens)

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        if self._waiting >= self._max_queue:
            raise BackendError(ErrorKind.OVERLOADED, f"{self.name}: the queue is full", retry_after=1.0)
        self._waiting += 1
        queued = True
        try:
            async with self._lock:
                self._waiting -= 1
                queued = False
                self._running += 1
                try:
                    # Not cancellable once begun (a short computation): a client that left gets nothing.
                    return await asyncio.to_thread(self._vectors, request.inputs)
                finally:
                    self._running -= 1
        finally:
            if queued:
                self._waiting -= 1

    async def aclose(self) -> None:
        self._llama.close()
