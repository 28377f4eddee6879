"""Run a routing decision: try candidates in order until one commits.

The commit point is the first byte the client would get. For a stream that is the first content (text or
a finish reason); for an answer sent whole (not streamed) it is the complete answer: a failure anywhere
before it, mid-generation included, moves to the next candidate, because nothing has reached the client.
``Committed`` then owns the backend's stream, and whoever consumes it must ``aclose()`` it, which cancels
the engine's work.

Deadlines per phase: the first token (streaming engines), and the whole answer for answers collected
before they are sent and for engines that answer at once (``WholeAnswers``, where the first chunk is the
whole answer). Connecting, response headers and gaps between bytes are the transport's deadlines.

Every attempt is reported to the ``Tracker`` (the request's lifecycle) as it happens: sent, first token,
failed, ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from backends.answer_stream import AnswerStream
from backends.base import Backend, BackendError, Chunk, ErrorKind, GenerationRequest, WholeAnswers
from values import value
from values.calls import current_task, running_loop

log = logging.getLogger("enginegate.dispatch")


class Target(Protocol):
    """A backend as dispatch tries it (the fleet's entry: in-flight state lives on it, not on a name)."""

    @property
    def name(self) -> str: ...

    @property
    def backend(self) -> Backend: ...


T = TypeVar("T", bound=Target)
"""The targets of one dispatch (the fleet's ``Entry`` in the gateway): its tracker and opening get them
as they are, typed, never cast back."""
T_contra = TypeVar("T_contra", bound=Target, contravariant=True)


class Tracker(Protocol[T_contra]):
    """Who hears of every attempt as it happens: the request's lifecycle, which keeps the fleet's
    in-flight and prefill-backlog figures, the breakers, metrics and logs."""

    def sending(self, target: T_contra, prompt_tokens: int) -> None: ...

    def first_token(self, target: T_contra, prompt_tokens: int) -> None: ...

    def failed(self, target: T_contra, error: BackendError) -> None: ...

    def end(self, target: T_contra, prompt_tokens: int = 0) -> None: ...

    def queued(self, target: T_contra) -> float | None:
        """The wait a request joining the target's queue would have now, None when it has no queue."""
        ...


class Opening(Protocol[T_contra]):
    """How an attempt starts a target's answer to the request the opening carries: generate (shaped
    per backend by ``gateway.pipeline.shaping``), or embed. Every front door's answer is a ``Chunk``
    stream; an embedding's is one chunk carrying its vectors."""

    def open_at(self, target: T_contra) -> AsyncIterator[Chunk]: ...

    def at_once(self, target: T_contra) -> bool:
        """The target answers whole at once (``WholeAnswers``): its first chunk is the whole answer,
        under the whole answer's deadline."""
        ...

    def reopen(self, target: T_contra, error: BackendError) -> AsyncIterator[Chunk] | None:
        """One more try on the same target after it refused the request before its first token, when the
        refusal says how to ask so that it fits (the answer's length, say); None: no."""
        ...


@dataclass(frozen=True, slots=True)
class Generate:
    """The plain opening: the backend's ``generate`` of one request."""

    request: GenerationRequest

    def open_at(self, target: Target) -> AsyncIterator[Chunk]:
        return target.backend.generate(self.request)

    def at_once(self, target: Target) -> bool:
        return answers_whole(target.backend, self.request)

    def reopen(self, target: Target, error: BackendError) -> None:
        return None


def answers_whole(backend: Backend, request: GenerationRequest) -> bool:
    return isinstance(backend, WholeAnswers) and backend.answers_whole(request)


@value(frozen=True)
class Deadlines:
    first_token_s: float
    """A streaming engine's first content must arrive within this."""
    answer_s: float
    """A whole answer (collected before sending, or from an engine that answers at once) within this."""
    queue_s: float | None = None
    """Admission control for requests already sent: one with no first token after this long, on an engine
    that is queueing, gives up there as overloaded (with Retry-After), not at the first-token timeout."""


class Committed(Generic[T]):
    """An attempt past its commit point: ``first``, then ``rest``, are the answer the client gets."""

    __slots__ = ("at_once", "first", "rest", "target")

    def __init__(self, target: T, first: list[Chunk], rest: AsyncIterator[Chunk], at_once: bool = False) -> None:
        self.target = target
        self.first = first
        """Chunks up to the commit point: the whole answer when it was collected whole."""
        self.rest = rest
        self.at_once = at_once
        """The target answered whole at once (``Opening.at_once``): the time to its first chunk is the answer's."""

    @property
    def backend(self) -> str:
        return self.target.name

    async def aclose(self) -> None:
        await _close(self.rest)


class _Nothing:
    """The rest of an answer that was collected whole: nothing (one shared object, no generator per request)."""

    def __aiter__(self) -> _Nothing:
        return self

    async def __anext__(self) -> Chunk:
        raise StopAsyncIteration

    async def aclose(self) -> None:
        return None


_NOTHING = _Nothing()


async def _head(stream: AsyncIterator[Chunk]) -> list[Chunk]:
    """Chunks up to and including the first with text or a finish reason."""
    head: list[Chunk] = []
    async for chunk in stream:
        head.append(chunk)
        if chunk.text or chunk.finish_reason is not None:
            return head
    raise BackendError(ErrorKind.PROTOCOL, "the engine ended its stream without an answer")


RECHECK_S = 1.0
"""Past the admission limit without a first token, how often an attempt looks again whether its
engine is queueing (once was not enough: the queue may show only later)."""


class _Watch:
    """An attempt's deadlines on one timer: the queue check, the first token, the whole answer.

    One handle per attempt, re-armed only when a later phase outlives it: a handle per phase (and
    rescheduling between them) left thousands of cancelled handles in the event loop's timer heap at
    high request rates, about a tenth of the gateway's throughput. A deadline passed cancels the task;
    ``close`` tells that from any other cancellation as ``asyncio.timeout`` does, which is not used: it
    looks up the running loop twice, a ``getpid`` system call each (CPython's check for a fork)."""

    __slots__ = ("_cancelling", "_handle", "_loop", "_queued", "_task", "answer_at", "expired", "first", "first_at",
                 "queue_at", "shed")  # fmt: skip

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task[object],
        first_at: float,
        answer_at: float,
        queue_at: float | None,
        queued: Callable[[], float | None],
    ) -> None:
        self._loop = loop
        self._task = task
        self._cancelling = task.cancelling()
        self.first_at, self.answer_at, self.queue_at = first_at, answer_at, queue_at
        self._queued = queued
        self.first = False
        """The first token came: only the whole answer's deadline is left."""
        self.shed: float | None = None
        """Set when the engine kept the request queued past the admission limit: its predicted wait."""
        self.expired = False  # a deadline passed and the task was cancelled for it
        at = first_at if queue_at is None or queue_at >= first_at else queue_at
        self._handle = loop.call_at(at, self._fire)

    def _fire(self) -> None:
        now = self._loop.time()
        if self.first:
            if now < self.answer_at:  # a whole answer still coming: its own deadline is later
                self._handle = self._loop.call_at(self.answer_at, self._fire)
                return
        elif self.queue_at is not None and now < self.first_at:
            wait = self._queued()
            if wait is None:  # not queueing now: look again shortly, up to the first-token deadline
                self._handle = self._loop.call_at(min(self.first_at, now + RECHECK_S), self._fire)
                return
            self.shed = wait
        self.expired = True
        self._task.cancel()  # the attempt's await raises CancelledError; close() makes it a TimeoutError

    def close(self, failure: BaseException | None = None) -> bool:
        """Stop the timer; True when ``failure`` is the cancellation a passed deadline caused and no
        other cancellation (the client leaving, a lost hedge) is pending: the attempt timed out."""
        self._handle.cancel()
        if not self.expired:
            return False
        self.expired = False
        return self._task.uncancel() <= self._cancelling and isinstance(failure, asyncio.CancelledError)


async def _attempt(
    target: T,
    opening: Opening[T],
    deadlines: Deadlines,
    tracker: Tracker[T],
    tokens: int,
    whole: bool,
    loop: asyncio.AbstractEventLoop,
    answering: set[str] | None = None,
) -> Committed[T]:
    """One backend up to its commit point; any failure is reported, closes its stream and raises a
    ``BackendError``. ``tokens``: the prompt's size, for the tracker's prefill backlog."""
    at_once = opening.at_once(target)
    task = current_task(loop)  # with the loop given: no look-up of the running loop
    if task is None:
        raise RuntimeError("an attempt runs in a task")
    now = loop.time()
    answer_at = now + deadlines.answer_s
    first_at = answer_at if at_once else min(answer_at, now + deadlines.first_token_s)
    queue_at = now + deadlines.queue_s if deadlines.queue_s is not None and not at_once else None
    head: list[Chunk] = []
    tracker.sending(target, tokens)
    stream = opening.open_at(target)
    watch = _Watch(loop, task, first_at, answer_at, queue_at, lambda: tracker.queued(target))
    try:
        try:
            head = await _head(stream)
        except BackendError as refused:
            again = opening.reopen(target, refused)
            if again is None:
                raise
            await _close(stream)
            stream = again
            head = await _head(stream)
        watch.first = True
        tracker.first_token(target, tokens)
        if answering is not None:
            answering.add(target.name)  # a hedge waits no longer for a first token here
        if whole or at_once:  # the commit point is the end: read it all (usage may follow the finish)
            head += await _drained(stream)
        watch.close()
    except BaseException as caught:
        exc: BaseException = TimeoutError() if watch.close(caught) else caught
        await _close(stream)
        backlog = 0 if head else tokens  # the prompt's backlog is gone once its first token came
        phase = "answer" if at_once or watch.first else "first token"
        error = _as_backend_error(exc, target.name, phase, deadlines)
        if watch.shed is not None and isinstance(exc, TimeoutError):
            error = BackendError(
                ErrorKind.OVERLOADED,
                f"backend {target.name} kept this request queued for {deadlines.queue_s:g}s; its queue is long",
                retry_after=max(1.0, watch.shed),
            )
        if error is None:  # cancelled: the client left, or a hedge lost
            tracker.end(target, backlog)
            raise
        tracker.failed(target, error)
        tracker.end(target, backlog)
        raise error from exc
    return Committed(target, head, _NOTHING if whole or at_once else stream, at_once)


async def _drained(stream: AsyncIterator[Chunk]) -> list[Chunk]:
    """The rest of ``stream``: an OpenAI-compatible engine's answer gives it without raising the
    ``StopAsyncIteration`` that ends an ``async for`` (a traceback entry each, in compiled code)."""
    if isinstance(stream, AnswerStream):
        return await stream.rest()
    return [chunk async for chunk in stream]


def _as_backend_error(exc: BaseException, name: str, phase: str, deadlines: Deadlines) -> BackendError | None:
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, TimeoutError):
        limit = deadlines.first_token_s if phase == "first token" else deadlines.answer_s
        return BackendError(ErrorKind.TIMEOUT, f"backend {name} sent no {phase} within {limit:g}s")
    if isinstance(exc, Exception):  # an adapter bug: the gateway's fault; the next backend may answer
        log.error("backend %s failed unexpectedly", name, exc_info=exc)
        return BackendError(ErrorKind.INTERNAL, f"the gateway failed while reading from backend {name}")
    return None


async def start(
    targets: Sequence[T],
    opening: Opening[T],
    deadlines: Deadlines,
    tracker: Tracker[T],
    prompt_tokens: int,
    whole: bool = False,
    hedge_after: float | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> Committed[T]:
    """Commit to the first target that answers; raise the last error if none does (its ``failures``
    list every failed attempt).

    ``whole``: the answer is sent whole, so the commit point is its end. Targets are tried one
    after another; with ``hedge_after`` (seconds), a target whose first token is that late gets
    company: the next target starts too, the first to answer wins and the other is cancelled.
    ``tracker`` hears of every attempt; the committed one's ``end`` is the caller's to report. ``loop``:
    the running one, when the caller has it at hand (``Exchange.loop``): looking it up is a system call."""
    loop = running_loop() if loop is None else loop
    queue = list(targets)
    failures: list[tuple[str, BackendError]] = []
    if hedge_after is None or len(queue) < 2:
        for target in queue:
            try:
                committed = await _attempt(target, opening, deadlines, tracker, prompt_tokens, whole, loop)
            except BackendError as exc:
                _note(failures, target.name, exc)
                continue
            return committed
        raise _exhausted(failures)
    running: dict[asyncio.Task[Committed[T]], T] = {}
    answering: set[str] = set()

    def launch() -> None:
        target = queue.pop(0)
        attempt = _attempt(target, opening, deadlines, tracker, prompt_tokens, whole, loop, answering)
        running[loop.create_task(attempt)] = target

    try:
        while queue or running:
            if not running:
                launch()
            hedge = hedge_after if queue and not answering else None
            done, _ = await asyncio.wait(running, timeout=hedge, return_when=asyncio.FIRST_COMPLETED)
            if not done:  # the first token is late against the budget: hedge with the next target
                if not answering:
                    launch()
                continue
            for task in done:
                target = running.pop(task)
                err = task.exception()
                if err is None:
                    return task.result()
                if not isinstance(err, BackendError):
                    raise err
                _note(failures, target.name, err)
    finally:
        for task in running:  # losers of a hedge, or everything when the client went away
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
            for task, target in running.items():
                if not task.cancelled() and task.exception() is None:  # answered too, but lost the race
                    await task.result().aclose()
                    tracker.end(target)
    raise _exhausted(failures)


def _exhausted(failures: list[tuple[str, BackendError]]) -> BackendError:
    """The error to raise when no target answered: the last one's, carrying every failure."""
    last = failures[-1][1] if failures else BackendError(ErrorKind.CONNECT, "no backend could be tried")
    last.failures = failures
    return last


def _note(failures: list[tuple[str, BackendError]], name: str, exc: BackendError) -> None:
    failures.append((name, exc))
    if not exc.retryable:
        exc.failures = failures
        raise exc


async def _close(stream: AsyncIterator[Chunk]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
