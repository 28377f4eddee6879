"""llama.cpp in process, through llama-cpp-python (the ``llama`` extra).

A ``Llama`` object is not thread-safe, so each model has exactly one worker
thread; other requests wait for it (bounded by ``max_queue``). The prompt is
tokenized by llama.cpp itself, and text is assembled from the GGUF's pieces
with the same rules as the CTranslate2 backend, so both print alike.

Everything a request asks for is done by llama.cpp's own sampler chain, built
per request by ``Llama.generate``: the seed goes to its sampler, penalties to its
penalties sampler (whose window is the whole context, so they count every
generated token as OpenAI's do), ``response_format`` and a forced tool call to
its grammar sampler. The one Python step in the chain, added only when needed, is
a logits processor: it runs first on each token, on the worker thread, and reads
the raw logits for logprobs (the model's distribution, before bias, penalties,
grammar and temperature, as vLLM reports them by default), then adds
``logit_bias`` and holds off end tokens for ``min_tokens``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Health
from backends.capabilities import (
    ECHO,
    JSON_OBJECT,
    JSON_SCHEMA,
    LOGIT_BIAS,
    LOGPROBS,
    PENALTIES,
    PREFILL,
    SEED,
    TOOL_CHOICE_REQUIRED,
    TOOLS,
    TOP_LOGPROBS,
    Capabilities,
)
from backends.gguf_file import GgufCache
from backends.inproc import InProcessEngine, extra_float, extra_int, seed32
from backends.inproc_threads import Step
from backends.inproc_tokens import LogprobMaker
from backends.text import sized_work

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from llama_cpp.llama_grammar import LlamaGrammar

# llama.cpp's "no seed": its sampler draws a random one. Set for unseeded requests, or a seeded request
# would leave its seed behind for every later one.
RANDOM_SEED = 0xFFFFFFFF
_ROOT_RULE = re.compile(r"^root ::=", re.M)
# llama-cpp-python's schema converter lets a string hold raw control characters (a newline), which no
# JSON parser accepts; llama.cpp's own converter excludes them, as this does.
_LOOSE_CHAR = r'char ::= [^"\\]'
_STRICT_CHAR = r'char ::= [^"\\\x7F\x00-\x1F]'


def _json_gbnf(schema: dict[str, Any]) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return str(json_schema_to_gbnf(json.dumps(schema))).replace(_LOOSE_CHAR, _STRICT_CHAR)


# How a forced call is written, per tool-call format the gateway parses (``backends.tool_calls``):
# the key that holds the arguments, and the text around the call's JSON.
CALL_SHAPES = {
    "hermes": ("arguments", '"<tool_call>\\n" tool-call "\\n</tool_call>"'),
    "llama3_json": ("parameters", "tool-call"),
}


def _call_schema(tools: tuple[dict[str, Any], ...], choice: str | dict[str, Any] | None, key: str) -> dict[str, Any]:
    """The JSON a forced call must be: the name and ``key`` (the arguments) of the named tool, or of any."""

    def shape(fn: dict[str, Any]) -> dict[str, Any]:
        params = fn.get("parameters") or {"type": "object"}
        return {"type": "object", "properties": {"name": {"const": fn["name"]}, key: params}, "required": ["name", key]}

    fns = [t["function"] for t in tools if t.get("type", "function") == "function"]
    if isinstance(choice, dict):
        wanted = choice["function"]["name"]
        fns = [fn for fn in fns if fn["name"] == wanted] or fns
    return shape(fns[0]) if len(fns) == 1 else {"anyOf": [shape(fn) for fn in fns]}


def grammar_text(request: GenerationRequest, tool_format: str | None = "hermes") -> str | None:
    """The GBNF that constrains this answer, or None: JSON for ``response_format``; for ``tool_choice``
    required or named, one call of the tools' schemas as ``tool_format`` writes it (Hermes: in
    ``<tool_call>`` tags; llama3_json: the bare object)."""
    choice = request.tool_choice
    if request.tools and (choice == "required" or isinstance(choice, dict)):
        if tool_format not in CALL_SHAPES:
            raise ValueError(f"a forced call cannot be written in the {tool_format} tool-call format")
        key, around = CALL_SHAPES[tool_format]
        call = _json_gbnf(_call_schema(request.tools, choice, key))
        # The converter names its top rule "root": it becomes the call inside the format's text.
        call = _ROOT_RULE.sub("tool-call ::=", call, count=1)
        return f"root ::= {around}\n{call}"
    fmt = request.response_format or {}
    if fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}
        return _json_gbnf(schema)
    if fmt.get("type") == "json_object":
        # The converter's object grammar bounds whitespace; llama.cpp's JSON_GBNF lets a model pad forever.
        return _json_gbnf({"type": "object"})
    return None


class StepProcessor:
    """The logits processor: reads raw logits for logprobs, adds ``logit_bias``, holds off end tokens
    until ``min_tokens``. Called by llama.cpp once per generated token, on the worker thread, with the
    logits of every id in id order."""

    def __init__(
        self,
        logprobs: LogprobMaker | None,
        bias: dict[int, float] | None,
        stop_ids: frozenset[int],
        min_tokens: int,
        n_vocab: int,
    ) -> None:
        import numpy as np

        self.logprobs = logprobs
        self.last: npt.NDArray[np.float32] | None = None
        ids = [i for i in (bias or {}) if 0 <= i < n_vocab]  # an id the model lacks has nothing to bias
        self._bias_ids = np.array(ids, dtype=np.intp)
        self._bias = np.array([(bias or {})[i] for i in ids], dtype=np.float32)
        self._stop_ids = np.array(sorted(stop_ids), dtype=np.intp)
        self._hold_stops = min_tokens
        self._steps = 0

    def __call__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
        if self.logprobs is not None:
            self.last = scores.copy()
        if self._bias_ids.size:
            scores[self._bias_ids] += self._bias
        if self._steps < self._hold_stops:
            scores[self._stop_ids] = float("-inf")
        self._steps += 1
        return scores


_FEATURES = frozenset(
    {
        SEED, LOGPROBS, TOP_LOGPROBS, PENALTIES, LOGIT_BIAS, JSON_OBJECT, JSON_SCHEMA, TOOLS, TOOL_CHOICE_REQUIRED,
        ECHO, PREFILL,
    }
)  # fmt: skip
# Only fields that take effect: llama-cpp-python takes tfs_z but its sampler chain ignores it.
_EXTRAS = frozenset(
    {
        "top_k", "min_p", "typical_p", "repetition_penalty", "repeat_penalty", "ignore_eos", "min_tokens",
        "mirostat", "mirostat_tau", "mirostat_eta",
    }
)  # fmt: skip


class LlamaCppBackend(InProcessEngine):
    capabilities: ClassVar[Capabilities] = Capabilities(features=_FEATURES, extras=_EXTRAS, tools_in_prompt=True)

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
        tool_parser: str | None = "hermes",
    ) -> None:
        """``tool_parser`` is the model's tool-call format (the gateway's parser for it): a forced call is
        written in it."""
        from llama_cpp import Llama

        gguf = (ggufs or GgufCache()).header(gguf_path)
        context = min(n_ctx or gguf.context_length, gguf.context_length)
        super().__init__(name, model_name, gguf.vocab, context, 1, max_queue)
        self._tool_format = tool_parser
        # The penalties window is the whole context: OpenAI's penalties count every token generated so far.
        self._llama = Llama(
            str(gguf_path),
            n_ctx=context,
            n_threads=threads,
            n_threads_batch=threads,
            last_n_tokens_size=context,
            verbose=False,
        )

    async def health(self) -> Health:
        return Health(ok=True)

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        # Tokenizing reads only the model's vocabulary, never the context the worker thread decodes with.
        ids: list[int] = self._llama.tokenize(
            self.prompt_text(request).encode(), add_bos=self._vocab.add_bos, special=True
        )
        bos = self._vocab.bos_id
        if not ids and bos is not None:  # an empty prompt starts at BOS
            ids = [bos]
        if not ids:
            raise BackendError(ErrorKind.BAD_REQUEST, "The prompt is empty.", param="prompt")
        return ids

    def sampling(self, request: GenerationRequest) -> dict[str, Any]:
        """``Llama.generate``'s sampling arguments for this request."""
        # vLLM's name for it, or llama.cpp's own.
        repeat = extra_float(request, "repetition_penalty", extra_float(request, "repeat_penalty", 1.0))
        options: dict[str, Any] = {
            "repeat_penalty": repeat,
            "presence_penalty": request.presence_penalty or 0.0,
            "frequency_penalty": request.frequency_penalty or 0.0,
        }
        if request.greedy:  # top-k 1; penalties and bias still shape which token that is
            return {**options, "temp": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0}
        # Otherwise plain temperature and nucleus sampling over the whole vocabulary, unless asked.
        return {
            **options,
            "temp": request.temperature,
            "top_p": request.top_p,
            "top_k": max(0, extra_int(request, "top_k", 0)),
            "min_p": extra_float(request, "min_p", 0.0),
            "typical_p": extra_float(request, "typical_p", 1.0),
            "mirostat_mode": extra_int(request, "mirostat", 0),
            "mirostat_tau": extra_float(request, "mirostat_tau", 5.0),
            "mirostat_eta": extra_float(request, "mirostat_eta", 0.1),
        }

    def _grammar(self, request: GenerationRequest) -> LlamaGrammar | None:
        """The request's grammar, parsed once by llama.cpp here: a grammar that fails to parse in the
        sampler chain crashes the process (llama-cpp-python adds the null sampler it gets)."""
        import llama_cpp
        from llama_cpp.llama_grammar import LlamaGrammar

        text = grammar_text(request, self._tool_format)
        if text is None:
            return None
        vocab = llama_cpp.llama_model_get_vocab(self._llama.model)  # read-only: safe beside the worker
        probe = llama_cpp.llama_sampler_init_grammar(vocab, text.encode(), b"root")
        if not probe:
            raise ValueError("the schema's grammar does not parse")
        llama_cpp.llama_sampler_free(probe)
        return LlamaGrammar.from_string(text, verbose=False)

    async def constraint(self, request: GenerationRequest) -> LlamaGrammar | None:
        """The grammar for ``response_format`` or a forced tool call, converted off the event loop (a
        large schema is CPU work); a schema llama.cpp cannot follow is the client's 400."""
        forced = request.tool_choice == "required" or isinstance(request.tool_choice, dict)
        if request.response_format is None and not (request.tools and forced):
            return None
        try:
            return await asyncio.to_thread(self._grammar, request)
        # llama-cpp-python's schema converter reports what it cannot follow with assertions and
        # ValueErrors (unsupported refs, patterns, types), a schema nested past Python's stack with
        # RecursionError; anything else is a gateway bug, logged with its traceback by dispatch.
        except (AssertionError, ValueError, RecursionError) as exc:
            param = "tool_choice" if request.tools and forced else "response_format"
            raise BackendError(
                ErrorKind.BAD_REQUEST, f"the engine cannot constrain the answer to this schema: {exc}", param=param
            ) from exc

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt = await sized_work(request, self._prompt_ids)
        grammar = await self.constraint(request)
        llama = self._llama
        options = self.sampling(request)
        logprobs = self.logprob_maker(request)
        min_tokens = extra_int(request, "min_tokens", 0)
        ignore_eos = bool(request.extra.get("ignore_eos", False))
        needs_processor = logprobs is not None or bool(request.logit_bias) or (min_tokens > 0 and not ignore_eos)

        def token_loop(cancelled: Callable[[], bool]) -> Iterator[Step]:
            # Runs on the single worker thread: the only place this Llama is touched.
            from llama_cpp import LogitsProcessorList

            llama.set_seed(seed32(request.seed) if request.seed is not None else RANDOM_SEED)
            processor = None
            if needs_processor:
                processor = StepProcessor(logprobs, request.logit_bias, self._stop_ids, min_tokens, llama.n_vocab())
                options["logits_processor"] = LogitsProcessorList([processor])
            for token_id in llama.generate(prompt, reset=True, grammar=grammar, **options):
                if processor is not None and processor.logprobs is not None and processor.last is not None:
                    yield token_id, processor.logprobs.from_logits(processor.last, token_id)
                else:
                    yield token_id
                if cancelled():
                    return

        async for chunk in self.stream(request, len(prompt), token_loop):
            yield chunk
