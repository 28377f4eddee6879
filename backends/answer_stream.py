"""The engine's answer to one OpenAI-compatible request as ``Chunk``s, read as the engine's bytes arrive.

An iterator class, not an async generator: mypyc compiles no async generators, and every stream's every
read passes here (``pyproject.toml`` compiles it).
"""

from __future__ import annotations

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

    __slots__ = ("_answer", "_batches", "_engine", "_i", "_pending", "_request", "_response", "_state")

    def __init__(self, engine: AnswerEngine, request: GenerationRequest) -> None:
        self._engine = engine
        self._request = request
        self._answer = Answer(request, engine)
        self._pending: list[Chunk] = []
        self._i = 0
        self._state = _START
        self._response: Response | None = None
        self._batches: TextBatches | None = None

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
                await self._read()
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

    async def _read(self) -> None:
        batches = self._batches
        if batches is None:
            raise RuntimeError("an answer read before it was opened")
        answer = self._answer
        try:
            batch = await batches.__anext__()
            over = batches.over  # the end is in hand: the batch's chunks go out with the answer's last ones
            self._pending, self._i = answer.read(batch, over), 0
        except StopAsyncIteration:
            self._release()
            self._state = _ENDING
            return
        except BaseException:
            self._release()
            self._state = _DONE
            raise
        if over or (not self._engine.ask_usage and answer.finished()):
            self._release()  # read whole, or nothing more worth reading: closing also stops the engine
            self._state = _ENDING

    def _release(self) -> None:
        response = self._response
        if response is not None:
            self._response = None
            response.release()
