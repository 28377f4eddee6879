"""Hugging Face TGI's Messages API (``engine: tgi_messages``): OpenAI's chat route as TGI serves it.

TGI does function calling itself there (a grammar forcing one call) and streams the call's arguments
in its own pieces, which are rebuilt here into OpenAI's; a stream's last token (the end token) carries
no text but a logprob, dropped as OpenAI's engines do. The native route is ``backends.tgi``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import orjson

from backends import capabilities as cap
from backends.base import (
    BackendError,
    Chunk,
    ErrorKind,
    GenerationRequest,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from backends.capabilities import Capabilities
from backends.openai_compat import END_TEXTS, OpenAICompatBackend, message_text, parse_chunk
from backends.text import StopStrings, estimate_tokens
from backends.tgi import MAX_TOP_N_TOKENS, TgiBase, tgi_grammar, tgi_seed


@dataclass(slots=True)
class _Call:
    """One tool call of a Messages API stream while its arguments arrive."""

    arguments: str = ""
    held: str = ""
    """TGI's opening ``{``, held until what follows shows whether TGI's cut left a comma after it."""
    opened: bool = False


def _argument_piece(call: _Call, fragment: str) -> str:
    """What of ``fragment`` to stream now. TGI names the function once its JSON parses with two braces
    added, streams ``{`` in place of the token that did it, then the rest of the tokens: when that token
    closed the name's string, the next one starts with the comma that separated the name from the
    arguments (``{, "city": ...``), which is cut here."""
    if call.opened:
        call.arguments += fragment
        return fragment
    if not fragment:
        return ""
    held = call.held + fragment
    body = held.lstrip()
    if not body.startswith("{") or body[1:].strip():
        rest = body[1:].lstrip() if body.startswith("{") else ""
        if rest.startswith(","):
            held = "{" + rest[1:]
        call.opened, call.held = True, ""
        call.arguments += held
        return held
    call.held = held
    return ""


def _closing(call: _Call) -> str:
    """What a call's arguments still need at the end of the stream: what is held, and the closing brace
    when TGI sent only the opening one (a function without arguments: the name was found at the token
    that closed the call, which ChatState then streams no more of)."""
    text = call.arguments + call.held
    for tail in ("", "}"):
        try:
            orjson.loads(text + tail)
        except orjson.JSONDecodeError:
            continue
        return call.held + tail
    return call.held


def tgi_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as TGI's ``FunctionDefinition`` takes it: ``parameters`` (alias of its ``arguments``) is
    required there, optional in OpenAI's spec (a function without arguments)."""
    fn = tool.get("function") or {}
    if "parameters" in fn:
        return tool
    return tool | {"function": fn | {"parameters": {"type": "object", "properties": {}}}}


def _end_token_only(text: str, calls: tuple[ToolCallDelta, ...], logprobs: tuple[TokenLogprob, ...]) -> bool:
    """The pieces are only the end-of-turn token's log probability: TGI's chat streams give it, OpenAI
    lists only the answer's tokens."""
    return bool(logprobs) and not text and not calls and all(lp.token in END_TEXTS for lp in logprobs)


def _with_bytes(logprobs: tuple[TokenLogprob, ...]) -> tuple[TokenLogprob, ...]:
    """TGI's chat logprobs name tokens by their text only; OpenAI's also carry their UTF-8 bytes."""
    return tuple(
        replace(
            lp,
            bytes=tuple(lp.token.encode()),
            top=tuple(replace(t, bytes=tuple(t.token.encode())) for t in lp.top),
        )
        for lp in logprobs
    )


async def _without_end_logprobs(chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """A chat stream's chunks with OpenAI's log probabilities: the answer's tokens only, with bytes."""
    try:
        async for chunk in chunks:
            if not chunk.logprobs:
                yield chunk
            elif not _end_token_only(chunk.text, chunk.tool_calls, chunk.logprobs):
                yield replace(chunk, logprobs=_with_bytes(chunk.logprobs))
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()  # at once: closing the stream is how the engine learns of a cancellation


async def _refused(error: BackendError) -> AsyncIterator[Chunk]:
    """A stream that fails at once, where the engine's would (before any request is sent)."""
    raise error
    yield Chunk()  # never: this makes the function an async generator


def tgi_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """History as TGI's ``Message`` reads it: an assistant turn is text *or* tool calls (an untagged
    enum tried in that order), so an empty ``content`` beside ``tool_calls`` would hide the calls."""
    out = []
    for m in messages:
        if m.get("tool_calls") and not m.get("content"):
            m = {k: v for k, v in m.items() if k != "content"}
        out.append(m)
    return out


MESSAGES_FEATURES = frozenset(
    {
        cap.TOOLS, cap.TOOL_CHOICE_REQUIRED, cap.PARALLEL_TOOL_CALLS, cap.JSON_OBJECT, cap.JSON_SCHEMA, cap.LOGPROBS,
        cap.TOP_LOGPROBS, cap.SEED, cap.IMAGES,
    }
)  # fmt: skip


class TgiMessagesBackend(TgiBase, OpenAICompatBackend):
    """TGI's Messages API (``/v1/chat/completions``, ``/v1/completions``).

    Function calling is TGI's own: ``tools`` and ``tool_choice`` go as OpenAI sends them (TGI reads
    the same shapes), TGI forces one call with a grammar ("auto" adds a ``no_tool`` choice, after
    which TGI generates a plain answer) and streams it as ``delta.tool_calls`` pieces, mapped here to
    OpenAI's order (id and name, then argument fragments) with ``finish_reason`` "tool_calls" (TGI
    sends no finish reason after a call). One call per answer, so ``parallel_tool_calls: false``
    always holds. TGI's ``/v1/completions`` takes neither logprobs nor grammars: completion requests
    that ask for them go to the same engine's native route."""

    engine = "tgi_messages"
    capabilities: ClassVar[Capabilities] = Capabilities(features=MESSAGES_FEATURES, max_top_logprobs=MAX_TOP_N_TOKENS)
    native_extras: ClassVar[frozenset[str]] = frozenset()
    trusts_event_status = False  # TGI writes http_status_code 422 on every chat stream error
    asks_whole = False  # its tool calls and logprobs are rebuilt from its stream's own pieces (see the class)
    end_texts = END_TEXTS  # its completions stream ends with the end token's text

    def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        if request.messages is None:
            if request.logprobs or request.response_format is not None:
                return self.native(request)
        elif request.tools and request.tool_choice != "none":
            if request.response_format is not None:
                return _refused(self.both_tools_and_format())
            return self._with_tools(request)
        elif request.logprobs:
            return _without_end_logprobs(super().generate(request))
        return super().generate(request)

    async def count_prompt(self, request: GenerationRequest) -> int:
        """TGI's ``POST /chat_tokenize``: the chat request as ``generate`` sends it, templated by TGI the way
        its Messages API templates it (the tool prompt included), then tokenized."""
        if request.messages is None:
            return await self.tokenized(request, request.prompt or "")
        doc = await self.post_json(request, "/chat_tokenize", self.payload(request))
        tokens = doc.get("tokenize_response") if isinstance(doc, dict) else None
        if not isinstance(tokens, list):
            raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: /chat_tokenize answered without tokens")
        return len(tokens)

    def both_tools_and_format(self) -> BackendError:
        """TGI forces a tool call with a grammar of its own, so it refuses ``tools`` beside
        ``response_format`` ("Grammar and tools are mutually exclusive"); another backend may take both."""
        message = f"{self.name}: TGI cannot take tools and response_format together"
        return BackendError(ErrorKind.BAD_REQUEST, message, param="response_format", retryable=True)

    def engine_fields(self, request: GenerationRequest) -> dict[str, Any]:
        fields = super().engine_fields(request)
        if request.tool_choice == "none":
            # TGI renders no tools for "none"; without them a response_format is not refused as
            # "Grammar and tools are mutually exclusive".
            fields["tools"] = fields["tool_choice"] = None
        elif fields.get("tools"):
            fields["tools"] = [tgi_tool(t) for t in fields["tools"]]
        fields["parallel_tool_calls"] = fields["user"] = None  # not TGI's fields (see the class)
        fmt = fields.get("response_format")
        if fmt is not None:
            fields["response_format"] = tgi_grammar(fmt, messages_api=True)
        return fields

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        body = super().payload(request)
        if "seed" in body and body["seed"] < 0:
            body["seed"] = tgi_seed(body["seed"])
        messages = request.messages
        if messages is not None:
            for m in messages:  # a loop, not any(): this runs for every chat request
                if "tool_calls" in m:
                    body["messages"] = tgi_messages(messages)
                    break
        return body

    async def _with_tools(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """A chat stream that may be a tool call (or, after TGI's ``no_tool``, a plain answer)."""
        calls: dict[int, _Call] = {}
        finish: str | None = None
        usage: Usage | None = None
        pieces = 0
        stops = StopStrings(request.stop)
        async with self.open_stream(request, "/v1/chat/completions", self.payload(request)) as response:
            async for batch in self.json_event_batches(request, response, self.trusts_event_status):
                for doc in batch:
                    parsed = parse_chunk(doc)
                    usage = parsed.usage or usage
                    for choice in parsed.choices:
                        finish = choice.finish or finish
                        deltas = []
                        for piece in choice.tool_calls:
                            call = calls.get(piece.index)
                            if call is None:
                                call = calls[piece.index] = _Call()
                                deltas.append(ToolCallDelta(piece.index, piece.id, piece.name))
                            fragment = _argument_piece(call, piece.arguments)
                            if fragment:
                                deltas.append(ToolCallDelta(piece.index, arguments=fragment))
                        text = ""
                        if choice.text and not stops.stopped:
                            pieces += 1
                            text = stops.feed(choice.text)
                        calls_now, logprobs = tuple(deltas), choice.logprobs
                        if logprobs:
                            logprobs = () if _end_token_only(text, calls_now, logprobs) else _with_bytes(logprobs)
                        if text or calls_now or logprobs:
                            yield Chunk(text=text, tool_calls=calls_now, logprobs=logprobs)
        ends = tuple(ToolCallDelta(i, arguments=tail) for i, c in sorted(calls.items()) if (tail := _closing(c)))
        if calls:
            finish = "tool_calls"
        elif stops.stopped:
            finish = "stop"
        if finish is None:
            raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: stream ended without a finish reason")
        if usage is None:
            usage = Usage(estimate_tokens(message_text(request)), pieces, prompt_estimated=True)
        matched = stops.matched if finish == "stop" else None
        yield Chunk(
            text="" if calls else stops.flush(),
            finish_reason=finish,
            usage=usage,
            tool_calls=ends,
            stop_sequence=matched,
        )
