"""OpenAI's wire form, both ways, for the engines that speak it: pure functions, no I/O.

``to_payload`` writes the engine's request body from a ``GenerationRequest`` (``openai_fields``: the
capability fields ``capabilities`` covers, as OpenAI spells them; extras only when
``capabilities.extras`` names them), and ``parse_chunk`` reads one SSE chunk (chat or completion) into
neutral pieces (``ParsedChunk.choices``, each a ``ParsedChoice``, and ``usage``) that the adapter
(``backends/openai_compat.py``) turns into ``Chunk``s. Being pure, they are tested over recorded
engine payloads (``tests/data/openai_wire/``).

Answers: every choice of a chunk is read (``index``), with ``delta.tool_calls`` pieces, logprobs
(chat's ``logprobs.content`` and completions' ``tokens``/``token_logprobs``/``top_logprobs``), the
finish reason per choice (engines' own spellings mapped to OpenAI's, ``tool_calls`` kept) and usage
(``prompt_tokens_details.cached_tokens``, or llama-server's ``timings.cache_n``, as
``Usage.cached_tokens``).
"""

from __future__ import annotations

from typing import Any

from backends import capabilities as cap
from backends.base import GenerationRequest, TokenLogprob, ToolCallDelta, TopLogprob, Usage
from backends.capabilities import Capabilities

# End-of-turn texts of common chat templates, for engines that stream them as text.
END_TEXTS = ("<|im_end|>", "</s>", "<|eot_id|>", "<|endoftext|>")
# Finish reasons outside OpenAI's set, as engines spell them.
FINISH = {"eos_token": "stop", "stop_sequence": "stop", "abort": "stop", "eos": "stop", "limit": "length"}
# OpenAI's stand-in for a log probability it does not give (a completion's echoed first prompt token).
NO_LOGPROB = -9999.0


def uses_fields(req: GenerationRequest) -> bool:
    """Whether the request sets any capability field (the plain text path skips them all)."""
    return bool(
        req.tools
        or req.response_format
        or req.logprobs
        or req.n != 1
        or req.presence_penalty is not None
        or req.frequency_penalty is not None
        or req.logit_bias
        or req.user is not None
        or req.echo
        or req.tool_choice is not None
        or req.parallel_tool_calls is not None
        or req.continue_final
    )


def openai_fields(req: GenerationRequest, caps: Capabilities) -> dict[str, Any]:
    """The request's capability fields that ``caps`` covers, as OpenAI spells them."""
    features = caps.features
    out: dict[str, Any] = {}
    if req.tools and cap.TOOLS in features:
        out["tools"] = list(req.tools)
        choice = req.tool_choice
        if choice is not None and (choice in ("auto", "none") or cap.TOOL_CHOICE_REQUIRED in features):
            out["tool_choice"] = choice
        if req.parallel_tool_calls is not None and cap.PARALLEL_TOOL_CALLS in features:
            out["parallel_tool_calls"] = req.parallel_tool_calls
    fmt = req.response_format
    if fmt is not None and fmt.get("type") in features:  # json_object, json_schema: feature names
        out["response_format"] = fmt
    if req.logprobs and cap.LOGPROBS in features:
        top = req.top_logprobs if cap.TOP_LOGPROBS in features else 0
        if req.messages is not None:
            out["logprobs"] = True
            if top:
                out["top_logprobs"] = top
        else:
            out["logprobs"] = top  # completions: one integer, the alternatives per token
    if req.n != 1 and caps.native_n:
        out["n"] = req.n
    if cap.PENALTIES in features:
        if req.presence_penalty is not None:
            out["presence_penalty"] = req.presence_penalty
        if req.frequency_penalty is not None:
            out["frequency_penalty"] = req.frequency_penalty
    if req.logit_bias and cap.LOGIT_BIAS in features:
        out["logit_bias"] = {str(token): bias for token, bias in req.logit_bias.items()}  # JSON keys are strings
    if req.user is not None:
        out["user"] = req.user  # no effect on generation; engines that refuse it drop it in engine_fields
    if req.echo and req.messages is None and cap.ECHO in features:
        out["echo"] = True
    return out


def to_payload(
    req: GenerationRequest,
    served_model: str,
    caps: Capabilities,
    ask_usage: bool,
    fields: dict[str, Any] | None = None,
    stream: bool = True,
) -> dict[str, Any]:
    """The engine's request body: ``fields`` are the capability fields in the engine's form (default:
    ``openai_fields``); extras go out when ``caps.extras`` names them. ``stream`` False asks for one
    whole answer (read by ``parse_whole``)."""
    payload: dict[str, Any] = {"model": served_model, "stream": stream}
    if req.messages is not None:
        payload["messages"] = req.messages
    else:
        payload["prompt"] = req.prompt
    if req.max_tokens is not None:
        payload["max_tokens"] = req.max_tokens
    payload["temperature"] = req.temperature
    if req.top_p != 1.0:
        payload["top_p"] = req.top_p
    if req.stop:
        payload["stop"] = list(req.stop)
    if req.seed is not None and cap.SEED in caps.features:
        payload["seed"] = req.seed
    if ask_usage and stream:  # whole answers always carry usage (and some engines refuse the option there)
        payload["stream_options"] = {"include_usage": True}
    if fields is None and uses_fields(req):
        fields = openai_fields(req, caps)
    if fields:
        for key, value in fields.items():
            if value is not None:
                payload[key] = value
    if req.extra:
        extras = caps.extras
        for key, value in req.extra.items():
            if key in extras and key not in payload:
                payload[key] = value
    return payload


# Plain classes, not dataclasses: made once per streamed token, and a dataclass's generated ``__init__``
# stays interpreted in the compiled module (built natively, half the cost: 107 against 199 ns).
class ParsedChoice:
    """One choice's part of a stream chunk."""

    __slots__ = ("finish", "index", "logprobs", "stop_reason", "text", "tool_calls")

    def __init__(
        self,
        index: int = 0,
        text: str = "",
        finish: str | None = None,
        stop_reason: Any = None,
        tool_calls: tuple[ToolCallDelta, ...] = (),
        logprobs: tuple[TokenLogprob, ...] = (),
    ) -> None:
        self.index = index
        self.text = text
        self.finish = finish
        self.stop_reason = stop_reason
        """vLLM and trtllm-serve name the stop string that ended generation here."""
        self.tool_calls = tool_calls
        self.logprobs = logprobs


class ParsedChunk:
    __slots__ = ("choices", "usage")

    def __init__(self, choices: list[ParsedChoice], usage: Usage | None = None) -> None:
        self.choices = choices
        self.usage = usage

    # The first choice's parts, for callers that read single-choice streams.
    @property
    def text(self) -> str:
        return self.choices[0].text if self.choices else ""

    @property
    def finish(self) -> str | None:
        return self.choices[0].finish if self.choices else None

    @property
    def stop_reason(self) -> Any:
        return self.choices[0].stop_reason if self.choices else None


def message_text(req: GenerationRequest) -> str:
    """The request's text joined, unrendered (no template, no tools): what a rough token estimate
    counts when the engine reports no prompt count. (``prompt_text`` of an adapter is the rendered
    prompt an engine that takes raw text receives.)"""
    if req.messages is None:
        return req.prompt or ""
    return "".join(str(m.get("content") or "") for m in req.messages)


def _tool_calls(raw: list[Any]) -> tuple[ToolCallDelta, ...]:
    out = []
    for i, call in enumerate(raw):
        fn = call.get("function") or {}
        index = call.get("index")
        out.append(
            ToolCallDelta(
                index=i if index is None else int(index),
                id=call.get("id") or None,
                name=fn.get("name") or None,
                arguments=fn.get("arguments") or "",
            )
        )
    return tuple(out)


def _bytes(raw: Any) -> tuple[int, ...] | None:
    return tuple(raw) if isinstance(raw, list) else None


def _logprob(raw: Any) -> float:
    return NO_LOGPROB if raw is None else float(raw)


def _logprobs(raw: dict[str, Any]) -> tuple[TokenLogprob, ...]:
    """Chat's ``{content: [{token, logprob, bytes, top_logprobs}]}`` or completions' parallel lists."""
    content = raw.get("content")
    if content is not None:
        return tuple(
            TokenLogprob(
                str(t.get("token", "")),
                _logprob(t.get("logprob")),
                _bytes(t.get("bytes")),
                tuple(
                    TopLogprob(str(a.get("token", "")), _logprob(a.get("logprob")), _bytes(a.get("bytes")))
                    for a in t.get("top_logprobs") or ()
                ),
            )
            for t in content
        )
    tokens = raw.get("tokens") or []
    values = raw.get("token_logprobs") or []
    tops = raw.get("top_logprobs") or []
    return tuple(
        TokenLogprob(
            str(token),
            _logprob(values[i] if i < len(values) else None),
            None,
            tuple(TopLogprob(str(t), _logprob(lp)) for t, lp in (tops[i] or {}).items()) if i < len(tops) else (),
        )
        for i, token in enumerate(tokens)
    )


def _usage(raw: dict[str, Any], timings: Any) -> Usage:
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None and isinstance(timings, dict):
        cached = timings.get("cache_n")  # llama-server: prompt tokens reused from the slot's cache
    return Usage(
        int(raw.get("prompt_tokens") or 0),
        int(raw["completion_tokens"]),
        None if cached is None else int(cached),
    )


def parse_choice(choice: dict[str, Any]) -> ParsedChoice:
    """One choice of a stream chunk (``delta``) or of a whole answer (``message``; completions' ``text``
    either way): a whole answer's choice is its one and only piece."""
    delta = choice.get("delta")
    if delta is None:
        delta = choice.get("message")
    tool_calls: tuple[ToolCallDelta, ...] = ()
    if isinstance(delta, dict):
        text = delta.get("content") or ""
        raw_calls = delta.get("tool_calls")
        if raw_calls:
            tool_calls = _tool_calls(raw_calls)
    else:
        text = choice.get("text") or ""
    raw = choice.get("finish_reason")
    raw_lp = choice.get("logprobs")
    return ParsedChoice(
        choice.get("index") or 0,
        text,
        FINISH.get(raw, raw) if raw else None,
        choice.get("stop_reason"),
        tool_calls,
        _logprobs(raw_lp) if isinstance(raw_lp, dict) else (),
    )


def parse_chunk(doc: dict[str, Any]) -> ParsedChunk:
    """The parts of one OpenAI stream chunk or whole answer (chat or completion) that matter downstream."""
    choices = doc.get("choices")
    parsed = [parse_choice(c) for c in choices] if choices else []
    raw_usage = doc.get("usage")
    usage = None
    if isinstance(raw_usage, dict) and "completion_tokens" in raw_usage:
        usage = _usage(raw_usage, doc.get("timings"))
    return ParsedChunk(parsed, usage)


def trimmed(logprobs: tuple[TokenLogprob, ...], top: int) -> tuple[TokenLogprob, ...]:
    """At most ``top`` alternatives per token: some engines list more than asked (llama-server lists
    them when none were asked for)."""
    if all(len(t.top) <= top for t in logprobs):
        return logprobs
    return tuple(TokenLogprob(t.token, t.logprob, t.bytes, t.top[:top]) for t in logprobs)


def add_usage(before: Usage | None, report: Usage) -> Usage:
    """One choice's usage report added to the ones before (same prompt, so it counts once)."""
    if before is None:
        return report
    return Usage(before.prompt_tokens, before.completion_tokens + report.completion_tokens, before.cached_tokens)
