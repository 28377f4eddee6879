"""Engines that speak OpenAI's routes (vLLM, trtllm-serve, llama-server, TGI's Messages API, MII's server).

The thin path: the request goes out nearly as the client sent it (``to_payload``,
filtered for engines that reject unknown fields), always streamed, and each SSE
chunk becomes a neutral ``Chunk`` (``parse_chunk``). Usage is asked for when
the engine supports it and handed on only as the final chunk's usage.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Usage
from backends.http_base import HttpBackend
from backends.text import StopStrings, estimate_tokens

# End-of-turn texts of common chat templates, for engines that stream them as text.
END_TEXTS = ("<|im_end|>", "</s>", "<|eot_id|>", "<|endoftext|>")
# Finish reasons outside OpenAI's set, as engines spell them.
FINISH = {"eos_token": "stop", "stop_sequence": "stop", "abort": "stop", "eos": "stop", "limit": "length"}


def to_payload(
    req: GenerationRequest, served_model: str, accepted_extra: frozenset[str] | None, ask_usage: bool
) -> dict[str, Any]:
    """The engine's request body. ``accepted_extra`` None passes every extra field through."""
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
    if req.seed is not None:
        payload["seed"] = req.seed
    if ask_usage:
        payload["stream_options"] = {"include_usage": True}
    for key, value in req.extra.items():
        if (accepted_extra is None or key in accepted_extra) and key not in payload:
            payload[key] = value
    return payload


@dataclass(frozen=True, slots=True)
class ParsedChunk:
    text: str = ""
    finish: str | None = None
    usage: Usage | None = None
    stop_reason: Any = None
    """vLLM and trtllm-serve name the stop string that ended generation here."""


def prompt_text(req: GenerationRequest) -> str:
    return req.prompt or "" if req.messages is None else "".join(str(m["content"]) for m in req.messages)


def parse_chunk(doc: dict[str, Any]) -> ParsedChunk:
    """The parts of one OpenAI stream chunk (chat or completion) that matter downstream."""
    text, finish, stop_reason = "", None, None
    choices = doc.get("choices") or []
    if choices:
        choice = choices[0]
        delta = choice.get("delta")
        text = (delta.get("content") if isinstance(delta, dict) else choice.get("text")) or ""
        raw = choice.get("finish_reason")
        finish = FINISH.get(raw, raw) if raw else None
        stop_reason = choice.get("stop_reason")
    usage = None
    raw_usage = doc.get("usage")
    if isinstance(raw_usage, dict) and "completion_tokens" in raw_usage:
        usage = Usage(int(raw_usage.get("prompt_tokens") or 0), int(raw_usage["completion_tokens"]))
    return ParsedChunk(text, finish, usage, stop_reason)


class OpenAICompatBackend(HttpBackend):
    """A backend for an engine's OpenAI routes; subclasses set the engine's quirks as class attributes."""

    engine = "openai"
    accepted_extra: ClassVar[frozenset[str] | None] = None
    ask_usage: ClassVar[bool] = True
    """The engine sends usage in streams when asked (``stream_options.include_usage``)."""
    trusts_event_status: ClassVar[bool] = True
    end_texts: ClassVar[tuple[str, ...]] = ()
    """End-of-turn texts the engine streams as if they were content; cut like stop strings."""

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        return to_payload(request, self.settings.served_model, self.accepted_extra, self.ask_usage)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        path = "/v1/chat/completions" if request.messages is not None else "/v1/completions"
        finish: str | None = None
        usage: Usage | None = None
        stop_reason: Any = None
        pieces = 0
        # Engines stop at stop strings, but some stream a stop's first tokens before they see the rest
        # (trtllm-serve), and some stream end-of-turn text (MII, TGI's completions): text that may
        # still become a stop is held back until it is clear.
        stops = StopStrings((*request.stop, *self.end_texts))
        async with self.open_stream(request, path, self.payload(request)) as response:
            async for batch in self.json_event_batches(request, response, self.trusts_event_status):
                texts = []
                for doc in batch:
                    chunk = parse_chunk(doc)
                    finish = chunk.finish or finish
                    usage = chunk.usage or usage
                    stop_reason = chunk.stop_reason if chunk.stop_reason is not None else stop_reason
                    if chunk.text and not stops.stopped:  # what arrived after the stop is not the answer
                        pieces += 1
                        text = stops.feed(chunk.text)
                        if text:
                            texts.append(text)
                for i, text in enumerate(texts, 1):  # one chunk per engine event, marked as arriving together
                    yield Chunk(text=text, more=i < len(texts))
                if not self.ask_usage and (stops.stopped or finish is not None):
                    break  # nothing more worth reading: closing also stops the engine
        if stops.stopped:
            finish = "stop"
        if finish is None:
            raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: stream ended without a finish reason")
        # Held text is the start of the stop string the engine says it stopped on: not part of the answer.
        tail = "" if isinstance(stop_reason, str) and stop_reason in request.stop else stops.flush()
        if usage is None:  # the engine never says: count streamed pieces, estimate the prompt
            usage = Usage(estimate_tokens(prompt_text(request)), pieces)
        yield Chunk(text=tail, finish_reason=finish, usage=usage)
