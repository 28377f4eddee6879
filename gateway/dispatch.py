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

from backends.base import Backend, BackendError, Chunk, ErrorKind, GenerationRequest
from routing.types import Decision

log = logging.getLogger("enginegate.dispatch")


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
        aclose = getattr(self.rest, "aclose", None)
        if aclose is not None:
            await aclose()


async def _first_content(stream: AsyncIterator[Chunk], timeout: float, name: str) -> list[Chunk]:
    """Chunks up to and including the first with text or a finish reason."""
    head: list[Chunk] = []
    while True:
        try:
            chunk = await asyncio.wait_for(anext(stream), timeout)
        except StopAsyncIteration:
            raise BackendError(ErrorKind.PROTOCOL, f"backend {name} ended its stream without an answer") from None
        except TimeoutError:
            raise BackendError(ErrorKind.TIMEOUT, f"backend {name} sent no first token within {timeout:g}s") from None
        head.append(chunk)
        if chunk.text or chunk.finish_reason is not None:
            return head


async def start(
    decision: Decision,
    backends: Mapping[str, Backend],
    request: GenerationRequest,
    first_token_timeout: float,
) -> Committed:
    """Commit to the first candidate that produces content; raise the last error if none does.
    ``BackendError.failures`` (set on the raised error) lists every failed attempt."""
    failures: list[tuple[str, BackendError]] = []
    for candidate in decision.candidates[: decision.max_attempts]:
        backend = backends.get(candidate.backend)
        if backend is None:  # retired by a reload since the decision
            continue
        stream = backend.generate(request)
        try:
            head = await _first_content(stream, first_token_timeout, backend.name)
        except BackendError as exc:
            await _close(stream)
            failures.append((backend.name, exc))
            log.warning(
                "attempt failed",
                extra={"request_id": request.request_id, "backend": backend.name, "kind": exc.kind.value},
            )
            if not exc.retryable:
                exc.failures = failures
                raise
            continue
        except Exception as exc:  # an adapter bug: the next backend may still answer
            await _close(stream)
            log.exception("backend %s failed unexpectedly", backend.name, extra={"request_id": request.request_id})
            failures.append((backend.name, BackendError(ErrorKind.UPSTREAM, f"backend {backend.name} failed: {exc}")))
            continue
        except BaseException:
            await _close(stream)
            raise
        return Committed(backend.name, head, stream, failures)
    last = failures[-1][1] if failures else BackendError(ErrorKind.CONNECT, "no backend could be tried")
    last.failures = failures
    raise last


async def _close(stream: AsyncIterator[Chunk]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
