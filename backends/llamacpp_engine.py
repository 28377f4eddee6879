"""llama.cpp in process, through llama-cpp-python (the ``llama`` extra).

A ``Llama`` object is not thread-safe, so each model has exactly one worker
thread; other requests wait for it (bounded by ``max_queue``). The prompt is
tokenized by llama.cpp itself, and text is assembled from the GGUF's pieces
with the same rules as the CTranslate2 backend, so both print alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from backends.base import Chunk, GenerationRequest, Health
from backends.gguf_file import GgufCache
from backends.inproc import InProcessEngine
from backends.text import sized_work


class LlamaCppBackend(InProcessEngine):
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
        from llama_cpp import Llama

        gguf = (ggufs or GgufCache()).header(gguf_path)
        context = min(n_ctx or gguf.context_length, gguf.context_length)
        super().__init__(name, model_name, gguf.vocab, context, 1, max_queue)
        self._llama = Llama(str(gguf_path), n_ctx=context, n_threads=threads, n_threads_batch=threads, verbose=False)

    async def health(self) -> Health:
        return Health(ok=True)

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        # Tokenizing reads only the model's vocabulary, never the context the worker thread decodes with.
        ids: list[int] = self._llama.tokenize(
            self.prompt_text(request).encode(), add_bos=self._vocab.add_bos, special=True
        )
        return ids

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt = await sized_work(request, self._prompt_ids)
        llama = self._llama
        # Greedy is top-k 1; otherwise plain temperature and nucleus sampling over the whole vocabulary.
        temp, top_k, top_p = (0.0, 1, 1.0) if request.greedy else (request.temperature, 0, request.top_p)

        def token_loop(cancelled: Callable[[], bool]) -> Iterator[int]:
            # Runs on the single worker thread: the only place this Llama is touched.
            if request.seed is not None:
                llama.set_seed(request.seed)
            for token_id in llama.generate(prompt, top_k=top_k, top_p=top_p, min_p=0.0, temp=temp, reset=True):
                yield token_id
                if cancelled():
                    return

        async for chunk in self.stream(request, len(prompt), token_loop):
            yield chunk
