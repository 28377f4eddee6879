"""The engine's answer to one OpenAI-compatible request as ``Chunk``s, read as the engine's bytes arrive.

An iterator class, not an async generator: mypyc compiles no async generators, and every stream's every
read passes here (``pyproject.toml`` compiles it).

A reader that can take chunks without waiting (``push_to``: the client's stream, when it can write
at once) gets them in the engine connection's own callback as the bytes arrive, while its task stays
parked in one wait: a stream paced by the engine's decoding otherwise wakes the task for every event
(a future resolved, the task scheduled, resumed and parked again), which cost about a microsecond of
the roughly fifteen an event costs a proxy end to end. Anything else (the answer's end, a failure, a
chunk the reader declines) wakes the task, which goes on as if it had read the chunks itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from backends import http_errors
from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest
from backends.event_batches import json_doc
from backends.httpclient import Response
from backends.openai_answer import Answer, AnswerEngine
from backends.openai_events import TextBatches

_START, _READING, _ENDING, _DONE = 0, 1, 2, 3


class AnswerStream:
    """The engine's answer to one request as ``Chunk``s. The request goes out at the first ``__anext__``
    (as with an async generator); the response is released when the answer ended or failed, or on
    ``aclose`` (leaving before the body's end closes the connection: how engines learn of a cancel)."""

    __slots__ = ("_answer", "_batches", "_engine", "_i", "_pending", "_raised", "_request", "_response", "_sink",
                 "_state", "_texts")  # fmt: skip

    def __init__(self, engine: AnswerEngine, request: GenerationRequest) -> None:
        self._engine = engine
        self._request = request
        self._answer = Answer(request, engine)
        self._pending: list[Chunk] = []
        self._i = 0
        self._state = _START
        self._response: Response | None = None
        self._batches: TextBatches | None = None
        self._sink: Callable[[Chunk], bool] | None = None
        self._texts: Callable[[list[str]], bool] | None = None
        self._raised: BaseException | None = None  # what the connection's callback met, for the task

    def push_to(self, sink: Callable[[Chunk], bool], texts: Callable[[list[str]], bool] | None = None) -> None:
        """Chunks that arrive while the reader waits in ``__anext__`` go to ``sink`` at once, in order,
        until it says False (that chunk, and the rest, then come from ``__anext__``). ``sink`` runs in
        the connection's callback: it must not block, and what it raises comes out of ``__anext__``.
        ``texts``: takes a read of deltas of text alone of choice 0 (most reads of a decode-paced
        stream) as their texts, without a ``Chunk`` (on the same terms; when it says False, the chunk
        ``sink`` would have had comes from ``__anext__``)."""
        self._sink = sink
        self._texts = texts

    def __aiter__(self) -> AnswerStream:
        return self

    async def __anext__(self) -> Chunk:
        while True:
            pending, i = self._pending, self._i
            if i < len(pending):
                self._i = i + 1
                return pending[i]
            state = self._state
            if state == _READING:
                waiting = self._read()
                if waiting is not None:
                    try:
                        await waiting
                    except BaseException as exc:
                        self._state = _DONE
                        error = self._failure(exc)
                        if error is exc:
                            raise
                        raise error from exc
                    raised = self._raised
                    if raised is not None:
                        self._raised = None
                        raise raised
            elif state == _START:
                await self._open()
            elif state == _ENDING:
                self._state = _DONE
                self._pending, self._i = self._answer.ends(), 0
            else:
                raise StopAsyncIteration

    async def rest(self) -> list[Chunk]:
        """Every chunk still to come, read to the answer's end: what ``[c async for c in stream]``
        collects, without the ``StopAsyncIteration`` (a traceback entry each, raised through compiled
        code) that ends it. Until the answer is over, ``__anext__`` always has a chunk to give (an
        answer's end gives one per choice), so it is only asked while the answer is not."""
        out: list[Chunk] = []
        while True:
            pending, i = self._pending, self._i
            if i < len(pending):
                out += pending[i:] if i else pending
                self._i = len(pending)
            if self._state == _DONE:
                return out
            out.append(await self.__anext__())

    async def aclose(self) -> None:
        self._state = _DONE
        self._pending = []
        self._release()

    async def _open(self) -> None:
        engine, request = self._engine, self._request
        self._state = _DONE  # a failure before the answer's first chunk ends it
        path = "/v1/chat/completions" if request.messages is not None else "/v1/completions"
        payload = engine.payload(request)
        response = self._response = await engine.opened(request, path, payload)
        if payload["stream"]:
            self._batches = TextBatches(engine, response, request.clock, engine.trusts_event_status)
            self._state = _READING
            return
        try:
            doc = json_doc(engine.name, (await engine.read_body(response, request.clock)).decode("utf-8", "replace"))
            if isinstance(doc, dict) and "error" in doc:  # an error in a 200 answer, as in a stream
                raise http_errors.from_event(engine.name, doc, engine.trusts_event_status)
            if not isinstance(doc, dict):
                raise BackendError(ErrorKind.PROTOCOL, f"{engine.name}: unexpected answer {str(doc)[:200]}")
            self._pending, self._i = self._answer.read([doc], True), 0
        finally:
            self._release()
        self._state = _ENDING

    def _read(self) -> asyncio.Future[None] | None:
        """The chunks of the events that have arrived, into ``_pending``; else the wait for more, to
        await in ``__anext__`` (one await between the engine's bytes and the client's stream)."""
        batches = self._batches
        if batches is None:
            raise RuntimeError("an answer read before it was opened")
        try:
            batch = batches.next_batch()
            if batch is None:
                if not batches.ended:
                    return batches.wait(None if self._sink is None else self._pushed)
                self._release()
                self._state = _ENDING
                return None
            self._took(batches, batch)
        except BaseException:
            self._release()
            self._state = _DONE
            raise
        return None

    def _took(self, batches: TextBatches, batch: list[object]) -> None:
        over = batches.over  # the end is in hand: the batch's chunks go out with the answer's last ones
        self._pending, self._i = self._answer.read(batch, over), 0
        self._ending(over)

    def _ending(self, over: bool) -> None:
        if over or (not self._engine.ask_usage and self._answer.finished()):
            self._release()  # read whole, or nothing more worth reading: closing also stops the engine
            self._state = _ENDING

    def _pushed(self) -> bool:
        """The connection's listener while the reader waits: the events that arrived, read and given to
        the sink. True when all went and the answer goes on (the wait goes on); False to wake the task
        (the answer's end, a failure, a chunk the sink declined, an event that needs the task)."""
        batches, sink = self._batches, self._sink
        if batches is None or sink is None or self._state != _READING or self._i < len(self._pending):
            return False
        try:
            batch = batches.next_batch()
            if batch is None:
                if batches.ended:
                    return False
                batches.wait_on()  # part of an event: wait for the rest
                return True
            texts = None if self._texts is None or batches.over else self._answer.texts(batch)
            if texts is not None:
                self._pending, i = self._pushed_texts(texts), 0
                pending = self._pending
            else:
                self._took(batches, batch)
                pending, i = self._pending, 0
                while i < len(pending) and sink(pending[i]):
                    i += 1
            self._i = i
        except BaseException as exc:  # raised by the task, where the reader expects it
            self._release()
            self._state = _DONE
            self._pending, self._i = [], 0
            self._raised = exc
            return False
        if i < len(pending) or self._state != _READING or not batches.reading:
            return False  # an error event's failure is the task's to raise, at once
        batches.wait_on()
        return True

    def _pushed_texts(self, texts: list[str]) -> list[Chunk]:
        """A read of text alone given to the ``texts`` sink: what is left for the task (the chunk, when
        the sink declined it)."""
        self._ending(False)
        taker = self._texts
        if texts and taker is not None and not taker(texts):
            return [self._answer.text_chunk(texts)]
        return []

    def _failure(self, exc: BaseException) -> BaseException:
        """What a failed wait for the engine's bytes raises; the response is closed."""
        batches = self._batches
        self._response = None
        return exc if batches is None else batches.failure(exc)

    def _release(self) -> None:
        response = self._response
        if response is not None:
            self._response = None
            response.release()
