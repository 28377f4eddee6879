"""CTranslate2 in process: the embedded default engine.

The model is derived from the GGUF at start (``ct2_convert``); prompts are
tokenized with the derived ``tokenizer.json``, whose ids match llama.cpp's.
Generation runs in worker threads; closing the stream stops the token loop,
which stops CTranslate2 at its next step.

Seeds: CTranslate2 samples with a random generator per engine thread, seeded once, when that thread
first samples, from the process-wide ``set_random_seed`` value, so setting the seed before a request
only ever affected a thread that had never sampled. A seeded sampled request therefore runs on a fresh
``Generator`` (its own new thread, a model load: about a millisecond for the demo model, proportional to
the model's size for others), with the seed set under a lock held until that thread has drawn its first
sample. Unseeded and greedy requests use the shared generator as before.

Logprobs are CTranslate2's own log probability of each token (``return_scores``); alternatives come from
the step's logits over the vocabulary (``return_logits_vocab``; CTranslate2 keeps every step's row until
the request ends: 4 bytes x vocabulary per token). Both are the model's distribution before temperature,
after ``repetition_penalty``.

What CTranslate2 cannot do here: OpenAI's additive ``presence_penalty``/``frequency_penalty`` (it has
only the multiplicative ``repetition_penalty``) and ``logit_bias`` (its logits processors are C++ only:
the Python API takes none), and constrained decoding (no grammar), so no JSON mode and no forced tool call.

Tool calls with ``tool_choice`` auto: llama-server holds a call the model opens to the call's format
(a lazy grammar, triggered by ``<tool_call>``), and so does vLLM when a tool is ``strict`` (an xgrammar
structural tag; the Agents SDK marks every tool strict); CTranslate2 cannot. A model that writes a complete call
and then text where the end tag belongs (the demo model does, for the OpenAI Agents SDK's strict
schemas) gets the same answer here: the call counts at its closing brace and generation stops at the
text after it (``tool_calls.answer_end``). What stays different is sampling: a sampled call body that
is not a JSON object is the model's text here (tags removed), where those grammars would have made it
a call; and ``strict`` arguments are not held to their schema.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Health
from backends.capabilities import ECHO, LOGPROBS, PREFILL, SEED, TOOLS, TOP_LOGPROBS, Capabilities
from backends.ct2_convert import TOKENIZER_FILE, derive
from backends.gguf_file import GgufCache
from backends.hf_tokenizer import encode
from backends.inproc import InProcessEngine, extra_float, extra_int, seed32
from backends.inproc_threads import Step
from backends.text import sized_work

if TYPE_CHECKING:
    import ctranslate2

# How often a waiting token loop checks whether CTranslate2's job ended without a last step (it failed).
_POLL_S = 0.1
_SEEDING = threading.Lock()
"""Held from setting CTranslate2's seed until a fresh generator's thread has sampled with it. The seed is
process-wide (``ctranslate2.set_random_seed``), so the lock is too: with one lock per backend, two
CTranslate2 backends in one process could each set the seed the other's fresh thread then read."""


def steps(
    generator: ctranslate2.Generator, prompt: list[str], options: dict[str, Any], stop: Callable[[], bool]
) -> Generator[Any, None, None]:
    """CTranslate2's step results for one prompt, as they are generated (on the caller's thread).

    ``generate_tokens`` takes no ``return_logits_vocab``, so this drives ``generate_batch`` with a step
    callback itself. The callback runs on CTranslate2's own thread and stops the job when ``stop()``
    says so; closing this iterator stops it too, and waits for the job to end."""
    results: queue.SimpleQueue[Any] = queue.SimpleQueue()
    closed = threading.Event()

    def on_step(step: Any) -> bool:
        results.put(step)
        return closed.is_set() or stop()

    job = generator.generate_batch(
        [prompt], asynchronous=True, beam_size=1, include_prompt_in_result=False, callback=on_step, **options
    )[0]
    try:
        while True:
            try:
                step = results.get(timeout=_POLL_S)
            except queue.Empty:
                if job.done():
                    job.result()  # raises what failed the job
                    if results.empty():
                        return  # ended on a step the callback stopped
                continue
            yield step
            if step.is_last:
                return
    finally:
        closed.set()
        job.result()  # the job ends at its next step: wait, so the generator is free for the next request


class CTranslate2Backend(InProcessEngine):
    capabilities: ClassVar[Capabilities] = Capabilities(
        features=frozenset({SEED, LOGPROBS, TOP_LOGPROBS, TOOLS, ECHO, PREFILL}),
        extras=frozenset({"top_k", "repetition_penalty", "ignore_eos", "min_tokens"}),
        tools_in_prompt=True,
    )

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
        tool_parser: str | None = None,
    ) -> None:
        """``tool_parser`` is the model's tool-call format: an answer with tools ends after its calls."""
        from tokenizers import Tokenizer

        model_dir, gguf = derive(gguf_path, cache_dir, ggufs)
        super().__init__(name, model_name, gguf.vocab, gguf.context_length, max_concurrency, max_queue)
        self._tool_format = tool_parser
        self._model_dir = model_dir
        self._threads = threads
        self._generator = self._new_generator()
        self._tokenizer = Tokenizer.from_file(str(model_dir / TOKENIZER_FILE))

    def _new_generator(self) -> ctranslate2.Generator:
        import ctranslate2

        return ctranslate2.Generator(str(self._model_dir), device="cpu", intra_threads=self._threads, inter_threads=1)

    async def health(self) -> Health:
        return Health(ok=self._generator.model_is_loaded)

    def _prompt_tokens(self, request: GenerationRequest) -> list[str]:
        tokens: list[str] = encode(self._tokenizer, self.prompt_text(request)).tokens
        bos = self._vocab.bos_id
        if bos is not None and (self._vocab.add_bos or not tokens):  # an empty prompt starts at BOS
            tokens.insert(0, self._vocab.tokens[bos])
        if not tokens:
            raise BackendError(ErrorKind.BAD_REQUEST, "The prompt is empty.", param="prompt")
        return tokens

    def options(self, request: GenerationRequest) -> dict[str, Any]:
        """``generate_batch``'s arguments for this request."""
        # End tokens are handled by the shared token loop (it honours ignore_eos), not by CTranslate2.
        options: dict[str, Any] = {"max_length": request.max_tokens or self.context_length, "end_token": []}
        if request.greedy or request.top_p <= 0.0:  # top_p 0 keeps only the likeliest token (CT2 refuses 0)
            options["sampling_topk"] = 1
        else:
            top_k = extra_int(request, "top_k", 0)
            options.update(
                sampling_topk=min(max(0, top_k), len(self._vocab.tokens)),  # more than the vocabulary is all of it
                sampling_topp=request.top_p,
                sampling_temperature=request.temperature,
            )
        repetition = extra_float(request, "repetition_penalty", 1.0)
        if repetition != 1.0:
            options["repetition_penalty"] = repetition
        min_tokens = extra_int(request, "min_tokens", 0)
        if min_tokens > 0 and not request.extra.get("ignore_eos"):
            # CTranslate2 holds off its end tokens until min_length; it then ends on one, as the loop would.
            options.update(end_token=[self._vocab.tokens[i] for i in sorted(self._stop_ids)], min_length=min_tokens)
        if request.logprobs:
            options["return_scores"] = True
            options["return_logits_vocab"] = request.top_logprobs > 0
        return options

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt = await sized_work(request, self._prompt_tokens)
        options = self.options(request)
        logprobs = self.logprob_maker(request)
        seeded = request.seed is not None and not request.greedy

        def token_loop(cancelled: Callable[[], bool]) -> Iterator[Step]:
            if seeded:
                run = self._seeded(seed32(request.seed or 0), prompt, options, cancelled)
            else:
                run = steps(self._generator, prompt, options, cancelled)
            with closing(run):
                for step in run:
                    if logprobs is None:
                        yield step.token_id
                    elif logprobs.top:
                        yield step.token_id, logprobs.from_logits(step.logits, step.token_id)
                    else:
                        yield step.token_id, logprobs.known(step.token_id, step.log_prob)
                    if cancelled():
                        return

        async for chunk in self.stream(request, len(prompt), token_loop):
            yield chunk

    def _seeded(
        self, seed: int, prompt: list[str], options: dict[str, Any], cancelled: Callable[[], bool]
    ) -> Generator[Any, None, None]:
        """Steps of a fresh generator whose sampling thread is seeded with ``seed`` (worker thread)."""
        import ctranslate2

        with _SEEDING:
            ctranslate2.set_random_seed(seed)
            run = steps(self._new_generator(), prompt, options, cancelled)
            first = next(run, None)  # the fresh thread's first sample seeds its random generator
        if first is None:
            return
        with closing(run):
            yield first
            yield from run
