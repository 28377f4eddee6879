"""Hugging Face TGI, on its native route or its Messages API.

Native ``/generate_stream`` quirks handled here: ``data:`` without a space, one
event per token (special tokens carry no text), ``details`` (finish reason and
token counts) on the last event, no ``[DONE]``; errors as ``{error, error_type}``,
including a 429 delivered inside a 200 stream. Parameter traps: TGI rejects
``temperature`` 0 and ``top_p`` 1.0, so greedy is ``do_sample: false`` without a
temperature and a ``top_p`` of 1 is left out. TGI keeps the stop sequence in its
text; OpenAI's clients expect it removed, so stops are also enforced here.
``/info`` gives the context limits; load comes from ``tgi_queue_size`` and
``tgi_batch_current_size``.

Capabilities, in TGI's own wire form (``tgi_grammar`` and ``TgiMessagesBackend`` say why each is
shaped as it is): structured output is TGI's grammar (``parameters.grammar`` natively,
``response_format`` in TGI's ``GrammarType`` shape on the Messages API); log probabilities are every
token's ``logprob`` with ``top_n_tokens`` alternatives (at most 5, TGI's default
``--max-top-n-tokens``); seeds are TGI's u64 ``seed``. Natively the gateway renders tools into the
prompt and parses the model's calls; the Messages API does function calling itself (a grammar
forcing one call). Not declared, because TGI does not do what OpenAI means: ``presence_penalty``
(the Messages API turns it into ``repetition_penalty = presence + 2``), ``frequency_penalty`` (TGI
divides the counts by the sequence length), ``logit_bias`` and ``n`` (accepted by the Messages API
and unused).
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
    TopLogprob,
    Usage,
)
from backends.capabilities import Capabilities
from backends.http_base import HttpBackend
from backends.openai_compat import END_TEXTS, FINISH, NO_LOGPROB, OpenAICompatBackend, parse_chunk, prompt_text
from backends.prom_text import Gauge, LoadMap
from backends.text import StopStrings, estimate_tokens

LOAD = LoadMap(running=Gauge(("tgi_batch_current_size",)), waiting=Gauge(("tgi_queue_size",)))

MAX_TOP_N_TOKENS = 5
"""TGI's default ``--max-top-n-tokens``: more alternatives per token are refused with a 422."""

# Native generation parameters a client may send as extra fields, each taking effect as TGI documents
# it. ``top_n_tokens`` is not one: its answer (``top_tokens``) is reached through ``top_logprobs``.
NATIVE_EXTRAS = frozenset({"top_k", "repetition_penalty", "typical_p", "truncate", "watermark"})


def _json_regex(depth: int) -> str:
    """A regular expression for one JSON object whose values nest at most ``depth`` levels, written in
    the syntax TGI's regex grammars share with Python and Rust (no escapes beyond ``\\``)."""
    ws = "[ ]?"
    string = r'"([^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
    number = r"-?(0|[1-9][0-9]*)([.][0-9]+)?([eE][+-]?[0-9]+)?"
    value = f"({string}|{number}|true|false|null)"
    obj = arr = ""
    for _ in range(depth + 1):
        if obj:
            value = f"({value}|{obj}|{arr})"
        member = f"{string}{ws}:{ws}{value}"
        obj = rf"\{{{ws}({member}({ws},{ws}{member})*)?{ws}\}}"
        arr = rf"\[{ws}({value}({ws},{ws}{value})*)?{ws}\]"
    return obj


JSON_OBJECT_REGEX = _json_regex(2)
"""``json_object`` as a TGI grammar. TGI's ``json`` grammar needs a schema with ``properties`` and then
allows only those keys (``{"type": "object"}`` is refused, ``{"properties": {}}`` forces ``{}``): its
``regex`` grammar is the only way to "any JSON object"."""


def tgi_grammar(response_format: dict[str, Any], messages_api: bool) -> dict[str, Any] | None:
    """OpenAI's ``response_format`` as TGI's ``GrammarType``: ``{"type": "json", "value": schema}``
    natively, ``{"type": "json_schema", "value": {name, schema}}`` on the Messages API (its mirror of
    OpenAI's form); ``strict`` needs nothing, TGI always constrains. None for plain text."""
    kind = response_format.get("type")
    if kind == "json_object":
        return {"type": "regex", "value": JSON_OBJECT_REGEX}
    if kind != "json_schema":
        return None
    spec = response_format.get("json_schema") or {}
    schema = spec.get("schema") or {}
    if not messages_api:
        return {"type": "json", "value": schema}
    value = {"schema": schema} | ({"name": spec["name"]} if spec.get("name") else {})
    return {"type": "json_schema", "value": value}


def tgi_seed(seed: int) -> int:
    """TGI's seed is a u64; OpenAI's any int64: the same 64 bits, so a seed reproduces run to run."""
    return seed % (1 << 64)


def native_payload(
    req: GenerationRequest, prompt: str, default_max_tokens: int, extras: frozenset[str] = NATIVE_EXTRAS
) -> dict[str, Any]:
    params: dict[str, Any] = {"max_new_tokens": req.max_tokens or default_max_tokens, "details": True}
    if req.greedy:
        params["do_sample"] = False
    else:
        params["do_sample"] = True
        params["temperature"] = req.temperature
        if 0 < req.top_p < 1:
            params["top_p"] = req.top_p
    if req.stop:
        params["stop"] = list(req.stop)
    if req.seed is not None:
        params["seed"] = tgi_seed(req.seed)
    if req.extra:
        params |= {k: v for k, v in req.extra.items() if k in extras}
    if req.response_format is not None:
        grammar = tgi_grammar(req.response_format, messages_api=False)
        if grammar is not None:
            params["grammar"] = grammar
    if req.logprobs and req.top_logprobs:
        params["top_n_tokens"] = req.top_logprobs  # more than TGI's maximum is its 422, never fewer silently
    return {"inputs": prompt, "parameters": params}


def native_logprob(token: dict[str, Any], top_tokens: list[dict[str, Any]] | None, top: int) -> TokenLogprob:
    """A streamed ``token`` (and its ``top_tokens``) as OpenAI's log probability entry."""
    text = str(token.get("text", ""))
    raw = token.get("logprob")
    alternatives = tuple(
        TopLogprob(
            str(t.get("text", "")),
            NO_LOGPROB if t.get("logprob") is None else float(t["logprob"]),
            tuple(str(t.get("text", "")).encode()),
        )
        for t in (top_tokens or ())[:top]
    )
    return TokenLogprob(text, NO_LOGPROB if raw is None else float(raw), tuple(text.encode()), alternatives)


class _TgiBase(HttpBackend):
    health_path = "/health"
    metrics_path = "/metrics"
    load_map = LOAD
    context_path = "/info"
    info: dict[str, Any] | None = None
    """TGI's ``/info``, read with its context (``max_total_tokens``: prompt plus new tokens)."""
    native_extras: ClassVar[frozenset[str]] = NATIVE_EXTRAS

    def read_context(self, doc: Any) -> int | None:
        self.info = doc if isinstance(doc, dict) else None
        value = (self.info or {}).get("max_total_tokens")
        return value if isinstance(value, int) else None

    async def tokenized(self, request: GenerationRequest, text: str) -> int:
        """Tokens in ``text`` by TGI's ``POST /tokenize`` (its router's tokenizer: what it counts as
        ``input_length``); the answer is a list of ``{id, text, start, stop}``."""
        doc = await self.post_json(request, "/tokenize", {"inputs": text})
        if not isinstance(doc, list):
            raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: /tokenize answered {str(doc)[:200]}, not tokens")
        return len(doc)

    async def native(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """The request on TGI's native ``/generate_stream``."""
        prompt = await self.render_prompt(request)
        stops = StopStrings(request.stop)
        details: dict[str, Any] | None = None
        want_logprobs, top = request.logprobs, request.top_logprobs
        payload = native_payload(request, prompt, self.settings.default_max_tokens, self.native_extras)
        async with self.open_stream(request, "/generate_stream", payload) as response:
            async for doc in self.json_events(request, response):
                token = doc.get("token") or {}
                if not token.get("special") and not stops.stopped:
                    text = stops.feed(str(token.get("text", "")))
                    if want_logprobs:
                        # The token's entry goes with what it let through, "" while a stop may be starting.
                        yield Chunk(text=text, logprobs=(native_logprob(token, doc.get("top_tokens"), top),))
                    elif text:
                        yield Chunk(text=text)
                if doc.get("details") is not None:
                    details = doc["details"]
                    break
        if details is None:
            raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: stream ended without details")
        raw = str(details.get("finish_reason", "eos_token"))
        usage = Usage(int(details.get("input_length") or 0), int(details.get("generated_tokens") or 0))
        yield Chunk(text=stops.flush(), finish_reason=FINISH.get(raw, raw), usage=usage, stop_sequence=stops.matched)


def image_markdown(message: dict[str, Any]) -> dict[str, Any]:
    """A message whose content parts hold images, as TGI's native route takes images: ``![](url)`` in
    the text (its router fetches them for vision models; its Messages API writes them the same way)."""
    content = message.get("content")
    if not isinstance(content, list) or all(p.get("type") == "text" for p in content):
        return message  # text parts only: the chat renderer joins them
    parts = [
        str(p.get("text", "")) if p.get("type") == "text" else f"![]({(p.get('image_url') or {}).get('url', '')})"
        for p in content
    ]
    return {**message, "content": "\n".join(parts)}


class TgiBackend(_TgiBase):
    """TGI's native ``/generate_stream``: raw text in, so tools are rendered into the prompt by the
    model's chat template and the gateway parses the calls (``tools_in_prompt``); images go in the
    text as TGI reads them (``image_markdown``)."""

    engine = "tgi"
    capabilities: ClassVar[Capabilities] = Capabilities(
        features=frozenset(
            {
                cap.TOOLS,
                cap.JSON_OBJECT,
                cap.JSON_SCHEMA,
                cap.LOGPROBS,
                cap.TOP_LOGPROBS,
                cap.SEED,
                cap.IMAGES,
                cap.PREFILL,
            }
        ),
        extras=NATIVE_EXTRAS,
        tools_in_prompt=True,
        max_top_logprobs=MAX_TOP_N_TOKENS,
    )

    def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        return self.native(request)

    async def count_prompt(self, request: GenerationRequest) -> int:
        """The prompt ``generate`` sends (chat rendered here, tools and prefill included), by TGI's tokenizer."""
        return await self.tokenized(request, await self.render_prompt(request))

    def prompt_text(self, request: GenerationRequest) -> str:
        messages = request.messages
        if messages is not None and any(type(m.get("content")) is list for m in messages):
            request = replace(request, messages=[image_markdown(m) for m in messages])
        return super().prompt_text(request)


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


class TgiMessagesBackend(_TgiBase, OpenAICompatBackend):
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
            usage = Usage(estimate_tokens(prompt_text(request)), pieces, prompt_estimated=True)
        matched = stops.matched if finish == "stop" else None
        yield Chunk(
            text="" if calls else stops.flush(),
            finish_reason=finish,
            usage=usage,
            tool_calls=ends,
            stop_sequence=matched,
        )
