"""What the gateway adds between a request and the backend that serves it, per backend.

- The answer's length when the client set none: what the backend's context leaves after the
  prompt, capped by ``limits.max_tokens``, the same rule on every engine (engines' own defaults
  range from 16 tokens to the whole context).
- ``n`` > 1 on a backend without a native ``n``: ``n`` generations on that backend at once, with
  distinct seeds when a seed was given, merged into one stream of indexed choices.
- Tools on engines that take raw text: the adapter renders the tools with the model's chat
  template; the model's tool calls are parsed out of its text here (``backends.tool_calls``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from backends.base import Backend, Chunk, GenerationRequest
from backends.capabilities import Capabilities


def default_length(request: GenerationRequest, cap: int, context: int, prompt_tokens: int) -> GenerationRequest:
    """The request with its answer length set: the client's, else what the context leaves (at least one)."""
    if request.max_tokens is not None:
        return request
    return replace(request, max_tokens=max(1, min(cap, context - prompt_tokens)))


def open_answer(backend: Backend, caps: Capabilities, request: GenerationRequest) -> AsyncIterator[Chunk]:
    """The backend's answer to ``request``, shaped to OpenAI's contract (see the module docstring)."""
    in_text = caps.tools_in_prompt and bool(request.tools)
    if in_text and request.tool_choice == "none":
        request, in_text = replace(request, tools=(), tool_choice=None), False  # no call may come: none offered
    if request.n > 1 and not caps.native_n:
        singles = [
            replace(request, n=1, seed=None if request.seed is None else request.seed + i) for i in range(request.n)
        ]
        streams = [_one(backend, caps, r, in_text) for r in singles]
        return fan_in(streams)
    return _one(backend, caps, request, in_text)


def _one(backend: Backend, caps: Capabilities, request: GenerationRequest, in_text: bool) -> AsyncIterator[Chunk]:
    stream = backend.generate(request)
    if in_text and caps.tool_parser is not None:
        from backends.tool_calls import with_tool_calls

        return with_tool_calls(stream, caps.tool_parser)
    return stream


async def fan_in(streams: list[AsyncIterator[Chunk]]) -> AsyncIterator[Chunk]:
    """Chunks of several single-choice streams as one, each chunk's ``index`` its stream's place.
    The first failure ends them all (raised here); closing this closes every stream."""
    queue: asyncio.Queue[tuple[int, Chunk | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[Chunk]) -> None:
        try:
            async for chunk in stream:
                queue.put_nowait((i, replace(chunk, index=i, more=False)))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            queue.put_nowait((i, exc))
        else:
            queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    open_streams = len(tasks)
    try:
        while open_streams:
            _, item = await queue.get()
            if item is None:
                open_streams -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            aclose: Callable[[], object] | None = getattr(stream, "aclose", None)
            if aclose is not None:
                result = aclose()
                if asyncio.iscoroutine(result):
                    await result
