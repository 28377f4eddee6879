"""Contract fake of ``trtllm-serve``, TensorRT-LLM's OpenAI-compatible server (TensorRT-LLM 1.x, 2026 main).

Behaviour read from tensorrt_llm/serve/openai_server.py, openai_protocol.py, postprocess_handlers.py and
executor/base_worker.py (not copied) and /work/shared/reference/tensorrt-llm/examples.json; text is the TinyEngine's.

Reproduced:
- Request models are pydantic with extra="forbid": any validation failure is 400 ``{"error": str(errors)}``,
  errors FastAPI-style (loc prefixed with "body"). Handler errors are the flat ``{"object":"error","message":..,
  "type":"BadRequestError","param":null,"code":400}``; every exception inside chat/completions becomes that 400.
- The request's ``model`` is never checked: any name is served and echoed back.
- Prompt too long (pytorch backend, max_num_tokens 8192, max_seq_len = create_app's ``max_seq_len``, default
  engine.context_length): the ``max_num_tokens`` and ``default_max_tokens`` ValueErrors as 400; a max_tokens
  above the room left is clamped. With create_app's ``backend="tensorrt"`` (an engine built with TensorRT)
  ``_check_arguments`` refuses prompt + max_tokens beyond max_seq_len first: 400 "The sum of prompt length
  (P.0) and query length (0) max_tokens (M) should not exceed max_seq_len (S)". /v1/models says nothing of it.
- temperature and top_p default to 1.0 (so the default is sampling); temperature 0 or top_k 1 is greedy.
- Streaming chat: role chunk (written ``data: {...} \\n\\n``, stray space included), one chunk per token carrying
  ``"reasoning_content":""``, finish_reason (+ stop_reason) on the last token's chunk. ``stream_options`` defaults
  include_usage *and* continuous_usage_stats to true, so usage rides on every chunk, then a usage chunk with
  ``choices: []``, then ``data: [DONE]``. Stream ids are ``chatcmpl-<request id>``/``cmpl-<request id>``.
- Stop strings are cut unless include_stop_str_in_output (stop_reason names them); the end token is neither
  shown nor counted in completion_tokens.
- /health (200 empty, 503 text), /version, /v1/models, /metrics (iteration stats, drained on read, one per token),
  /prometheus/metrics as with return_perf_metrics (labels model_name/engine_type "undefined"), from live state.
- A client disconnect stops generation (streaming and not).

FakeControl.fail_next names:
- "overloaded": trtllm-serve has no overload status; the executor's queue-full error (max_queue_size set) reaches
  the client as every handler exception does: 400 BadRequestError "Maximum queue size of 64 has been reached...".
- "internal": 500 flat body of type "InternalServerError", the shape trtllm-serve gives its 500s (its chat and
  completion handlers themselves answer engine exceptions with 400, see "midstream").
- "midstream": three tokens, then the engine fails. Streaming: the real server logs and re-raises inside the SSE
  generator, so the connection drops with no error event and no [DONE]; the fake does the same. Non-streaming:
  400 BadRequestError carrying the engine's message.
- "lost_choice": not a failure trtllm-serve is known for, a test of the adapter's ``n`` check: a streamed
  request with ``n`` > 1 runs every sequence, but the last choice's chunks never come (nor its finish); a
  whole answer leaves the last choice out of its ``choices``.
Also the generic faults of control.py. control.delay_s, and waiting for one of control.max_running slots, are
spent queued (counted as waiting). healthy False, or loading True (trtllm-serve only opens
its port once loaded), fails /health; generation is unaffected.

Guessed: the version string; the texts of injected engine errors (real C++ ones also end with file:line);
that the prompt-length errors come before the stream starts (with the executor in another process they may
surface inside it); iteration-stat fields beyond the reference example; KV geometry (32-token blocks, room
for 64 full sequences). Not supported here: prompt_token_ids, token-id prompts, min_tokens.

Capability fields (read from openai_protocol.py, postprocess_handlers.py, openai_server.py and
tool_parser/qwen3_tool_parser.py of TensorRT-LLM main, 2026; not copied). Every body POSTed to the generate
routes is appended to ``received`` (create_app's), as parsed JSON, for tests to assert on. Reproduced:
- ``tools`` ({type: "function", function: {name, description, parameters, strict}}, strict models),
  ``tool_choice`` "none"/"auto"/"required"/named (default "auto" when tools are given; anything but
  "none"/"auto" without tools is "When using `tool_choice`, `tools` must be set."), ``parallel_tool_calls``
  accepted and not enforced. The prompt is rendered with the tools. With a tool parser (create_app's
  ``tool_parser``, the ``--tool_parser`` flag; "qwen3" here: Hermes-style ``<tool_call>\n{json}\n</tool_call>``)
  and tools in the request, calls are parsed out of the text: non-streaming ``message.tool_calls`` [{id
  "chatcmpl-tool-<hex>", type, function {name, arguments (JSON string)}}] with ``content`` the text before
  the first call; streaming ``delta.tool_calls`` pieces, the first with id, type, index and name
  (arguments ""), the next with the arguments; finish_reason "tool_calls" where the model stopped after a
  call. ``tool_choice: "none"`` still strips the markup but reports no call. Without a parser (None) the
  markup stays in the content. A named tool_choice labels the whole text as that function's arguments
  (no id in stream pieces, the name repeated on each): nothing forces the model (not constrained).
- ``response_format`` types text/json/json_schema/json_object/regex/ebnf/structural_tag; json_schema needs
  ``json_schema`` (its ``schema`` member is used), json needs ``schema``. Without a guided decoding backend
  (create_app's ``guided_decoding_backend`` None) any constraint is 400 "Guided decoding is not enabled for
  this server" (guessed wording, as reported by users). The TinyEngine cannot constrain: tests script the
  answer (``TinyEngine.scripted``).
- ``logprobs``/``top_logprobs`` (chat; PyTorch backend): ``choice.logprobs = {"content": [{token, logprob,
  bytes, top_logprobs}]}`` per chunk (the chunk's tokens), token texts decoded one token alone (a
  SentencePiece tokenizer loses the word-leading space), top_logprobs only when asked: the top k plus the
  sampled token when it is not among them, best first. top_logprobs (even 0) without logprobs is 400.
  Completions: integer ``logprobs`` k (0 means none: the server reads it as a truth value) gives
  ``{text_offset, token_logprobs, tokens, top_logprobs: [{token: logprob}]}``. Values are the demo
  model's own (``TinyEngine.alternatives``).
- ``n``: n sequences of one request, choices by ``index`` (streamed interleaved, one choice per chunk), usage
  summed; ``logit_bias`` keys must be token ids in [0, vocab) and values finite in [-100, 100] (else 400 with
  trtllm-serve's messages), recorded but not applied (the TinyEngine has no logit processor); ``seed`` and
  penalties are recorded only (the TinyEngine's sampler cannot be seeded or penalised); ``image_url`` content
  parts are accepted as a multimodal model's server takes them, and the text parts alone reach the TinyEngine.
Guessed: the exact chunking of streamed tool-call arguments (the real parser sends the name as soon as it is
parsed, then argument fragments as the partial JSON grows; here name, then the arguments whole, both when the
call's closing tag arrives); the logprobs limit (not checked).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.contract.control import FakeControl, with_faults
from tests.contract.tiny_engine import TinyEngine, Token

T = TypeVar("T")
MAX_NUM_TOKENS, MAX_ACTIVE, TOKENS_PER_BLOCK = 8192, 64, 32
QUEUE_FULL = "Maximum queue size of 64 has been reached, please try again later"
LABELS = {"model_name": "undefined", "engine_type": "undefined"}
_SLOW = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0)
BUCKETS = {
    "trtllm_e2e_request_latency_seconds": (*_SLOW, 1920.0, 7680.0),
    "trtllm_request_queue_time_seconds": (*_SLOW, 1920.0, 7680.0),
    "trtllm_time_to_first_token_seconds": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0),
    "trtllm_time_per_output_token_seconds": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StreamOptions(_Strict):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = True


class ResponseFormat(_Strict):
    type: Literal["text", "json", "json_schema", "json_object", "regex", "ebnf", "structural_tag"]
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    json_schema: dict[str, Any] | None = None
    regex: str | None = None
    ebnf: str | None = None
    format: dict[str, Any] | None = None


class FunctionDefinition(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    function: NamedFunction
    type: Literal["function"] = "function"


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


_LIST: Any = Field(default_factory=list)
# fmt: off
_SAMPLING: dict[str, Any] = {  # OpenAI fields, then trtllm_serve_chat_extra_sampling_fields
    "model": (str, ...), "frequency_penalty": (float | None, 0.0), "logit_bias": (dict[str, float] | None, None),
    "n": (int, 1), "presence_penalty": (float | None, 0.0), "seed": (int | None, None),
    "stop": (str | list[str] | None, _LIST), "stream": (bool | None, False),
    "stream_options": (StreamOptions | None, None), "temperature": (float | None, None), "top_p": (float | None, None),
    "user": (str | None, None), "response_format": (ResponseFormat | None, None),
    "lora_request": (dict[str, Any] | None, None), "disaggregated_params": (dict[str, Any] | None, None),
    "best_of": (int | None, None), "use_beam_search": (bool, False), "top_k": (int, 0), "top_p_min": (float, 0.0),
    "min_p": (float, 0.0), "repetition_penalty": (float, 1.0), "length_penalty": (float | None, None),
    "early_stopping": (bool | None, None), "stop_token_ids": (list[int] | None, _LIST),
    "include_stop_str_in_output": (bool, False), "ignore_eos": (bool, False), "min_tokens": (int, 0),
    "skip_special_tokens": (bool, True), "spaces_between_special_tokens": (bool, True),
    "truncate_prompt_tokens": (int | None, Field(default=None, ge=1)),
}
_CHAT: dict[str, Any] = {
    "messages": (list[Message], ...), "prompt_token_ids": (list[int] | None, None), "logprobs": (bool | None, False),
    "top_logprobs": (int | None, 0), "max_completion_tokens": (int | None, Field(None, validation_alias="max_tokens")),
    "tools": (list[Tool] | None, None),
    "tool_choice": (Literal["none", "auto", "required"] | NamedToolChoice | None, "none"),
    "parallel_tool_calls": (bool | None, None),
    "reasoning_effort": (Literal["low", "medium", "high"] | None, "low"), "echo": (bool, False),
    "add_generation_prompt": (bool, True), "add_special_tokens": (bool, False),
    "documents": (list[dict[str, str]] | None, None), "chat_template": (str | None, None),
    "chat_template_kwargs": (dict[str, Any] | None, None), "cache_salt": (str | None, None),
}
_COMPLETION: dict[str, Any] = {
    "prompt": (list[int] | list[list[int]] | str | list[str], ...), "echo": (bool | None, False),
    "logprobs": (int | None, None), "max_tokens": (int | None, None), "suffix": (str | None, None),
    "add_special_tokens": (bool, True), "return_context_logits": (bool, False), "detokenize": (bool, True),
}
_CHAT_CHECKS = [
    (lambda d: d.get("stream_options") is not None and not d.get("stream"),
     "stream_options can only be set if stream is true"),
    (lambda d: d.get("tool_choice", "none") != "none" and not d.get("tools"),
     "When using `tool_choice`, `tools` must be set."),
    (lambda d: d.get("top_logprobs") is not None and not d.get("logprobs"),
     "logprobs must be true when using top_logprobs"),
]
_COMPLETION_CHECKS = [
    (lambda d: bool(d.get("stream_options")) and not d.get("stream"),
     "Stream options can only be defined when stream is true."),
    (lambda d: bool(d.get("suffix")), "suffix is not supported"),
]
# fmt: on


def _request_model(name: str, fields: dict[str, Any], checks: list[Any]) -> type[BaseModel]:
    def checked(cls: type[BaseModel], data: Any) -> Any:
        if isinstance(data, dict) and "messages" in fields and "tool_choice" not in data and data.get("tools"):
            data = {**data, "tool_choice": "auto"}  # check_tool_choice: tools given, no choice: "auto"
        for failed, message in checks if isinstance(data, dict) else []:
            if failed(data):
                raise ValueError(message)
        return data

    validators: dict[str, Any] = {"checks": model_validator(mode="before")(checked)}
    return create_model(name, __base__=_Strict, __validators__=validators, **{**_SAMPLING, **fields})


ChatCompletionRequest = _request_model("ChatCompletionRequest", _CHAT, _CHAT_CHECKS)
CompletionRequest = _request_model("CompletionRequest", _COMPLETION, _COMPLETION_CHECKS)


class EngineFailure(Exception):
    """An exception in a handler (400) or, once streaming, inside the SSE generator (dropped connection)."""


@dataclass
class _Job:
    rid: int
    prompt: str
    prompt_tokens: int
    max_tokens: int
    greedy: bool
    temperature: float
    top_p: float
    ignore_eos: bool
    stops: list[str]
    stop_ids: set[int]
    include_stop: bool
    fail_after: int | None = None
    index: int = 0
    """The choice this sequence answers (``n``)."""


@dataclass
class _Step:
    delta: str
    tokens: int
    text: str = ""
    finish: str | None = None
    reason: str | int | None = None
    ids: list[int] = field(default_factory=list)
    """The token generated at this step (none on a final step that only ends the sequence)."""
    logprobs: list[float] = field(default_factory=list)


@dataclass
class _Live:
    prompt: int
    generated: int = 0
    arrival: float = field(default_factory=time.monotonic)
    start: float = 0.0
    first: float | None = None


def _error(message: str, kind: str = "BadRequestError", code: int = 400) -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": kind, "param": None, "code": code}, code)


def _sse(obj: Any, end: str = "\n\n") -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}{end}"


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    counts = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    return counts | {"prompt_tokens_details": {"cached_tokens": 0}}


def _family(name: str, kind: str, doc: str, samples: Sequence[tuple[str, dict[str, str], float]]) -> list[str]:
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
    for sample, labels, value in samples:
        pairs = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{sample}{{{pairs}}} {float(value)!r}")
    return lines


def _find_stop(text: str, stops: list[str], start: int) -> tuple[int, str] | None:
    hits = [(i, s) for s in stops if s and (i := text.find(s, max(0, start - len(s) + 1))) >= 0]
    return min(hits) if hits else None


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Runs ``work``; cancels it (closing the engine stream) if the client goes away first. Shared with fake_triton."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return None if task.cancelled() else task.result()


class EventStream(StreamingResponse):
    """Starlette stops iterating on disconnect without closing the iterator; this closes it (and the engine)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


TOOL_START, TOOL_END = "<tool_call>\n", "\n</tool_call>"


def _call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def _parsed_call(block: str, names: set[str]) -> tuple[str, str] | None:
    """A call block's (name, arguments as a JSON string); None where the parser skips it (not JSON, no
    such tool)."""
    try:
        call = json.loads(block.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or call.get("name") not in names:
        return None
    return str(call["name"]), json.dumps(call.get("arguments", call.get("parameters", {})), ensure_ascii=False)


def parse_calls(text: str, names: set[str]) -> tuple[str, list[dict[str, Any]]]:
    """The qwen3 parser on a whole answer: the text before the first call, and the calls."""
    start = text.find(TOOL_START)
    if start < 0:
        return text, []
    calls = []
    for block in re.findall(re.escape(TOOL_START) + "(.*?)" + re.escape(TOOL_END), text, re.DOTALL):
        if (parsed := _parsed_call(block, names)) is not None:
            calls.append(
                {"id": _call_id(), "type": "function", "function": {"name": parsed[0], "arguments": parsed[1]}}
            )
    return text[:start].strip(), calls


def _partial(text: str, token: str) -> int:
    """How many last characters of ``text`` begin ``token`` (the part that may still become it)."""
    for k in range(min(len(token) - 1, len(text)), 0, -1):
        if text.endswith(token[:k]):
            return k
    return 0


class ToolStream:
    """The qwen3 parser on a stream: text before a call streams as content, held while it may begin a
    call's tag; a call's pieces come when its closing tag arrives; whitespace after a call is the
    separator, never content."""

    def __init__(self, names: set[str]) -> None:
        self.names, self.buf, self.calls = names, "", 0

    def feed(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        self.buf += text
        content, pieces = "", []
        while (start := self.buf.find(TOOL_START)) >= 0:
            end = self.buf.find(TOOL_END, start + len(TOOL_START))
            if end < 0:
                break
            content += self.buf[:start]
            parsed = _parsed_call(self.buf[start + len(TOOL_START) : end], self.names)
            self.buf = self.buf[end + len(TOOL_END) :]
            if parsed is not None:
                head = {"id": _call_id(), "type": "function", "index": self.calls}
                pieces.append(head | {"function": {"name": parsed[0], "arguments": ""}})
                pieces.append({"type": "function", "index": self.calls, "function": {"arguments": parsed[1]}})
                self.calls += 1
        start = self.buf.find(TOOL_START)
        if start < 0 and not final:
            start = len(self.buf) - _partial(self.buf, TOOL_START)
        if start < 0 or final:
            content, self.buf = content + self.buf, ""
        else:
            content, self.buf = content + self.buf[:start], self.buf[start:]
        return ("" if self.calls and not content.strip() else content), pieces


class _Output:
    """One choice's answer as the server post-processes it: tool calls parsed out, logprobs attached."""

    def __init__(self, server: _Server, req: Any, chat: bool, job: _Job) -> None:
        self.server, self.job, self.chat, self.ids = server, job, chat, cast(list[int], [])
        self.text_len, self.has_call, self.echo = 0, False, not chat and bool(req.echo)
        tools = getattr(req, "tools", None) if chat else None
        choice = getattr(req, "tool_choice", None)
        self.named = choice.function.name if isinstance(choice, NamedToolChoice) else None
        self.no_calls = choice == "none"
        self.names = {t.function.name for t in tools or []}
        self.parser = ToolStream(self.names) if tools and server.tool_parser and self.named is None else None
        # The top k come from the sampler's logprobs=k (chat asks 1 unless top_logprobs): k = 0 is none.
        self.k = (req.top_logprobs or 1 if req.logprobs else 0) if chat else (req.logprobs or 0)
        self.show_top = bool(req.top_logprobs) if chat else True

    async def _scores(self, ids: list[int]) -> list[tuple[int, float, list[tuple[int, float]]]]:
        """For each of ``ids`` (the newest of ``self.ids``): id, logprob, the top k and the sampled one."""
        if not ids:
            return []
        alts = await asyncio.to_thread(self.server.engine.alternatives, self.job.prompt, self.ids, self.k)
        out = []
        for token, (lp, top) in zip(ids, alts[len(alts) - len(ids) :], strict=True):
            if all(t != token for t, _ in top):
                top = sorted([*top, (token, lp)], key=lambda a: -a[1])
            out.append((token, lp, top))
        return out

    async def logprobs(self, ids: list[int], stream: bool) -> dict[str, Any]:
        """The chat or completion logprobs of ``ids``; a stream chunk leaves out what is None (exclude_none)."""
        decode = self.server.engine.decode_alone
        scores = await self._scores(ids)
        if self.chat:
            content = []
            for token, lp, top in scores:
                text = decode(token)
                entry: dict[str, Any] = {"token": text, "logprob": max(lp, -9999.0), "bytes": list(text.encode())}
                if self.show_top:
                    entry["top_logprobs"] = [
                        {"token": (t := decode(i)), "logprob": max(v, -9999.0), "bytes": list(t.encode())}
                        for i, v in top
                    ]
                elif not stream:
                    entry["top_logprobs"] = None
                content.append(entry)
            return {"content": content}
        offsets, tokens = [], []
        for token, _, _ in scores:
            offsets.append(self.text_len)
            tokens.append(decode(token))
            self.text_len += len(tokens[-1])
        return {
            "text_offset": offsets,
            "token_logprobs": [max(lp, -9999.0) for _, lp, _ in scores],
            "tokens": tokens,
            "top_logprobs": [{decode(i): max(v, -9999.0) for i, v in top} for _, _, top in scores],
        }

    def _finish(self, finish: str | None) -> str | None:
        return "tool_calls" if finish == "stop" and self.has_call else finish

    async def piece(self, step: _Step) -> dict[str, Any] | None:
        """The stream choice for one step, None where the server sends nothing for it."""
        self.ids += step.ids
        job = self.job
        if not self.chat:
            text, self.echo = (job.prompt if self.echo else "") + step.delta, False
            # fmt: off
            choice: dict[str, Any] = {"index": job.index, "text": text, "token_ids": None, "logprobs": None,
                                      "finish_reason": step.finish, "stop_reason": step.reason,
                                      "avg_decoded_tokens_per_iter": None}
            # fmt: on
            if self.k:
                choice["logprobs"] = await self.logprobs(step.ids, stream=True)
            return choice
        delta: dict[str, Any]
        if self.named is not None:
            call = {"type": "function", "index": job.index, "function": {"name": self.named, "arguments": step.delta}}
            delta = {"tool_calls": [call]}
        else:
            text, pieces = step.delta, cast(list[dict[str, Any]], [])
            if self.parser is not None:
                text, pieces = self.parser.feed(text, final=step.finish is not None)
                pieces = [] if self.no_calls else pieces
                self.has_call = self.has_call or bool(pieces)
            if not (pieces or text or step.finish or step.ids):
                return None
            delta = {"content": text, "reasoning_content": ""} | ({"tool_calls": pieces} if pieces else {})
        choice = {"index": job.index, "delta": delta}
        if self.k:
            choice["logprobs"] = await self.logprobs(step.ids, stream=True)
        ends = (("finish_reason", self._finish(step.finish)), ("stop_reason", step.reason))
        return choice | {k: v for k, v in ends if v is not None}

    async def whole(self, last: _Step) -> dict[str, Any]:
        """The non-streaming choice from the sequence's last step (its text is the whole output)."""
        job, text = self.job, last.text
        logprobs = await self.logprobs(self.ids, stream=False) if self.k else None
        tail = {"finish_reason": None, "stop_reason": last.reason, "disaggregated_params": None}
        tail |= {"avg_decoded_tokens_per_iter": None}
        if not self.chat:
            text = (job.prompt if self.echo else "") + text
            choice = {"index": job.index, "text": text, "token_ids": None, "logprobs": logprobs, "context_logits": None}
            return choice | tail | {"finish_reason": last.finish}
        calls: list[dict[str, Any]] = []
        if self.named is not None:
            calls = [{"id": _call_id(), "type": "function", "function": {"name": self.named, "arguments": text}}]
            text = ""
        elif self.parser is not None:
            text, calls = parse_calls(text, self.names)
            calls = [] if self.no_calls else calls
            self.has_call = bool(calls)
        message = {
            "role": "assistant",
            "content": text,
            "reasoning_content": "",
            "reasoning": None,
            "tool_calls": calls,
        }
        choice = {"index": job.index, "message": message, "logprobs": logprobs}
        return choice | tail | {"finish_reason": self._finish(last.finish), "mm_embedding_handle": None}


class _Server:
    def __init__(
        self,
        engine: TinyEngine,
        control: FakeControl,
        model: str,
        received: list[dict[str, Any]],
        tool_parser: str | None,
        guided_decoding_backend: str | None,
        max_seq_len: int | None = None,
        backend: Literal["pytorch", "tensorrt"] = "pytorch",
    ) -> None:
        self.engine, self.control, self.model, self.received = engine, control, model, received
        self.max_seq_len = engine.context_length if max_seq_len is None else max_seq_len
        self.backend = backend
        self.tool_parser, self.guided_decoding_backend = tool_parser, guided_decoding_backend
        self.next_id = self.waiting = self.errors = self.prompt_total = self.generation_total = self.iterations = 0
        self.live: dict[int, _Live] = {}
        self.success: dict[str, int] = {}
        self.hists = {name: [0] * (len(b) + 1) for name, b in BUCKETS.items()}  # cumulative; last is +Inf
        self.sums = dict.fromkeys(BUCKETS, 0.0)
        self.iter_stats: deque[dict[str, Any]] = deque(maxlen=1000)
        self.max_blocks = engine.context_length * MAX_ACTIVE // TOKENS_PER_BLOCK

    def _used_blocks(self) -> int:
        return sum(math.ceil((r.prompt + r.generated) / TOKENS_PER_BLOCK) for r in self.live.values())

    def _iteration(self, latency_s: float) -> None:
        self.iterations += 1
        used, top = self._used_blocks(), self.max_blocks
        # fmt: off
        kv = {"allocNewBlocks": used, "allocTotalBlocks": used, "cacheHitRate": 0.0, "freeNumBlocks": top - used,
              "maxNumBlocks": top, "missedBlocks": used, "reusedBlocks": 0, "tokensPerBlock": TOKENS_PER_BLOCK,
              "usedNumBlocks": used}
        self.iter_stats.append({"gpuMemUsage": 0, "iter": self.iterations, "iterLatencyMS": round(latency_s * 1e3, 3),
                                "kvCacheStats": kv, "maxNumActiveRequests": MAX_ACTIVE,
                                "numActiveRequests": len(self.live), "numQueuedRequests": self.waiting,
                                "timestamp": time.strftime("%m-%d-%Y %H:%M:%S")})
        # fmt: on

    async def _run(self, job: _Job) -> AsyncGenerator[_Step, None]:
        """One step per generated token; the last one carries finish_reason."""
        rec, outcome, admitted = _Live(job.prompt_tokens), "abort", False
        self.waiting += 1
        try:
            if self.control.delay_s > 0:
                await asyncio.sleep(self.control.delay_s)
            await self.control.admit()  # queued while the batch is full (max_running)
            admitted = True
            self.waiting -= 1
            rec.start = last = time.monotonic()
            self.live[job.rid] = rec
            text, emitted = "", 0
            tokens = cast(AsyncGenerator[Token, None], self.engine.stream(
                job.prompt, job.max_tokens, greedy=job.greedy, temperature=job.temperature, top_p=job.top_p,
                ignore_eos=job.ignore_eos,
            ))  # fmt: skip
            async with contextlib.aclosing(tokens):
                async for tok in tokens:
                    if tok.special and not job.ignore_eos:
                        outcome = "stop"
                        yield _Step("", rec.generated, text, "stop")
                        return
                    rec.generated, rec.first, now = rec.generated + 1, rec.first or time.monotonic(), time.monotonic()
                    self.generation_total += 1
                    self._iteration(now - last)
                    last = now
                    if job.fail_after is not None and rec.generated > job.fail_after:
                        raise EngineFailure("Executor worker returned error: generation failed (injected fault)")
                    step = _Step("", rec.generated, ids=[tok.id], logprobs=[tok.logprob])
                    if tok.id in job.stop_ids:
                        step.finish, step.reason = "stop", tok.id
                        text += tok.text if job.include_stop else ""
                    else:
                        text += tok.text
                        if hit := _find_stop(text, job.stops, len(text) - len(tok.text)):
                            text = text[: hit[0] + (len(hit[1]) if job.include_stop else 0)]
                            step.finish, step.reason = "stop", hit[1]
                    if step.finish is None and rec.generated >= job.max_tokens:
                        step.finish = "length"
                    step.delta, step.text, emitted = text[emitted:], text, max(emitted, len(text))
                    outcome = step.finish or outcome
                    yield step
                    if step.finish:
                        return
            outcome = "length"
            yield _Step("", rec.generated, text, "length")
        except EngineFailure:
            outcome = "error"
            raise
        finally:
            if admitted:
                self.control.release()
            if self.live.pop(job.rid, None) is None:
                self.waiting -= 1
            self._finish(rec, outcome)

    def _observe(self, name: str, value: float) -> None:
        for i, bound in enumerate((*BUCKETS[name], math.inf)):
            self.hists[name][i] += value <= bound
        self.sums[name] += value

    def _finish(self, rec: _Live, outcome: str) -> None:
        end = time.monotonic()
        self.errors += outcome == "error"
        if outcome not in ("stop", "length"):
            return
        self.success[outcome] = self.success.get(outcome, 0) + 1
        self.prompt_total += rec.prompt
        self._observe("trtllm_e2e_request_latency_seconds", end - rec.arrival)
        self._observe("trtllm_request_queue_time_seconds", rec.start - rec.arrival)
        if rec.first is not None:
            self._observe("trtllm_time_to_first_token_seconds", rec.first - rec.arrival)
            if rec.generated > 1:
                self._observe("trtllm_time_per_output_token_seconds", (end - rec.first) / (rec.generated - 1))

    def _job(self, req: Any, prompt: str, max_tokens: int | None) -> _Job:
        n, seq = self.engine.count_tokens(prompt), self.max_seq_len
        if self.backend == "tensorrt" and n + (max_tokens or 0) > seq:
            raise EngineFailure(
                f"The sum of prompt length ({float(n)}) and query length (0) max_tokens ({max_tokens}) should not "
                f"exceed max_seq_len ({seq})"
            )
        if n > MAX_NUM_TOKENS:
            raise EngineFailure(
                f"The sum of prompt length ({float(n)}), query length (0) should not exceed "
                f"max_num_tokens ({MAX_NUM_TOKENS})"
            )
        if (room := seq - n) <= 0:
            raise EngineFailure(
                f"`default_max_tokens` ({room}) must be greater than 0, `default_max_tokens` ({room}) = "
                f"max_seq_len ({seq}) - `splited_prompt_len` ({n}) - `query_token_len` (0)"
            )
        if max_tokens is not None and max_tokens <= 0:
            raise EngineFailure(f"`max_tokens` ({max_tokens}) must be greater than 0")
        if req.n < 1:
            raise EngineFailure(f"n must be at least 1, got {req.n}.")
        if getattr(req, "prompt_token_ids", None) is not None:
            raise EngineFailure("this fake serves text prompts only")
        self._check_sampling(req)
        temperature, self.next_id = 1.0 if req.temperature is None else req.temperature, self.next_id + 1
        return _Job(
            self.next_id, prompt, n, room if max_tokens is None else min(max_tokens, room),
            greedy=temperature == 0 or req.top_k == 1, temperature=temperature,
            top_p=1.0 if req.top_p is None else req.top_p, ignore_eos=req.ignore_eos,
            stops=[req.stop] if isinstance(req.stop, str) else list(req.stop or []),
            stop_ids=set(req.stop_token_ids or []), include_stop=req.include_stop_str_in_output,
        )  # fmt: skip

    def _check_sampling(self, req: Any) -> None:
        """What ``to_sampling_params`` refuses (a ValueError there: the handler's 400)."""
        fmt = req.response_format
        if fmt is not None and fmt.type != "text":
            needs = {"json": "schema_", "json_schema": "json_schema", "regex": "regex", "ebnf": "ebnf"}.get(fmt.type)
            if needs is not None and getattr(fmt, needs) is None:
                name = needs.rstrip("_")
                raise EngineFailure(
                    f"response_format.{name} is required for response_format.type == {fmt.type!r}, but got None."
                )
            if self.guided_decoding_backend is None:
                raise EngineFailure("Guided decoding is not enabled for this server")
        vocab = self.engine.vocab_size
        for key, bias in (req.logit_bias or {}).items():
            try:
                token = int(key)
            except ValueError:
                raise EngineFailure(f"Invalid logit_bias key '{key}': must be a valid integer token ID") from None
            if not 0 <= token < vocab:
                raise EngineFailure(f"Token ID {token} out of vocabulary range [0, {vocab})")
            if not math.isfinite(bias):
                raise EngineFailure(f"logit_bias value for token ID {token} must be finite")
            if not -100.0 <= bias <= 100.0:
                raise EngineFailure(f"logit_bias value for token ID {token} must be in [-100, 100]")

    async def _parse(self, request: Request, chat: bool) -> Any:
        raw = await request.body()
        if not raw:  # FastAPI's answer to a missing body
            return JSONResponse(
                {"error": str([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])}, 400
            )
        try:
            body = json.loads(raw)
            self.received.append(body)
            return (ChatCompletionRequest if chat else CompletionRequest).model_validate(body)
        except json.JSONDecodeError as exc:
            error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}
            errors: list[Any] = [error | {"ctx": {"error": exc.msg}}]
        except ValidationError as exc:
            errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        return JSONResponse({"error": str(errors)}, status_code=400)

    async def generate(self, request: Request) -> Response:
        chat = request.url.path.endswith("/chat/completions")
        req = await self._parse(request, chat)
        if isinstance(req, Response):
            return req
        try:
            if chat:
                messages = [m.model_dump(exclude_none=True) for m in req.messages]
                for m in messages:
                    if isinstance(m.get("content"), list):
                        m["content"] = "".join(part.get("text", "") for part in m["content"])
                tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
                job = self._job(req, self.engine.render_chat(messages, tools), req.max_completion_tokens)
            else:
                prompt = req.prompt[0] if isinstance(req.prompt, list) and len(req.prompt) == 1 else req.prompt
                if not isinstance(prompt, str):
                    raise EngineFailure("this fake serves one text prompt only")
                job = self._job(req, prompt, req.max_tokens)
        except EngineFailure as exc:
            return _error(str(exc))
        fault = self.control.take_fault()
        self.errors += fault in ("overloaded", "internal")
        if fault == "overloaded":
            return _error(QUEUE_FULL)
        if fault == "internal":
            return _error("Executor worker returned error: internal failure", "InternalServerError", 500)
        job.fail_after = 3 if fault == "midstream" else None
        jobs = [job] + [replace(job, index=i, rid=self._new_id()) for i in range(1, req.n)]
        outputs = [_Output(self, req, chat, j) for j in jobs]
        if req.stream:
            lost = req.n - 1 if fault == "lost_choice" and req.n > 1 else None
            return EventStream(self._stream(req, outputs, chat, lost), media_type="text/event-stream")
        try:
            done = await unless_disconnected(request, self._collect_all(outputs))
        except EngineFailure as exc:
            return _error(str(exc))
        if done is None:
            return Response()
        choices = [await out.whole(last) for out, last in zip(outputs, done, strict=True)]
        if fault == "lost_choice" and req.n > 1:
            choices.pop()
        kind, prefix = ("chat.completion", "chatcmpl") if chat else ("text_completion", "cmpl")
        head = {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": req.model}
        usage = _usage(job.prompt_tokens, sum(last.tokens for last in done))
        return JSONResponse(head | {"choices": choices, "usage": usage, "prompt_token_ids": None})

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    async def _collect_all(self, outputs: list[_Output]) -> list[_Step]:
        return [await self._collect(out) for out in outputs]

    async def _collect(self, out: _Output) -> _Step:
        """The last step: its text is the whole output, stop strings cut even where the stream had sent them."""
        last = _Step("", 0)
        async with contextlib.aclosing(self._run(out.job)) as steps:
            async for step in steps:
                out.ids += step.ids
                last = step
        return last

    async def _stream(
        self, req: Any, outputs: list[_Output], chat: bool, lost: int | None = None
    ) -> AsyncGenerator[str, None]:
        """The sequences' steps interleaved, one choice per chunk, as the engine's outputs arrive (but for
        the choice ``lost``, whose chunks are dropped)."""
        kind, prefix = ("chat.completion.chunk", "chatcmpl") if chat else ("text_completion", "cmpl")
        job = outputs[0].job
        head = {"id": f"{prefix}-{job.rid}", "object": kind, "created": int(time.time()), "model": req.model}
        usage = bool(req.stream_options and req.stream_options.include_usage)
        every = usage and bool(req.stream_options.continuous_usage_stats)
        if chat:
            for out in outputs[:lost]:
                first = head | {"choices": [{"index": out.job.index, "delta": {"role": "assistant"}}]}
                yield _sse(first | ({"usage": _usage(job.prompt_tokens, 0)} if every else {}), end=" \n\n")
        counts = [0] * len(outputs)
        async with contextlib.AsyncExitStack() as stack:
            runs = [await stack.enter_async_context(contextlib.aclosing(self._run(o.job))) for o in outputs]
            alive = list(range(len(outputs)))
            while alive:
                for i in list(alive):
                    step = await anext(runs[i], None)
                    if step is None or step.finish:
                        alive.remove(i)
                    if step is None:
                        continue
                    counts[i] = step.tokens
                    choice = None if i == lost else await outputs[i].piece(step)
                    if choice is None:
                        continue
                    chunk = head | {"choices": [choice]}
                    if every or not chat:
                        chunk["usage"] = _usage(job.prompt_tokens, step.tokens) if every else None
                    yield _sse(chunk)
        if usage:
            yield _sse(head | {"choices": [], "usage": _usage(job.prompt_tokens, sum(counts))})
        yield "data: [DONE]\n\n"

    async def health(self, request: Request) -> Response:
        if self.control.healthy and not self.control.loading:
            return Response(status_code=200)
        return Response("LLM is unavailable. Please check the server logs for more details.", status_code=503)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": "1.2.0"})

    async def models(self, request: Request) -> Response:
        card = {"id": self.model, "object": "model", "created": int(time.time()), "owned_by": "tensorrt_llm"}
        return JSONResponse({"object": "list", "data": [card]})

    async def iteration_stats(self, request: Request) -> Response:
        stats = list(self.iter_stats)
        self.iter_stats.clear()
        return JSONResponse(stats)

    async def prometheus(self, request: Request) -> Response:
        successes = [
            ("trtllm_request_success_total", LABELS | {"finished_reason": r}, c) for r, c in self.success.items()
        ]
        lines = _family(
            "trtllm_request_success_total", "counter", "Count of successfully processed requests.", successes
        )
        # fmt: off
        for name, kind, doc, value in (
            ("trtllm_request_error_total", "counter", "Count of failed requests.", self.errors),
            ("trtllm_prompt_tokens_total", "counter", "Number of prefill tokens processed.", self.prompt_total),
            ("trtllm_generation_tokens_total", "counter", "Number of generation tokens processed.",
             self.generation_total),
            ("trtllm_num_requests_running", "gauge", "Number of requests currently running.", len(self.live)),
            ("trtllm_num_requests_waiting", "gauge", "Number of requests waiting to be scheduled.", self.waiting),
            ("trtllm_kv_cache_utilization", "gauge", "KV cache utilization (0-1).",
             self._used_blocks() / self.max_blocks),
            ("trtllm_kv_cache_hit_rate", "gauge", "KV cache hit rate (0-1).", 0.0),
        ):
            lines += _family(name, kind, doc, [(name, LABELS, value)])
        # fmt: on
        for name, bounds in BUCKETS.items():
            counts, les = self.hists[name], [*map(repr, bounds), "+Inf"]
            samples: list[tuple[str, dict[str, str], float]] = [
                (f"{name}_bucket", LABELS | {"le": le}, c) for le, c in zip(les, counts, strict=True)
            ]
            samples += [(f"{name}_count", LABELS, counts[-1]), (f"{name}_sum", LABELS, self.sums[name])]
            lines += _family(name, "histogram", f"Histogram of {name[7:].replace('_', ' ')}.", samples)
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8")


async def _fastapi_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, exc.status_code)


def create_app(
    engine: TinyEngine,
    control: FakeControl,
    *,
    model: str = "enginegate-demo",
    received: list[dict[str, Any]] | None = None,
    tool_parser: str | None = "qwen3",
    guided_decoding_backend: str | None = "xgrammar",
    max_seq_len: int | None = None,
    backend: Literal["pytorch", "tensorrt"] = "pytorch",
) -> ASGIApp:
    """The fake as launched with ``--tool_parser`` ``tool_parser`` and ``guided_decoding_backend`` in its
    extra options (None: without), ``--max_seq_len`` ``max_seq_len`` (None: the model's context) and
    ``--backend`` ``backend``; each generate body is appended to ``received``."""
    server = _Server(
        engine, control, model, [] if received is None else received, tool_parser, guided_decoding_backend,
        max_seq_len, backend,
    )  # fmt: skip
    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/version", server.version, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/metrics", server.iteration_stats, methods=["GET"]),
        Route("/prometheus/metrics", server.prometheus, methods=["GET"]),
        Route("/v1/chat/completions", server.generate, methods=["POST"]),
        Route("/v1/completions", server.generate, methods=["POST"]),
    ]
    return with_faults(Starlette(routes=routes, exception_handlers={HTTPException: _fastapi_error}), control)
