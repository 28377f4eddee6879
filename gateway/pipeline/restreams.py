"""Streams made of a backend's streams, for ``gateway.pipeline.shaping``: several single-choice answers
merged into one (``fan_in``: ``n`` > 1 on a backend without a native ``n``), and an answer whose usage
the engine only estimated, recounted with the model's tokenizer (``recounted``, ``Recount``).

Async generators, apart from ``shaping`` so that it can be compiled (mypyc compiles no async
generators; these run only where the backend needs them, never on the plain path).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from backends.base import Chunk, Usage
from backends.text import INLINE_PROMPT_CHARS


@dataclass(frozen=True, slots=True)
class Recount:
    """The gateway's own token counts, for answers whose engine gave none."""

    prompt_tokens: int | None
    """The prompt as the model's tokenizer counts it (None: too big to have been counted)."""
    count_text: Callable[[str], int]
    """Tokens of a text as the model's tokenizer splits it (blocking CPU work)."""


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
            await _close(stream)


async def _close(stream: AsyncIterator[Chunk]) -> None:
    """Closes a backend's stream (an async generator): its engine stops at once, not at collection."""
    aclose: Callable[[], object] | None = getattr(stream, "aclose", None)
    if aclose is not None:
        result = aclose()
        if asyncio.iscoroutine(result):
            await result


async def recounted(stream: AsyncIterator[Chunk], recount: Recount, max_tokens: int | None) -> AsyncIterator[Chunk]:
    """``stream`` with the usage the adapter marked estimated replaced by the gateway's counts: the
    prompt's, and the answer's text (every choice of the stream) counted with the model's tokenizer."""
    texts: dict[int, list[str]] = {}
    try:
        async for chunk in stream:
            if chunk.text:
                texts.setdefault(chunk.index, []).append(chunk.text)
            usage = chunk.usage
            if usage is not None and (usage.prompt_estimated or usage.completion_estimated):
                answers = ["".join(parts) for parts in texts.values()]
                counted, finish = await _counted(usage, chunk.finish_reason, answers, recount, max_tokens)
                chunk = replace(chunk, usage=counted, finish_reason=finish)
            yield chunk
    finally:  # closing this closes the backend's stream at once
        await _close(stream)


async def _counted(
    usage: Usage, finish: str | None, answers: list[str], recount: Recount, max_tokens: int | None
) -> tuple[Usage, str | None]:
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    prompt_estimated, completion_estimated = usage.prompt_estimated, usage.completion_estimated
    if prompt_estimated and recount.prompt_tokens is not None:
        prompt, prompt_estimated = recount.prompt_tokens, False
    if completion_estimated:
        completion = sum([await _count(recount.count_text, text) for text in answers])
        completion_estimated = False
        if usage.finish_from_count and max_tokens is not None and finish in ("stop", "length"):
            finish = "length" if completion >= max_tokens else "stop"
    return Usage(prompt, completion, usage.cached_tokens, prompt_estimated, completion_estimated), finish


async def _count(count: Callable[[str], int], text: str) -> int:
    """``count(text)`` inline for a short answer, in a thread for a long one (off the event loop)."""
    return count(text) if len(text) <= INLINE_PROMPT_CHARS else await asyncio.to_thread(count, text)
