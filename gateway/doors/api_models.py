"""The gateway's answers as pydantic models, for its OpenAPI document (``/openapi.json``).

The documents themselves are built by the front doors (``openai_shapes``, ``responses_events``,
``anthropic_events``) without going through these models: the hot path never validates its own
output. These describe them, field for field, and ``tests/e2e/test_openapi.py`` checks real answers
against the schemas.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")


class Document(_Doc):
    """A JSON document (a route added without its own model here)."""


# OpenAI errors


class ErrorDetail(_Doc):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(_Doc):
    """OpenAI's error JSON: every error of the OpenAI routes and the admin routes."""

    error: ErrorDetail


class AnthropicErrorDetail(_Doc):
    type: str
    message: str


class AnthropicError(_Doc):
    """Anthropic's error JSON (``/v1/messages``)."""

    type: Literal["error"]
    error: AnthropicErrorDetail


# Chat and text completions


class CalledFunction(_Doc):
    name: str
    arguments: str


class ToolCallOut(_Doc):
    id: str | None
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(_Doc):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class PromptTokensDetails(_Doc):
    cached_tokens: int


class CompletionUsage(_Doc):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ChatChoice(_Doc):
    index: int
    message: ChatMessage
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class ChatCompletion(_Doc):
    """A whole chat answer (``stream: true`` sends ``chat.completion.chunk`` events instead)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage | None
    system_fingerprint: str | None = None


class TextChoice(_Doc):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class TextCompletion(_Doc):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: CompletionUsage | None


# Responses API


class OutputTextPart(_Doc):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]


class MessageOutput(_Doc):
    type: Literal["message"]
    id: str
    status: str
    role: Literal["assistant"]
    content: list[OutputTextPart]


class FunctionCallOutput(_Doc):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


class ResponseUsage(_Doc):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class ResponseObject(_Doc):
    """A Response (``stream: true`` sends its typed events: ``response.created`` ... ``response.completed``)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "failed", "in_progress"]
    error: dict[str, Any] | None
    incomplete_details: dict[str, Any] | None
    model: str
    output: list[MessageOutput | FunctionCallOutput]
    usage: ResponseUsage | None
    store: bool


# Anthropic Messages


class TextContent(_Doc):
    type: Literal["text"]
    text: str


class ToolUseContent(_Doc):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class MessageUsage(_Doc):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None


class AnthropicMessage(_Doc):
    """A Message (``stream: true`` sends ``message_start`` ... ``message_stop`` events)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[TextContent | ToolUseContent]
    stop_reason: str | None
    stop_sequence: str | None
    usage: MessageUsage


class TokenCount(_Doc):
    input_tokens: int


# Embeddings


class Embedding(_Doc):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str
    """Floats, or with ``encoding_format: base64`` the little-endian float32 bytes in base64."""


class EmbeddingUsage(_Doc):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(_Doc):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


# Models, health


class ModelCard(_Doc):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str | None = None
    """For an alias (``models[].aliases``): the model that answers requests naming it."""


class ModelList(_Doc):
    object: Literal["list"]
    data: list[ModelCard]


class Health(_Doc):
    status: Literal["ok"]


class Ready(_Doc):
    status: Literal["ready", "draining", "not_ready"]
    backends: dict[str, bool]
    reason: str | None = None
    """Why it is not ready (every backend unhealthy or behind an open circuit breaker, or draining)."""


# Admin


class ReloadResult(_Doc):
    status: Literal["reloaded", "rejected"]
    config: str
    problems: list[str] | None = None
    backends: dict[str, list[str]] | None = None
    """The backends kept, started and retired, by name."""
    diff: list[dict[str, Any]] | None = None
    """The settings changed, as ``POST /admin/config/diff`` lists them."""
    placement_errors: list[str] | None = None
    """Backends that can never serve their model (applied all the same; ``config check`` refuses them)."""


class ConfigDiffBody(_Doc):
    """The new config (or send its YAML as the body, ``content-type: application/yaml``)."""

    yaml: str
    rates: list[float] | None = None
    """Request rates to simulate, requests/s."""
    loads: list[float] | None = None
    """Multiples of the recent request rate to simulate."""


class ConfigDiff(_Doc):
    diff: list[dict[str, Any]]
    """Each setting added, removed or changed, by name."""
    summary: dict[str, Any]
    moves: dict[str, Any]
    """Routing decisions over the recent requests that move, from backend to backend."""
    table: list[dict[str, Any]]
    """The simulator's attainment, TTFT and cost under each config, per rate."""
    note: str | None = None


class BackendState(_Doc):
    engine: str
    models: list[str]
    token_counts: Literal["engine", "tokenizer", "estimate"] | None
    healthy: bool
    detail: str | None
    """Why the last probe found it unhealthy (or what it said when healthy)."""
    running: int
    waiting: int
    load_fresh: bool
    kv_cache_usage: float | None
    breaker: str
    recovery: float | None
    observed: dict[str, Any]
    in_flight: int
    prefill_backlog_tokens: int
    cached_tokens: int
    """Prompt tokens the gateway expects the engine to hold in its prefix cache."""
    cache_capacity_tokens: int | None
    exact_blocks: int | None
    """Blocks the engine holds by its own KV-cache events (vLLM with ``kv_events``), when in sync."""


class DecisionList(_Doc):
    """The last routing decisions, newest first: each as ``/admin/route/explain`` shows one, with its
    time (``at``, Unix seconds) and ``request_id``."""

    object: Literal["list"]
    data: list[dict[str, Any]]
    kept: int
    """How many the gateway keeps (``admin.recent_decisions``; 0 while the admin API is off)."""


class SplitArm(_Doc):
    arm: str
    to: str
    weight: float
    requests: int
    errors: int
    error_rate: float
    budgeted: int
    budget_missed: int
    budget_miss_rate: float
    stopped: bool
    reason: str | None


class SplitState(_Doc):
    """A rule's weighted split: its control arm, whether a guard watches it, its arms since the config was loaded."""

    control: str
    guarded: bool
    arms: list[SplitArm]


class ShadowSummary(_Doc):
    pairs: int
    """Comparisons in memory (``shadow.ring``)."""
    in_flight: int
    """Mirrored requests running now."""
    groups: list[dict[str, Any]]
    """Per (rule, primary, candidate): as ``enginegate shadow report --json``."""


class Explanation(_Doc):
    """A routing decision: the reason, the rule, and the ranked candidates with their predictions."""

    reason: str


class KeyRecord(_Doc):
    """An API key as the admin API shows it (never its secret, except once on creation as ``key``)."""

    id: str


class KeyList(_Doc):
    object: Literal["list"]
    data: list[KeyRecord]


class KeySpec(_Doc):
    """An API key's limits (``gateway/tenancy/manage.py`` validates them; see docs/keys-and-limits.md)."""


class KeyUsage(_Doc):
    id: str
    since: str
