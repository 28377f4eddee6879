"""Routing's plain descriptors built from a validated config: model specs, backend profiles, rules.

Kept apart from the running fleet so ``enginegate route explain`` can use them
without starting an engine.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from backends.base import GenerationRequest
from backends.capabilities import IMAGES, PARALLEL_TOOL_CALLS, TOOL_CHOICE_REQUIRED, TOOLS, Capabilities, text_only
from backends.gguf_file import GgufCache
from backends.hf_tokenizer import encode
from backends.text import INLINE_PROMPT_CHARS, ChatRenderer, prompt_chars
from gateway.config import BackendConfig, LlamaCppConfig, LoadedConfig, ModelConfig, RuleConfig
from routing.catalog import BYTES_PER_PARAM, ENGINES, GPUS, EngineEfficiency, GpuSpec
from routing.rules import Arm, Mode, Rule, Rules, Split, Weights
from routing.types import BackendProfile, ModelSpec

DEFAULT_CONTEXT = 4096
DEFAULT_CPU_MEMORY_GB = 16.0
DEFAULT_PARAMS_B = 7.0
# Exact prompt counting is for routing only (the engine counts again): beyond this size the estimate
# serves (1 MB took 2.5 s to count), and at most this many counts run in threads at once.
MAX_EXACT_PROMPT_CHARS = 256 * 1024
MAX_THREADED_COUNTS = 2


def _kv_estimate(params_b: float) -> float:
    """Bytes of KV cache per token for a grouped-query-attention model of this size (fp16):
    about 128 KiB at 8B, growing with the square root of the size (Llama 3: 8B 128 KiB, 70B 320 KiB)."""
    return float(131072 * (params_b / 8) ** 0.5)


def model_specs(loaded: LoadedConfig, ggufs: GgufCache | None = None) -> dict[str, ModelSpec]:
    """Blocking when a model has a GGUF file not yet in ``ggufs``: reads its header."""
    ggufs = ggufs or GgufCache()
    specs = {}
    for m in loaded.config.models:
        params_b, context, kv, dtype_bytes = m.params_b, m.context, m.kv_bytes_per_token, BYTES_PER_PARAM[m.dtype]
        if m.gguf is not None:
            g = ggufs.header(loaded.resolve(m.gguf))
            params_b = params_b or g.n_params / 1e9
            context = context or g.context_length
            head_dim = g.dim // g.n_heads
            kv = kv or 2 * g.n_layers * g.n_heads_kv * head_dim * 2.0
            if m.params_b is None:
                dtype_bytes = 4.0  # the GGUF tensors the in-process engines run are F32
        params_b = params_b or DEFAULT_PARAMS_B
        specs[m.name] = ModelSpec(
            name=m.name,
            params_b=params_b,
            bytes_per_param=dtype_bytes,
            context=context or DEFAULT_CONTEXT,
            kv_bytes_per_token=kv or _kv_estimate(params_b),
        )
    return specs


class PromptCounter:
    """Exact prompt tokens for a model whose tokenizer is at hand (a GGUF's): the chat rendered with the
    model's template, then tokenized, as the engine will."""

    def __init__(self, gguf: Path, ggufs: GgufCache | None = None) -> None:
        ggufs = ggufs or GgufCache()
        self._tokenizer = ggufs.tokenizer(gguf)
        self._chat = ChatRenderer(ggufs.header(gguf).vocab.chat_template)
        self._threads = 0  # counts running in threads now; touched on the event loop only

    def count(self, request: GenerationRequest) -> int:
        """Blocking: cheap for small prompts, ~1.5 ms per kB of text beyond."""
        return len(self.tokens(request))

    def tokens(self, request: GenerationRequest) -> list[int]:
        """The prompt's token ids as the engine will see them (blocking, as ``count``)."""
        if request.messages is None:
            text = request.prompt or ""
        else:  # rendered as the engines that take text render it: the tools are part of the prompt
            tools = request.tools if request.tool_choice != "none" else ()
            # Image parts are not text a template renders (engines that take them count them their way).
            messages = [text_only(m) if isinstance(m.get("content"), list) else m for m in request.messages]
            text = self._chat.render(messages, list(tools) if tools else None, request.continue_final)
        ids: list[int] = encode(self._tokenizer, text).ids
        return ids

    def count_text(self, text: str) -> int:
        """Tokens of a text as the model's tokenizer splits it (an answer the engine did not count);
        blocking, as ``count``."""
        return len(encode(self._tokenizer, text).ids)

    async def measure(self, request: GenerationRequest) -> int | None:
        """The exact count, or None where the estimate must do (``measure_tokens``)."""
        ids = await self.measure_tokens(request)
        return None if ids is None else len(ids)

    async def measure_tokens(self, request: GenerationRequest) -> list[int] | None:
        """The token ids, or None where the estimate must do: a prompt too big to count exactly, or
        one arriving while ``MAX_THREADED_COUNTS`` big ones are being counted already. Small prompts
        are counted inline, bigger ones in a thread: the event loop never tokenizes a big prompt."""
        size = prompt_chars(request)
        if size <= INLINE_PROMPT_CHARS:
            return self.tokens(request)
        if size > MAX_EXACT_PROMPT_CHARS or self._threads >= MAX_THREADED_COUNTS:
            return None
        loop = asyncio.get_running_loop()

        def work() -> list[int]:
            try:
                return self.tokens(request)
            finally:  # when the thread is done, not when a cancelled request stops waiting for it
                loop.call_soon_threadsafe(self._finished)

        self._threads += 1
        return await asyncio.to_thread(work)

    def _finished(self) -> None:
        self._threads -= 1


def prompt_counters(loaded: LoadedConfig, ggufs: GgufCache | None = None) -> dict[str, PromptCounter]:
    """Blocking: reads the models' GGUF headers and derives their tokenizers (once each with ``ggufs``)."""
    ggufs = ggufs or GgufCache()
    return {m.name: PromptCounter(loaded.resolve(m.gguf), ggufs) for m in loaded.config.models if m.gguf is not None}


def gpu_catalog(loaded: LoadedConfig) -> dict[str, GpuSpec]:
    gpus = dict(GPUS)
    for g in loaded.config.gpus:
        gpus[g.name] = GpuSpec(g.name, g.memory_gb, g.bandwidth_gbs, g.tflops)
    return gpus


def efficiencies(loaded: LoadedConfig) -> dict[str, EngineEfficiency]:
    table = dict(ENGINES)
    for engine, e in loaded.config.engine_efficiency.items():
        table[engine] = EngineEfficiency(e.prefill_mfu, e.decode_mbu, e.overhead_ms)
    return table


FORCED_CALL_PARSERS = ("hermes", "llama3_json")
"""Tool-call formats an engine that takes text can be forced into (llama.cpp in process, by grammar)."""


def capabilities(base: Capabilities, cfg: BackendConfig, model: ModelConfig) -> Capabilities:
    """What the backend honours: its adapter's declaration, adjusted by the backend's config, and
    limited by the model entry (images only for a model that takes them; tools in the prompt only
    with the model's tool-call parser; token counts the engine may not give are the gateway's
    tokenizer's for a model whose tokenizer it has)."""
    adjust = cfg.capabilities
    caps = base.adjusted(frozenset(adjust.enable), frozenset(adjust.disable))
    features = caps.features
    if not model.vision:
        features -= {IMAGES}
    if caps.tools_in_prompt and model.tool_parser is None:
        features -= {TOOLS, TOOL_CHOICE_REQUIRED, PARALLEL_TOOL_CALLS}
    if caps.tools_in_prompt and model.tool_parser not in FORCED_CALL_PARSERS:
        features -= {TOOL_CHOICE_REQUIRED}  # a forced call is a grammar of the model's call format
    counts = caps.token_counts
    if counts != "engine":
        counts = "tokenizer" if model.gguf is not None else "estimate"
    return replace(caps, features=features, tool_parser=model.tool_parser, token_counts=counts)


def profile(
    cfg: BackendConfig, loaded: LoadedConfig, context: int | None = None, caps: Capabilities | None = None
) -> BackendProfile:
    gpu = gpu_catalog(loaded)[cfg.gpu]
    if cfg.memory_gb is not None:
        memory = cfg.memory_gb
    elif gpu.name == "CPU":
        memory = DEFAULT_CPU_MEMORY_GB
    else:
        memory = gpu.memory_gb * cfg.gpu_count
    # llama.cpp in process has one worker per model: a Llama object is not thread-safe.
    concurrency = 1 if isinstance(cfg, LlamaCppConfig) else cfg.max_concurrency
    return BackendProfile(
        name=cfg.name,
        engine=cfg.engine,
        models=frozenset({cfg.model}),
        gpu=gpu,
        gpu_count=cfg.gpu_count,
        memory_gb=memory,
        efficiency=efficiencies(loaded)[cfg.engine],
        max_concurrency=concurrency,
        cost_per_hour=cfg.cost_per_hour,
        pool=cfg.pool,
        context=context,
        features=caps.features if caps is not None else frozenset(),
        extras=caps.extras if caps is not None else frozenset(),
        max_top_logprobs=caps.max_top_logprobs if caps is not None else 0,
    )


def rules(loaded: LoadedConfig) -> Rules:
    r = loaded.config.routing
    targets = {b.name for b in loaded.config.backends} | {b.pool for b in loaded.config.backends if b.pool}
    built = []
    for rc in r.rules:
        m = rc.match
        built.append(
            Rule(
                name=rc.name,
                models=tuple(m.models),
                ttft_budget_ms=(m.ttft_budget_ms.min, m.ttft_budget_ms.max),
                latency_budget_ms=(m.latency_budget_ms.min, m.latency_budget_ms.max),
                tenants=tuple(m.tenants),
                keys=tuple(m.keys),
                teams=tuple(m.teams),
                headers=tuple((k.lower(), v) for k, v in m.headers.items()),
                prefer=tuple(rc.prefer),
                avoid=tuple(rc.avoid),
                require=tuple(rc.require),
                max_attempts=rc.max_attempts,
                hedging=rc.hedging,
                mode=Mode(rc.mode) if rc.mode else None,
                default_ttft_budget_ms=rc.default_ttft_budget_ms,
                default_latency_budget_ms=rc.default_latency_budget_ms,
                split=_split(rc, targets),
            )
        )
    w = r.weights
    return Rules(
        rules=tuple(built),
        max_attempts=r.max_attempts,
        mode=Mode(r.mode),
        hedging=r.hedging,
        weights=Weights(w.budget, w.cost),
        load_bound=r.prefix.load_bound,
        max_queue_wait_ms=r.max_queue_wait_s * 1000,
        shed_ratio=r.shed_over_budget if r.shed_over_budget is not None else float("inf"),
    )


def _split(rc: RuleConfig, targets: set[str]) -> Split | None:
    """``targets``: backends' and pools' names (an arm naming one of them restricts the candidates;
    an arm naming anything else names a model, as the config's checks made sure)."""
    if not rc.split:
        return None
    arms = tuple(
        Arm(a.label, (a.to,), a.weight) if a.to in targets else Arm(a.label, (), a.weight, model=a.to) for a in rc.split
    )
    return Split(arms, rc.sticky.kind if rc.sticky is not None else "conversation")


def with_context(p: BackendProfile, context: int | None) -> BackendProfile:
    return p if context is None or context == p.context else replace(p, context=context)
