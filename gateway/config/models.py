"""The ``models:``, ``gpus:`` and ``engine_efficiency:`` sections: what is served and what it runs on."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from gateway.strict import NAME, Frozen
from routing.fallback import CAUSES

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=NAME)]
Cause = Literal["unavailable", "overloaded", "budget", "context_window", "content_refused"]
assert set(Cause.__args__) == set(CAUSES)  # type: ignore[attr-defined]  # one list of causes


class FallbackStep(Frozen):
    model: Name
    """The model tried next."""
    when: list[Cause] = list(CAUSES)  # type: ignore[arg-type]
    """The causes it is tried for: ``unavailable`` (no healthy backend, or every one failed before
    its first token), ``overloaded`` (every backend shed it), ``budget`` (strict mode: no backend
    meets its budget), ``context_window`` (no backend holds the prompt, or the engine refused it as
    too long), ``content_refused`` (the engine refused its content); default: all."""


class ModelConfig(Frozen):
    name: Name
    """The model's name as clients send it in ``model``; backends name it in their ``model:``."""
    gguf: str | None = None
    """A llama GGUF file (relative to this config file); the in-process engines load it."""
    params_b: float | None = Field(default=None, gt=0)
    """Billions of parameters; read from the GGUF when there is one."""
    dtype: Literal[
        "fp32", "fp16", "bf16", "fp8", "int8", "int4", "awq", "gptq", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0"
    ] = "bf16"
    """The weights' number format: with ``params_b`` it gives the weights' size, which the routing
    estimates (memory, decode speed) start from."""
    context: int | None = Field(default=None, ge=1)
    """Context window in tokens (prompt plus answer); default: the GGUF's, else 4096."""
    kv_bytes_per_token: float | None = Field(default=None, gt=0)
    """KV-cache bytes per token; default: from the GGUF, else an estimate from the parameter count."""
    chat_template: str | None = None
    """Jinja chat template for engines that take raw text; default: the GGUF's, else ChatML."""
    vision: bool = False
    """The model takes images (``image_url`` content parts), on backends whose engine passes them on."""
    tool_parser: Literal["hermes", "llama3_json", "mistral"] | None = None
    """How the model writes tool calls in text: engines that take raw text (TGI native, Triton, MII
    REST, the in-process engines) serve ``tools`` for this model only with it; the gateway renders
    the tools with the chat template and parses the calls."""
    kind: Literal["generate", "embed"] = "generate"
    """What the model does: generate text (chat, completions, responses, messages) or embed it
    (``/v1/embeddings``); each kind of request goes only to models of its kind."""
    matryoshka: bool = False
    """An embedding model whose vectors keep their meaning cut to their first ``dimensions`` (then
    normalized again); without it ``dimensions`` other than the model's own size is refused."""
    price_per_mtok_in: float = Field(default=0.0, ge=0)
    """Dollars per million prompt tokens, charged to API keys' budgets (gateway/tenancy)."""
    price_per_mtok_out: float = Field(default=0.0, ge=0)
    """Dollars per million generated tokens, charged to API keys' budgets; 0: free."""
    price_per_mtok_cached: float | None = Field(default=None, ge=0)
    """Prompt tokens the engine served from its prefix cache; default: half of ``price_per_mtok_in``."""
    # Aliases and fallbacks (docs/traffic.md).
    aliases: list[Name] = []
    """Other names clients may send in ``model`` for this model (``gpt-4o-mini``, ``chat-default``);
    the answer names this model."""
    fallbacks: list[FallbackStep] = []
    """Models tried in order, before the answer's first token, when this one cannot serve a request:
    a name (tried for every cause) or ``{model, when: [causes]}``. Each step is routed afresh (its own
    budget fit, capabilities and backends); the fallbacks' own fallbacks follow."""

    @field_validator("fallbacks", mode="before")
    @classmethod
    def _named(cls, value: object) -> object:
        """A plain name is the step tried for every cause."""
        if isinstance(value, list):
            return [{"model": v} if isinstance(v, str) else v for v in value]
        return value


class GpuConfig(Frozen):
    name: Name
    """The GPU's name, as backends name it in ``gpu:`` (a name of the built-in catalog is replaced)."""
    memory_gb: float = Field(gt=0)
    """Memory of one GPU, in GB."""
    bandwidth_gbs: float = Field(gt=0)
    """Memory bandwidth of one GPU in GB/s: the decode speed estimate is proportional to it."""
    tflops: float = Field(gt=0)
    """Dense 16-bit TFLOPS of one GPU: the prefill speed estimate is proportional to it."""


class EfficiencyConfig(Frozen):
    prefill_mfu: float = Field(gt=0, le=1)
    """Share of the GPUs' TFLOPS the engine reaches in prefill (model FLOPS utilization, 0 to 1)."""
    decode_mbu: float = Field(gt=0, le=1)
    """Share of the GPUs' memory bandwidth the engine reaches in decode (model bandwidth utilization, 0 to 1)."""
    overhead_ms: float = Field(ge=0)
    """Fixed milliseconds the engine adds before a first token, on top of the queueing and prefill estimates."""
