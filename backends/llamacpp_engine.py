"""llama.cpp in process, through llama-cpp-python (the ``llama`` extra).

A ``Llama`` object is not thread-safe, so each model has exactly one worker
thread; other requests wait for it (bounded by ``max_queue``). The prompt is
tokenized by llama.cpp itself, and text is assembled from the GGUF's pieces
with the same rules as the CTranslate2 backend, so both print alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from backends.base import Chunk, GenerationRequest, Health, Load
from backends.gguf_file import read_gguf
from backends.inproc import ChatRenderer, ThreadedGeneration, check_context, piece_table


class LlamaCppBackend:
    def __init__(
        self,
        name: str,
        model_name: str,
        gguf_path: Path,
        *,
        threads: int = 1,
        n_ctx: int | None = None,
        max_queue: int = 64,
    ) -> None:
        from llama_cpp import Llama

        self.name = name
        self._model_name = model_name
        gguf = read_gguf(gguf_path)
        self.context_length = min(n_ctx or gguf.context_length, gguf.context_length)
        self._llama = Llama(
            str(gguf_path),
            n_ctx=self.context_length,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        self._add_bos = gguf.vocab.add_bos
        self._pieces = piece_table(gguf.vocab)
        self._stop_ids = frozenset(gguf.vocab.stop_ids)
        self._chat = ChatRenderer(gguf.vocab.chat_template)
        self._workers = ThreadedGeneration(name, 1, max_queue)

    @property
    def generated_tokens(self) -> int:
        return self._workers.generated_tokens

    def models(self) -> list[str]:
        return [self._model_name]

    async def health(self) -> Health:
        return Health(ok=True)

    async def load(self) -> Load | None:
        return Load(running=self._workers.running, waiting=self._workers.waiting)

    async def aclose(self) -> None:
        self._workers.shutdown()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        text = self._chat.render(request.messages) if request.messages is not None else request.prompt or ""
        prompt = self._llama.tokenize(text.encode(), add_bos=self._add_bos, special=True)
        max_tokens = check_context(request, len(prompt), self.context_length)
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

        async for chunk in self._workers.run(
            request, token_loop, len(prompt), self._pieces, self._stop_ids, max_tokens
        ):
            yield chunk
