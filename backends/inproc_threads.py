"""A blocking engine's token loop on worker threads, its steps streamed to the event loop as chunks.

``ThreadedGeneration`` runs a token loop in a thread (bounded concurrency, a bounded queue), hands ids to
the event loop, and stops the loop when the consumer goes away. A token's logprobs ride on the first
chunk that carries any of its text: text held back (part of a character, or what may become a stop
string) keeps its tokens' logprobs waiting until it is sent; when a stop string cuts the answer, the
tokens read up to the one that completed it go on the last text chunk, so there is one entry per
completion token (end tokens, never counted, have none).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeAlias

from backends.base import BackendError, Chunk, EngineClock, ErrorKind, GenerationRequest, TokenLogprob, Usage
from backends.inproc_tokens import TextAssembler

Step: TypeAlias = "int | tuple[int, TokenLogprob]"
"""What a token loop yields: a token id, or the id with its logprobs when the request asked for them."""

TokenLoop: TypeAlias = "Callable[[Callable[[], bool]], Iterable[Step]]"
"""``token_loop(cancelled)``: the engine's blocking generation, run on a worker thread."""


def _chunk(text: str, pending: list[TokenLogprob]) -> Chunk:
    if not pending:
        return Chunk(text=text)
    chunk = Chunk(text=text, logprobs=tuple(pending))
    pending.clear()
    return chunk


_DONE = object()


class _Answer:
    """The consumer's side of one generation: steps (token ids, with logprobs) in, chunks out."""

    def __init__(
        self, text: TextAssembler, stop_ids: frozenset[int], ignore_eos: bool, ended: Callable[[str], bool] | None
    ) -> None:
        self.text = text
        self.stop_ids = stop_ids
        self.ignore_eos = ignore_eos
        self.ended = ended
        self.pending: list[TokenLogprob] = []  # logprobs of tokens whose text is not sent yet
        self.completion = 0
        self.finish = "length"

    def take(self, item: Any) -> tuple[Chunk | None, bool]:
        """What to send for this step (if anything), and whether the answer is over."""
        if type(item) is tuple:
            item, logprob = item
            if item not in self.stop_ids or self.ignore_eos:
                self.pending.append(logprob)
        if item in self.stop_ids and not self.ignore_eos:
            self.finish = "stop"
            return None, True
        self.completion += 1
        delta = self.text.feed(item)
        if self.text.stopped:
            self.finish = "stop"
            return (_chunk(delta, self.pending) if delta or self.pending else None), True
        if not delta:
            return None, False
        chunk = _chunk(delta, self.pending)
        if self.ended is not None and self.ended(delta):
            self.finish = "stop"
            return chunk, True
        return chunk, False

    def last(self, prompt_tokens: int) -> Chunk:
        """The closing chunk: what the decoder held back, why the answer ended, and its usage."""
        text = self.text
        tail = "" if text.stopped else text.flush()
        usage = Usage(prompt_tokens, self.completion)
        return Chunk(
            text=tail, finish_reason=self.finish, usage=usage, logprobs=tuple(self.pending), stop_sequence=text.matched
        )


class ThreadedGeneration:
    """Bounded concurrency for a blocking engine: ``slots`` workers, ``max_queue`` waiters."""

    def __init__(self, name: str, slots: int, max_queue: int) -> None:
        self._name = name
        self._slots = asyncio.Semaphore(slots)
        self._waiting = 0
        self._max_queue = max_queue
        self._pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix=f"engine-{name}")
        self._count_lock = threading.Lock()
        self.generated_tokens = 0
        self.running = 0

    @property
    def waiting(self) -> int:
        return self._waiting

    async def run(
        self,
        request: GenerationRequest,
        token_loop: TokenLoop,
        prompt_tokens: int,
        pieces: list[bytes],
        stop_ids: frozenset[int],
        max_tokens: int,
        echo: str = "",
        ended: Callable[[str], bool] | None = None,
    ) -> AsyncIterator[Chunk]:
        """Stream chunks from ``token_loop(cancelled)``, an iterator of steps run in a worker thread;
        ``echo`` (the prompt, for completions that ask for it) comes first, once a worker has the request.
        ``ended``, fed the text as it is sent, stops the generation when it says the answer is over (a
        tool call followed by text no call grammar allows: ``tool_calls.answer_end``)."""
        clock = request.clock
        await self._admit(clock)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()
        ignore_eos = bool(request.extra.get("ignore_eos", False))
        self._start(queue, cancel, token_loop, max_tokens, stop_ids, ignore_eos)
        answer = _Answer(TextAssembler(pieces, request.stop), stop_ids, ignore_eos, ended)
        try:
            if echo:
                yield Chunk(text=echo)
            while True:
                waiting = time.perf_counter()
                item = await queue.get()
                clock.waited_s += time.perf_counter() - waiting
                if item is _DONE:
                    break
                if isinstance(item, Exception):
                    raise BackendError(ErrorKind.UPSTREAM, f"{self._name}: {item}") from item
                chunk, done = answer.take(item)
                if chunk is not None:
                    yield chunk
                if done:
                    break
            yield answer.last(prompt_tokens)
        finally:
            cancel.set()

    async def _admit(self, clock: EngineClock) -> None:
        """Wait for a worker (counted as the request's wait); overloaded when the queue is full too."""
        if self._slots.locked() and self._waiting >= self._max_queue:
            raise BackendError(ErrorKind.OVERLOADED, f"backend {self._name} is at capacity", retry_after=1.0)
        queued = time.perf_counter()
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
            clock.waited_s += time.perf_counter() - queued

    def _start(
        self,
        queue: asyncio.Queue[Any],
        cancel: threading.Event,
        token_loop: TokenLoop,
        max_tokens: int,
        stop_ids: frozenset[int],
        ignore_eos: bool,
    ) -> None:
        """Run ``token_loop`` in a worker thread, each step put on ``queue``, then ``_DONE``; the worker's
        slot is released when the thread ends, whatever the consumer does meanwhile."""
        loop = asyncio.get_running_loop()

        def work() -> None:
            try:
                for n, step in enumerate(token_loop(cancel.is_set), start=1):
                    if cancel.is_set():
                        break
                    with self._count_lock:
                        self.generated_tokens += 1
                    loop.call_soon_threadsafe(queue.put_nowait, step)
                    token_id = step if isinstance(step, int) else step[0]
                    if n >= max_tokens or (token_id in stop_ids and not ignore_eos):
                        break
            except Exception as exc:  # handed to the consumer, who raises it as a BackendError
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)

        self.running += 1
        future = self._pool.submit(work)

        def release(_: object) -> None:
            if loop.is_closed():  # the consumer's loop ended first (asyncio.run returned): nothing to race with
                self._release()
            else:
                loop.call_soon_threadsafe(self._release)

        future.add_done_callback(release)

    def _release(self) -> None:
        self.running -= 1
        self._slots.release()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
