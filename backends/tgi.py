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
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Health, Usage
from backends.http_base import HttpBackend
from backends.openai_compat import END_TEXTS, FINISH, OpenAICompatBackend
from backends.prom_text import Gauge, LoadMap
from backends.text import StopStrings

LOAD = LoadMap(running=Gauge(("tgi_batch_current_size",)), waiting=Gauge(("tgi_queue_size",)))

# Native generation parameters a client may send as extra fields.
NATIVE_EXTRA = frozenset({"top_k", "repetition_penalty", "frequency_penalty", "typical_p", "truncate", "watermark"})
# Messages API fields beyond the ones to_payload writes itself.
MESSAGES_EXTRA = frozenset(
    {"frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "top_logprobs", "n", "response_format"}
)


def native_payload(req: GenerationRequest, prompt: str, default_max_tokens: int) -> dict[str, Any]:
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
        params["seed"] = req.seed
    params |= {k: v for k, v in req.extra.items() if k in NATIVE_EXTRA}
    return {"inputs": prompt, "parameters": params}


class _TgiHealth(HttpBackend):
    health_path = "/health"
    metrics_path = "/metrics"
    load_map = LOAD
    info: dict[str, Any] | None = None

    async def health(self) -> Health:
        health = await super().health()
        if health.ok and self.info is None:
            try:
                status, body = await self.probe("/info")
                self.info = orjson.loads(body) if status == 200 else None
            except (OSError, orjson.JSONDecodeError):
                self.info = None
        return health

    @property
    def context_length(self) -> int | None:
        value = (self.info or {}).get("max_total_tokens")
        return int(value) if isinstance(value, int) else None


class TgiBackend(_TgiHealth):
    """TGI's native ``/generate_stream``."""

    engine = "tgi"

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt = await self.render_prompt(request)
        stops = StopStrings(request.stop)
        details: dict[str, Any] | None = None
        async with self.open_stream(
            request, "/generate_stream", native_payload(request, prompt, self.settings.default_max_tokens)
        ) as response:
            async for doc in self.json_events(request, response):
                token = doc.get("token") or {}
                if not token.get("special") and not stops.stopped:
                    text = stops.feed(str(token.get("text", "")))
                    if text:
                        yield Chunk(text=text)
                if doc.get("details") is not None:
                    details = doc["details"]
                    break
        if details is None:
            raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: stream ended without details")
        raw = str(details.get("finish_reason", "eos_token"))
        usage = Usage(int(details.get("input_length") or 0), int(details.get("generated_tokens") or 0))
        yield Chunk(text=stops.flush(), finish_reason=FINISH.get(raw, raw), usage=usage)


class TgiMessagesBackend(_TgiHealth, OpenAICompatBackend):
    """TGI's Messages API (``/v1/chat/completions``, ``/v1/completions``)."""

    engine = "tgi_messages"
    accepted_extra = MESSAGES_EXTRA
    trusts_event_status = False  # TGI writes http_status_code 422 on every chat stream error
    end_texts = END_TEXTS  # its completions stream ends with the end token's text
