"""Engines that speak OpenAI's routes (vLLM, trtllm-serve, llama-server, TGI's Messages API, MII's server).

The thin path: the request goes out nearly as the client sent it (``to_payload``), always streamed,
and each SSE chunk becomes neutral pieces (``parse_chunk``) that ``generate`` turns into ``Chunk``s.

What a subclass sets (its engine's quirks, as data and one hook):

- ``capabilities``: what the engine honours (``backends.capabilities``). Only the capability fields it
  names go out; extras outside OpenAI's spec go out only when named in ``capabilities.extras`` (any
  other extra is never sent: engines such as trtllm-serve refuse unknown fields).
- ``engine_fields(request) -> dict``: the capability fields in the engine's own form. The default
  writes them as OpenAI spells them (``openai_fields``); a subclass renames or reshapes by calling
  ``super().engine_fields(request)`` and editing the dict it gets (a key set to ``None`` there is
  dropped; a key the body already has, such as ``temperature``, is replaced). It is called only
  when the request uses a capability field (``uses_fields``), so plain text requests cost what they
  always did.
- ``ask_usage``, ``usage_per_choice``, ``trusts_event_status``, ``end_texts``: see the attributes.

A subclass that builds its own body calls ``to_payload(request, served_model, capabilities,
ask_usage)``, which writes the OpenAI form of what ``capabilities`` covers; one that reads its own
stream calls ``parse_chunk(doc)`` (``ParsedChunk.choices``, each a ``ParsedChoice``, and ``usage``).

Answers: every choice of a chunk is read (``index``), with ``delta.tool_calls`` pieces, logprobs
(chat's ``logprobs.content`` and completions' ``tokens``/``token_logprobs``/``top_logprobs``), the
finish reason per choice (``tool_calls`` kept) and usage (``prompt_tokens_details.cached_tokens``,
or llama-server's ``timings.cache_n``, as ``Usage.cached_tokens``). Each choice ends with its own
finish chunk, yielded when the stream ends. Usage is on the stream's last chunk only: with ``n`` > 1
that is the finish chunk of the highest-indexed choice, and it is the whole request's usage (the
engine's one count over every choice, or the engine's per-choice counts added up); the other choices'
finish chunks carry none. Stop strings are cut per choice, except when the client asked vLLM's
``include_stop_str_in_output``: the engine then cuts and keeps the stop in the answer. An engine with
its own ``n`` (``capabilities.native_n``) must answer every choice from 0 to ``n`` - 1, each with its
finish reason: a stream that ends without one is a protocol error, never an answer with a choice
missing or left open.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

from backends import capabilities as cap
from backends.base import (
    BackendError,
    Chunk,
    ErrorKind,
    GenerationRequest,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from backends.capabilities import PLAIN, Capabilities
from backends.http_base import HttpBackend
from backends.text import StopStrings, estimate_tokens

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
) -> dict[str, Any]:
    """The engine's request body: ``fields`` are the capability fields in the engine's form (default:
    ``openai_fields``); extras go out when ``caps.extras`` names them."""
    payload: dict[str, Any] = {"model": served_model, "stream": True}
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
    if ask_usage:
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


# Not frozen: a frozen dataclass costs four times as much to make, once per streamed token.
@dataclass(slots=True)
class ParsedChoice:
    """One choice's part of a stream chunk."""

    index: int = 0
    text: str = ""
    finish: str | None = None
    stop_reason: Any = None
    """vLLM and trtllm-serve name the stop string that ended generation here."""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(slots=True)
class ParsedChunk:
    choices: list[ParsedChoice]
    usage: Usage | None = None

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


def prompt_text(req: GenerationRequest) -> str:
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
    delta = choice.get("delta")
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
    """The parts of one OpenAI stream chunk (chat or completion) that matter downstream."""
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


class _ChoiceState:
    """What ``generate`` tracks for one choice while its stream runs."""

    __slots__ = ("finish", "pieces", "stop_reason", "stops")

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = StopStrings(stops)
        self.finish: str | None = None
        self.stop_reason: Any = None
        self.pieces = 0


class OpenAICompatBackend(HttpBackend):
    """A backend for an engine's OpenAI routes; subclasses set the engine's quirks as class attributes
    and reshape capability fields in ``engine_fields``."""

    engine = "openai"
    capabilities: ClassVar[Capabilities] = PLAIN
    ask_usage: ClassVar[bool] = True
    """The engine sends usage in streams when asked (``stream_options.include_usage``)."""
    usage_per_choice: ClassVar[bool] = False
    """With ``n`` > 1 the engine reports usage once per choice (llama-server), not once for all: the
    reports are added up (completion tokens; the prompt counted once)."""
    trusts_event_status: ClassVar[bool] = True
    end_texts: ClassVar[tuple[str, ...]] = ()
    """End-of-turn texts the engine streams as if they were content; cut like stop strings."""

    def engine_fields(self, request: GenerationRequest) -> dict[str, Any]:
        """The request's capability fields in the engine's own form (called only when it uses one)."""
        return openai_fields(request, self.capabilities)

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        fields = self.engine_fields(request) if uses_fields(request) else {}
        return to_payload(request, self.settings.served_model, self.capabilities, self.ask_usage, fields)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        path = "/v1/chat/completions" if request.messages is not None else "/v1/completions"
        usage: Usage | None = None
        # Engines stop at stop strings, but some stream a stop's first tokens before they see the rest
        # (trtllm-serve), and some stream end-of-turn text (MII, TGI's completions): text that may
        # still become a stop is held back until it is clear, per choice.
        # The client asked vLLM to keep the stop string in the answer: the engine cuts, not the gateway.
        keeps_stop = bool(request.extra) and request.extra.get("include_stop_str_in_output") is True
        stop_texts = self.end_texts if keeps_stop else (*request.stop, *self.end_texts)
        states: dict[int, _ChoiceState] = {}
        expected = request.n if self.capabilities.native_n else 1
        async with self.open_stream(request, path, self.payload(request)) as response:
            async for batch in self.json_event_batches(request, response, self.trusts_event_status):
                out: list[tuple[str, int, tuple[ToolCallDelta, ...], tuple[TokenLogprob, ...]]] = []
                for doc in batch:
                    parsed = parse_chunk(doc)
                    if parsed.usage is not None:
                        usage = add_usage(usage, parsed.usage) if self.usage_per_choice else parsed.usage
                    for choice in parsed.choices:
                        index = choice.index
                        state = states.get(index)
                        if state is None:
                            state = states[index] = _ChoiceState(stop_texts)
                        state.finish = choice.finish or state.finish
                        if choice.stop_reason is not None:
                            state.stop_reason = choice.stop_reason
                        stops = state.stops
                        if stops.stopped:  # what arrived after the stop is not the answer
                            continue
                        text = ""
                        if choice.text:
                            state.pieces += 1
                            text = stops.feed(choice.text)
                        logprobs = choice.logprobs
                        if logprobs:
                            logprobs = trimmed(logprobs, request.top_logprobs)
                        if text or choice.tool_calls or logprobs:
                            out.append((text, index, choice.tool_calls, logprobs))
                last = len(out) - 1
                for i, (text, index, calls, logprobs) in enumerate(out):  # one per event, marked as arriving together
                    yield Chunk(text, None, None, i < last, index, calls, logprobs)
                if (
                    not self.ask_usage
                    and len(states) >= expected
                    and all(s.stops.stopped or s.finish is not None for s in states.values())
                ):
                    break  # nothing more worth reading: closing also stops the engine
        if not states:
            states[0] = _ChoiceState(stop_texts)
        lost = [i for i in range(expected) if i not in states] + sorted(i for i in states if not 0 <= i < expected)
        if lost:  # a choice never answered (or one never asked for): the answer is not the one asked
            what = "never answered" if lost[0] < expected else "never asked for"
            raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: choice {lost[0]} of n={expected} {what}")
        for state in states.values():
            if state.stops.stopped:
                state.finish = "stop"
            if state.finish is None:
                raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: stream ended without a finish reason")
        if usage is None:  # the engine never says: count streamed pieces (one a token), estimate the prompt
            pieces = sum(s.pieces for s in states.values())
            usage = Usage(estimate_tokens(prompt_text(request)), pieces, prompt_estimated=True)
        order = sorted(states)
        for index in order:
            state = states[index]
            # Held text that starts the stop string the engine says it stopped on is not the answer.
            reason = state.stop_reason
            named = reason if isinstance(reason, str) and reason in request.stop else None
            tail = "" if named is not None else state.stops.flush()
            matched = state.stops.matched
            if matched not in request.stop:  # an end-of-turn text, not the client's stop
                matched = named
            yield Chunk(
                text=tail,
                finish_reason=state.finish,
                usage=usage if index == order[-1] else None,
                index=index,
                stop_sequence=matched if state.finish == "stop" else None,
            )
