"""Run a routing decision: try candidates in order until one commits.

Everything before the first content is retryable on the next candidate
(retryable ``BackendError``, a stream that ends early, no first token within
the timeout). The first content is the commit point: ``Committed`` then owns
the backend's stream, and whoever consumes it must ``aclose()`` it, which
cancels the engine's work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from backends.base import Backend, BackendError, Chunk, ErrorKind, GenerationRequest
from routing.types import Decision

log = logging.getLogger("enginegate.dispatch")


class Tracker(Protocol):
    """Who counts attempts per backend (the fleet): routing's in-flight and prefill-backlog figures."""

    def sending(self, name: str, prompt_tokens: int) -> None: ...

    def first_token(self, name: str, prompt_tokens: int) -> None: ...

    def end(self, name: str, prompt_tokens: int = 0) -> None: ...


@dataclass
class Committed:
    backend: str
    first: list[Chunk]
    rest: AsyncIterator[Chunk]
    failures: list[tuple[str, BackendError]] = field(default_factory=list)

    async def chunks(self) -> AsyncIterator[Chunk]:
        for chunk in self.first:
            yield chunk
        async for chunk in self.rest:
            yield chunk

    async def aclose(self) -> None:
        await _close(self.rest)


async def _first_content(stream: AsyncIterator[Chunk], timeout: float, name: str) -> list[Chunk]:
    """Chunks up to and including the first with text or a finish reason, within ``timeout`` seconds."""
    head: list[Chunk] = []
    try:
        async with asyncio.timeout(timeout):  # one deadline for the first token; no task, unlike wait_for
            while True:
                chunk = await anext(stream)
                head.append(chunk)
                if chunk.text or chunk.finish_reason is not None:
                    return head
    except StopAsyncIteration:
        raise BackendError(ErrorKind.PROTOCOL, f"backend {name} ended its stream without an answer") from None
    except TimeoutError:
        raise BackendError(ErrorKind.TIMEOUT, f"backend {name} sent no first token within {timeout:g}s") from None


async def _attempt(
    backend: Backend, request: GenerationRequest, timeout: float, tracker: Tracker, tokens: int
) -> Committed:
    """One backend up to its first content; any failure is a BackendError and closes its stream.
    ``tokens``: the prompt's size, for the tracker's prefill backlog."""
    name = backend.name
    tracker.sending(name, tokens)
    stream = backend.generate(request)
    try:
        head = await _first_content(stream, timeout, name)
    except BackendError:
        await _close(stream)
        tracker.end(name, tokens)
        raise
    except Exception as exc:  # an adapter bug: reported as an upstream failure, the next backend may answer
        await _close(stream)
        tracker.end(name, tokens)
        log.exception("backend %s failed unexpectedly", name, extra={"request_id": request.request_id})
        raise BackendError(ErrorKind.UPSTREAM, f"backend {name} failed: {exc}") from exc
    except BaseException:
        await _close(stream)
        tracker.end(name, tokens)
        raise
    tracker.first_token(name, tokens)
    return Committed(name, head, stream)


async def start(
    decision: Decision,
    backends: Mapping[str, Backend],
    request: GenerationRequest,
    first_token_timeout: float,
    tracker: Tracker,
    prompt_tokens: int,
    hedge_after: float | None = None,
) -> Committed:
    """Commit to the first candidate that produces content; raise the last error if none does.

    Candidates are tried one after another; with ``hedge_after`` (seconds), a candidate whose first
    token is that late gets company: the next candidate starts too, the first to answer wins and the
    other is cancelled. ``BackendError.failures`` (on the raised error) lists every failed attempt.
    ``tracker`` hears of every attempt; the committed one's ``end`` is the caller's to report."""
    queue = [backends[c.backend] for c in decision.candidates[: decision.max_attempts] if c.backend in backends]
    failures: list[tuple[str, BackendError]] = []
    if hedge_after is None or len(queue) < 2:
        return await _one_by_one(queue, request, first_token_timeout, failures, tracker, prompt_tokens)
    running: dict[asyncio.Task[Committed], str] = {}

    def launch() -> None:
        backend = queue.pop(0)
        attempt = _attempt(backend, request, first_token_timeout, tracker, prompt_tokens)
        running[asyncio.ensure_future(attempt)] = backend.name

    try:
        while queue or running:
            if not running:
                launch()
            hedge = hedge_after if queue else None
            done, _ = await asyncio.wait(running, timeout=hedge, return_when=asyncio.FIRST_COMPLETED)
            if not done:  # the first token is late against the budget: hedge with the next candidate
                launch()
                continue
            for task in done:
                name = running.pop(task)
                exc = task.exception()
                if exc is None:
                    committed = task.result()
                    committed.failures = failures
                    return committed
                if not isinstance(exc, BackendError):
                    raise exc
                _note(failures, name, exc, request.request_id)
    finally:
        for task in running:  # losers of a hedge, or everything when the client went away
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
            for task in running:
                if not task.cancelled() and task.exception() is None:  # answered too, but lost the race
                    await task.result().aclose()
                    tracker.end(running[task])
    raise _exhausted(failures)


def _exhausted(failures: list[tuple[str, BackendError]]) -> BackendError:
    """The error to raise when no candidate answered: the last one's, carrying every failure."""
    last = failures[-1][1] if failures else BackendError(ErrorKind.CONNECT, "no backend could be tried")
    last.failures = failures
    return last


def _note(failures: list[tuple[str, BackendError]], name: str, exc: BackendError, request_id: str) -> None:
    failures.append((name, exc))
    log.warning("attempt failed", extra={"request_id": request_id, "backend": name, "kind": exc.kind.value})
    if not exc.retryable:
        exc.failures = failures
        raise exc


async def _one_by_one(
    queue: list[Backend],
    request: GenerationRequest,
    timeout: float,
    failures: list[tuple[str, BackendError]],
    tracker: Tracker,
    tokens: int,
) -> Committed:
    """Without hedging: each candidate in turn, in this task (no task per attempt on the hot path)."""
    for backend in queue:
        try:
            committed = await _attempt(backend, request, timeout, tracker, tokens)
        except BackendError as exc:
            _note(failures, backend.name, exc, request.request_id)
            continue
        committed.failures = failures
        return committed
    raise _exhausted(failures)


async def _close(stream: AsyncIterator[Chunk]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
