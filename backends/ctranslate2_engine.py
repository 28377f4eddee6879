"""CTranslate2 in process: the embedded default engine.

The model is derived from the GGUF at start (``ct2_convert``); prompts are
tokenized with the derived ``tokenizer.json``, whose ids match llama.cpp's.
Generation runs in worker threads; closing the stream stops the token loop,
which stops CTranslate2 at its next step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from backends.base import Chunk, GenerationRequest, Health
from backends.ct2_convert import TOKENIZER_FILE, derive
from backends.gguf_file import GgufCache
from backends.hf_tokenizer import encode
from backends.inproc import InProcessEngine
from backends.text import sized_work


class CTranslate2Backend(InProcessEngine):
    def __init__(
        self,
        name: str,
        model_name: str,
        gguf_path: Path,
        cache_dir: Path,
        *,
        threads: int = 1,
        max_concurrency: int = 4,
        max_queue: int = 64,
        ggufs: GgufCache | None = None,
    ) -> None:
        import ctranslate2
        from tokenizers import Tokenizer

        model_dir, gguf = derive(gguf_path, cache_dir, ggufs)
        super().__init__(name, model_name, gguf.vocab, gguf.context_length, max_concurrency, max_queue)
        self._generator = ctranslate2.Generator(str(model_dir), device="cpu", intra_threads=threads, inter_threads=1)
        self._tokenizer = Tokenizer.from_file(str(model_dir / TOKENIZER_FILE))

    async def health(self) -> Health:
        return Health(ok=self._generator.model_is_loaded)

    def _prompt_tokens(self, request: GenerationRequest) -> list[str]:
        tokens: list[str] = encode(self._tokenizer, self.prompt_text(request)).tokens
        if self._vocab.add_bos and self._vocab.bos_id is not None:
            tokens.insert(0, self._vocab.tokens[self._vocab.bos_id])
        return tokens

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt = await sized_work(request, self._prompt_tokens)
        # End tokens are handled by the shared token loop (it honours ignore_eos), not by CTranslate2.
        options: dict[str, object] = {"max_length": request.max_tokens or self.context_length, "end_token": []}
        if request.greedy:
            options["sampling_topk"] = 1
        else:
            options.update(sampling_topk=0, sampling_topp=request.top_p, sampling_temperature=request.temperature)
        if request.seed is not None:
            # CTranslate2's seed is process-wide: a seed is honoured best effort under concurrency.
            import ctranslate2

            ctranslate2.set_random_seed(request.seed)

        def token_loop(cancelled: Callable[[], bool]) -> Iterator[int]:
            steps = self._generator.generate_tokens(prompt, **options)
            try:
                for step in steps:
                    yield step.token_id
                    if cancelled():
                        return
            finally:
                steps.close()  # stops CTranslate2's own generation thread

        async for chunk in self.stream(request, len(prompt), token_loop):
            yield chunk
