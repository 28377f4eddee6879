"""What an engine can honour, as data: each adapter declares it, config narrows or widens it, and the
routing sends a request only to backends that have every capability it uses.

Feature names are the ones config and explanations use. ``needs(request)`` names, for each feature a
request uses, the request parameter that asked for it, so a refusal can say which field no backend
serving the model can honour.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from backends.base import GenerationRequest

TOOLS = "tools"
"""Function calling with ``tool_choice`` "auto" or "none" (and tool-call history in messages)."""
TOOL_CHOICE_REQUIRED = "tool_choice_required"
"""``tool_choice`` "required" or a named function: the engine must force a call (constrained decoding)."""
PARALLEL_TOOL_CALLS = "parallel_tool_calls"
"""``parallel_tool_calls: false`` honoured (true is every engine's default behaviour)."""
JSON_OBJECT = "json_object"
JSON_SCHEMA = "json_schema"
LOGPROBS = "logprobs"
TOP_LOGPROBS = "top_logprobs"
PENALTIES = "penalties"
"""``presence_penalty`` and ``frequency_penalty``."""
LOGIT_BIAS = "logit_bias"
SEED = "seed"
"""Reproducible sampling for a given seed, run to run."""
IMAGES = "images"
"""``image_url`` content parts (also needs a model entry that takes images)."""
ECHO = "echo"
PREFILL = "assistant_prefill"
"""A final assistant message continued (``continue_final``): the engine renders that turn open and the
answer continues it, instead of closing it and starting a new turn."""

FEATURES = frozenset(
    {
        TOOLS, TOOL_CHOICE_REQUIRED, PARALLEL_TOOL_CALLS, JSON_OBJECT, JSON_SCHEMA, LOGPROBS, TOP_LOGPROBS,
        PENALTIES, LOGIT_BIAS, SEED, IMAGES, ECHO, PREFILL,
    }
)  # fmt: skip

# Engine-specific request fields outside OpenAI's spec that some engines understand.
KNOWN_EXTRAS = frozenset(
    {
        "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "typical_p", "length_penalty",
        "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
        "truncate_prompt_tokens", "use_beam_search", "early_stopping", "top_p_min", "truncate", "watermark",
        "top_n_tokens", "repeat_penalty", "mirostat", "mirostat_tau", "mirostat_eta", "tfs_z", "cache_prompt",
        "n_probs", "grammar", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    }
)  # fmt: skip


TokenCounts = Literal["engine", "tokenizer", "estimate"]
"""Who counts the tokens of an answer (``usage``, and so limits, budgets and spend): ``engine``, the
engine reports them; where an engine may not (``Usage.prompt_estimated``/``completion_estimated``),
``tokenizer``, the gateway counts the prompt and the answer's text with the model's tokenizer, or
``estimate``, the adapter's estimate stands (about four characters a token: the model has no tokenizer
at hand, ``models[].gguf``). Adapters declare ``engine`` or ``estimate``; the gateway makes ``estimate``
``tokenizer`` for a model whose tokenizer it has."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What one backend honours.

    ``features``: names from ``FEATURES``. ``extras``: fields outside OpenAI's spec the engine takes
    (a request carrying another one is not sent there). ``native_n``: the engine answers ``n`` > 1
    itself; otherwise the gateway asks it ``n`` times. ``tools_in_prompt``: the engine takes raw text,
    so the gateway renders tools into the prompt with the model's chat template and parses the
    model's tool calls from its text (needs the model's ``tool_parser``); an engine that takes chat
    but parses no calls (trtllm-serve without ``--tool_parser``) renders them itself, and the gateway
    parses the calls out of the text all the same. ``token_counts``: who counts an answer's tokens
    (``TokenCounts``)."""

    features: frozenset[str] = frozenset()
    extras: frozenset[str] = frozenset()
    native_n: bool = False
    tools_in_prompt: bool = False
    max_top_logprobs: int = 20
    tool_parser: str | None = None
    """How the model writes tool calls in text (set by the gateway from the model entry)."""
    token_counts: TokenCounts = "engine"

    def adjusted(self, enable: frozenset[str] = frozenset(), disable: frozenset[str] = frozenset()) -> Capabilities:
        """Widened by ``enable`` and narrowed by ``disable`` (feature or extra names, as config says)."""
        return replace(
            self,
            features=(self.features | (enable & FEATURES)) - disable,
            extras=(self.extras | (enable - FEATURES)) - disable,
        )


PLAIN = Capabilities()
"""Plain text generation and nothing else: what a backend that declares nothing is taken to do."""


def capabilities_of(backend: object) -> Capabilities:
    caps = getattr(backend, "capabilities", None)
    return caps if isinstance(caps, Capabilities) else PLAIN


def needs(request: GenerationRequest) -> dict[str, str]:
    """Each feature the request uses, with the parameter that asks for it (first one wins)."""
    out: dict[str, str] = {}
    if request.tools and request.tool_choice != "none":
        out[TOOLS] = "tools"
        if request.tool_choice == "required" or isinstance(request.tool_choice, dict):
            out[TOOL_CHOICE_REQUIRED] = "tool_choice"
        if request.parallel_tool_calls is False:
            out[PARALLEL_TOOL_CALLS] = "parallel_tool_calls"
    elif request.messages is not None and any(m.get("tool_calls") or m.get("role") == "tool" for m in request.messages):
        out[TOOLS] = "messages"  # a tool-call history: the engine must render it
    fmt = (request.response_format or {}).get("type")
    if fmt == "json_object":
        out[JSON_OBJECT] = "response_format"
    elif fmt == "json_schema":
        out[JSON_SCHEMA] = "response_format"
    if request.logprobs:
        out[LOGPROBS] = "logprobs"
        if request.top_logprobs:
            out[TOP_LOGPROBS] = "top_logprobs" if request.messages is not None else "logprobs"
    if request.presence_penalty or request.frequency_penalty:
        out[PENALTIES] = "presence_penalty" if request.presence_penalty else "frequency_penalty"
    if request.logit_bias:
        out[LOGIT_BIAS] = "logit_bias"
    if request.seed is not None and not request.greedy:
        out[SEED] = "seed"  # greedy answers are reproducible anyway
    if request.echo:
        out[ECHO] = "echo"
    if request.continue_final:
        out[PREFILL] = "messages"
    if request.messages is not None:
        for i, m in enumerate(request.messages):
            content = m.get("content")
            if isinstance(content, list) and any(p.get("type") == "image_url" for p in content):
                out[IMAGES] = f"messages[{i}].content"
                break
    return out


def missing(caps: Capabilities, wanted: dict[str, str], extras: frozenset[str]) -> list[str]:
    """What ``caps`` lacks of the request's features and extra fields (names, for an explanation)."""
    lacks = [name for name in wanted if name not in caps.features]
    lacks += sorted(extras - caps.extras)
    return lacks


def text_only(message: dict[str, Any]) -> dict[str, Any]:
    """The message with only its text parts, joined (images left out)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    return {**message, "content": "".join(p.get("text", "") for p in content if p.get("type") == "text")}


def without(request: GenerationRequest, features: list[str], extras: list[str]) -> GenerationRequest:
    """The request with the fields behind ``features`` and the ``extras`` removed (a tool-call history
    stays: it cannot be dropped without changing the conversation)."""
    changes: dict[str, Any] = {}
    for name in features:
        if name == TOOLS and request.tools:
            changes |= {"tools": (), "tool_choice": None, "parallel_tool_calls": None}
        elif name == TOOL_CHOICE_REQUIRED:
            changes["tool_choice"] = "auto"
        elif name == PARALLEL_TOOL_CALLS:
            changes["parallel_tool_calls"] = None
        elif name in (JSON_OBJECT, JSON_SCHEMA):
            changes["response_format"] = None
        elif name == LOGPROBS:
            changes |= {"logprobs": False, "top_logprobs": 0}
        elif name == TOP_LOGPROBS:
            changes["top_logprobs"] = 0
        elif name == PENALTIES:
            changes |= {"presence_penalty": None, "frequency_penalty": None}
        elif name == LOGIT_BIAS:
            changes["logit_bias"] = None
        elif name == SEED:
            changes["seed"] = None
        elif name == ECHO:
            changes["echo"] = False
        elif name == PREFILL:
            changes["continue_final"] = False
        elif name == IMAGES and request.messages is not None:
            changes["messages"] = [text_only(m) for m in request.messages]
    if extras:
        changes["extra"] = {k: v for k, v in request.extra.items() if k not in extras}
    return replace(request, **changes) if changes else request
