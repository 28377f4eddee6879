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

Capabilities, in TGI's own wire form (``tgi_grammar`` and ``backends.tgi_messages`` say why each is
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
from dataclasses import replace
from typing import Any, ClassVar

from backends import capabilities as cap
from backends.base import (
    BackendError,
    Chunk,
    ErrorKind,
    GenerationRequest,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from backends.capabilities import Capabilities
from backends.http_base import HttpBackend
from backends.openai_compat import FINISH, NO_LOGPROB
from backends.prom_text import Gauge, LoadMap
from backends.text import StopStrings

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


class TgiBase(HttpBackend):
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


class TgiBackend(TgiBase):
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
