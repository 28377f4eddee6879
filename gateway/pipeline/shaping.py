"""What the gateway adds between a request and the backend that serves it, per backend.

- The answer's length when the client set none: what the backend's context leaves after the
  prompt, capped by ``limits.max_tokens``, the same rule on every engine (engines' own defaults
  range from 16 tokens to the whole context). The backend's context is the smaller of the model
  entry's and the one its engine was launched with (``Entry.context``). The prompt is counted as the
  engine will see it: rendered with the chat template, tools included, by the model's tokenizer
  where the gateway has it (``Runtime.measure``); otherwise estimated with a margin, so that the
  estimate errs long (``prompt_bound``)::

      ceil(1.25 * characters / 4)       message texts, tool-call arguments and the tools' JSON
      + 32                              a chat template's fixed text (Llama 3.1 adds a dated preamble)
      + 8 per message                   role markers and separators
      + 128 when tools are offered      the template's instructions around them
      + 1024 per image                  what vision encoders take for one

  A completion prompt is text only: ``ceil(1.25 * characters / 4) + 8``. If the engine still finds
  prompt and answer too long (a count made with another template, an unusual tokenizer) its refusal
  names its limit and mostly the prompt's real size: the attempt is made once more on the same
  backend with the answer that leaves, and the fleet keeps the limit (``Accounts.note_context``). A
  client's own ``max_tokens`` is never changed: the engine's refusal is the client's 400.
- ``n`` > 1 on a backend without a native ``n``: ``n`` generations on that backend at once, with
  distinct seeds when a seed was given, merged into one stream of indexed choices.
- Tools on engines that take raw text: the adapter renders the tools with the model's chat
  template; the model's tool calls are parsed out of its text here (``backends.tool_calls``).
- Token counts an engine did not give (``Capabilities.token_counts`` "tokenizer"): where the adapter
  marks its usage an estimate, the prompt's count is the gateway's own and the answer's text is
  counted with the model's tokenizer (``Recount``); a finish reason the adapter judged from its
  estimate is judged again from that count.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from backends.base import Backend, BackendError, Chunk, ErrorKind, GenerationRequest
from backends.capabilities import Capabilities
from backends.http_errors import context_figures
from gateway.pipeline.restreams import Recount, fan_in, recounted
from values.calls import json_dumps

ESTIMATE_MARGIN = 1.25
CHARS_PER_TOKEN = 4
TEMPLATE_TOKENS = 32
MESSAGE_TOKENS = 8
TOOLS_TOKENS = 128
IMAGE_TOKENS = 1024


def prompt_bound(request: GenerationRequest, exact: int | None) -> int:
    """The prompt's tokens as the engine will count them: ``exact`` when the model's tokenizer counted
    them (template and tools included), else the estimate with its margin (the module docstring)."""
    if exact is not None:
        return exact
    if request.messages is None:
        return math.ceil(ESTIMATE_MARGIN * len(request.prompt or "") / CHARS_PER_TOKEN) + MESSAGE_TOKENS
    chars = images = 0
    for m in request.messages:
        content = m.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    chars += len(str(part.get("text", "")))
                else:
                    images += 1
        for call in m.get("tool_calls") or ():
            function = call.get("function") or {}
            chars += len(str(function.get("name", ""))) + len(str(function.get("arguments", "")))
    fixed = TEMPLATE_TOKENS + MESSAGE_TOKENS * len(request.messages) + IMAGE_TOKENS * images
    if request.tools:
        chars += len(json_dumps(list(request.tools)))
        fixed += TOOLS_TOKENS
    return math.ceil(ESTIMATE_MARGIN * chars / CHARS_PER_TOKEN) + fixed


def default_length(request: GenerationRequest, cap: int, context: int, prompt_tokens: int) -> GenerationRequest:
    """The request with its answer length set: the client's, else what the context leaves after
    ``prompt_tokens`` (``prompt_bound``), at least one."""
    if request.max_tokens is not None:
        return request
    return request.sized(max(1, min(cap, context - prompt_tokens)))


def open_sized(
    backend: Backend,
    caps: Capabilities,
    request: GenerationRequest,
    cap: int,
    context: int,
    prompt_tokens: int,
    recount: Recount | None = None,
) -> AsyncIterator[Chunk]:
    """``open_answer`` with the answer's length the gateway's to choose (the client set none): sized to
    ``context`` (``default_length``); ``resized`` sizes it once more when the engine refuses that."""
    sized = default_length(request, cap, context, prompt_tokens)
    min_tokens = request.extra.get("min_tokens")
    if type(min_tokens) is int and sized.max_tokens is not None and min_tokens > sized.max_tokens:
        return _Refused(
            BackendError(
                ErrorKind.CONTEXT_LENGTH,
                f"min_tokens ({min_tokens}) is more than this backend's context leaves for the answer "
                f"({sized.max_tokens} tokens after a prompt of about {prompt_tokens}).",
                param="min_tokens",
            )
        )
    return open_answer(backend, caps, sized, recount)


def resized(
    request: GenerationRequest,
    cap: int,
    context: int,
    prompt_tokens: int,
    error: BackendError,
    learned: Callable[[int], None],
) -> GenerationRequest | None:
    """After the engine refused the length ``open_sized`` chose as too long: the request sized to what
    its refusal says is left (``learned`` hears the limit it names), or None when it says nothing usable.
    Dispatch makes that one more attempt on the same backend, before any other."""
    if error.kind is not ErrorKind.CONTEXT_LENGTH:
        return None
    limit, prompt = context_figures(error.detail)
    if limit is None:
        return None
    learned(limit)
    sized = default_length(request, cap, context, prompt_tokens)
    room = _smaller(limit, prompt, sized, cap, prompt_tokens)
    return None if room is None else replace(sized, max_tokens=room)


class _Refused:
    """An answer refused before it was asked for: its first ``__anext__`` raises ``error``."""

    __slots__ = ("_error",)

    def __init__(self, error: BackendError) -> None:
        self._error: BackendError | None = error

    def __aiter__(self) -> _Refused:
        return self

    async def __anext__(self) -> Chunk:
        error, self._error = self._error, None
        if error is None:
            raise StopAsyncIteration
        raise error


def _smaller(limit: int, prompt: int | None, request: GenerationRequest, cap: int, counted: int) -> int | None:
    """The answer length that fits an engine's ``limit`` after the ``prompt`` it counted (else the
    gateway's count), when that is shorter than what ``request`` asked and leaves at least one token."""
    room = min(cap, limit - (counted if prompt is None else prompt))
    return room if request.max_tokens is not None and 0 < room < request.max_tokens else None


def open_answer(
    backend: Backend, caps: Capabilities, request: GenerationRequest, recount: Recount | None = None
) -> AsyncIterator[Chunk]:
    """The backend's answer to ``request``, shaped to OpenAI's contract (see the module docstring).
    ``recount``: the gateway's counts, for a backend whose ``token_counts`` are the tokenizer's."""
    if caps.token_counts != "tokenizer":
        recount = None
    in_text = caps.tools_in_prompt and bool(request.tools)
    if in_text and request.tool_choice == "none":
        request, in_text = replace(request, tools=(), tool_choice=None), False  # no call may come: none offered
    if request.n > 1 and not caps.native_n:
        singles = [
            replace(request, n=1, seed=None if request.seed is None else request.seed + i) for i in range(request.n)
        ]
        streams = [_one(backend, caps, r, in_text, recount) for r in singles]
        return fan_in(streams)
    return _one(backend, caps, request, in_text, recount)


def _one(
    backend: Backend, caps: Capabilities, request: GenerationRequest, in_text: bool, recount: Recount | None
) -> AsyncIterator[Chunk]:
    stream = backend.generate(request)
    if recount is not None:  # on the engine's own text, before any tool call is parsed out of it
        stream = recounted(stream, recount, request.max_tokens)
    if in_text and caps.tool_parser is not None:
        from backends.tool_calls import with_tool_calls

        return with_tool_calls(stream, caps.tool_parser)
    return stream
