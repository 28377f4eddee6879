"""What the in-process engines (CTranslate2, llama.cpp) share.

Both load the same llama GGUF, render chat with its template, generate token
ids in a worker thread and turn ids into text deltas here, on the event loop:

- ``TextAssembler`` maps ids to bytes with llama.cpp's piece rules, decodes
  UTF-8 incrementally, and holds back text that may still become a stop
  string (``StopStrings``), so no engine streams half a character or part of a stop.
- ``ThreadedGeneration`` runs a blocking token loop in a thread, hands ids to
  the event loop, and stops the loop when the consumer goes away.
- ``LogprobMaker`` turns an engine's per-step numbers into OpenAI's logprobs on the
  worker thread (a log-softmax over the vocabulary is CPU work: never the event loop's).
  A token's logprobs ride on the first chunk that carries any of its text: text held
  back (part of a character, or what may become a stop string) keeps its tokens'
  logprobs waiting until it is sent; when a stop string cuts the answer, the tokens read
  up to the one that completed it go on the last text chunk, so there is one entry per
  completion token (end tokens, never counted, have none).
"""

from __future__ import annotations

import asyncio
import codecs
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeAlias

from backends.base import (
    BackendError,
    Chunk,
    EngineClock,
    ErrorKind,
    GenerationRequest,
    Load,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from backends.gguf_vocab import TOKEN_BYTE, TOKEN_NORMAL, TOKEN_USER_DEFINED, Vocabulary
from backends.text import ChatRenderer, StopStrings
from backends.tool_calls import answer_end

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

SPACE = "\u2581"

Step: TypeAlias = "int | tuple[int, TokenLogprob]"
"""What a token loop yields: a token id, or the id with its logprobs when the request asked for them."""

TokenLoop: TypeAlias = "Callable[[Callable[[], bool]], Iterable[Step]]"
"""``token_loop(cancelled)``: the engine's blocking generation, run on a worker thread."""


def piece_table(vocab: Vocabulary) -> list[bytes]:
    """Bytes each token id prints as: control and unknown tokens print nothing."""
    table: list[bytes] = []
    for tok, ttype in zip(vocab.tokens, vocab.types, strict=True):
        if ttype == TOKEN_BYTE:
            table.append(bytes([int(tok[3:-1], 16)]))
        elif ttype in (TOKEN_NORMAL, TOKEN_USER_DEFINED):
            table.append(tok.replace(SPACE, " ").encode())
        else:
            table.append(b"")
    return table


def _token_string(piece: bytes, name: str) -> tuple[str, tuple[int, ...]]:
    """OpenAI's ``token`` and ``bytes`` for one id. A control token prints nothing, so it goes by its
    name (an alternative may be ``</s>``); a piece that is not whole UTF-8 (a byte token) is spelt
    ``bytes:\\xNN`` as OpenAI spells such tokens."""
    if not piece:
        return name, tuple(name.encode())
    try:
        return piece.decode(), tuple(piece)
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in piece), tuple(piece)


class TokenStrings:
    """Each id's token string and bytes for logprobs, built on first use (O(vocabulary), once)."""

    def __init__(self, vocab: Vocabulary, pieces: list[bytes]) -> None:
        self._names = vocab.tokens
        self._pieces = pieces

    @cached_property
    def table(self) -> list[tuple[str, tuple[int, ...]]]:
        return [_token_string(p, name) for p, name in zip(self._pieces, self._names, strict=True)]


class LogprobMaker:
    """Builds ``TokenLogprob``s on the worker thread: from the engine's own log probability of the chosen
    token, or from the step's logits over the whole vocabulary (a log-softmax and ``top`` passes of
    argmax: O(vocabulary) per token, in numpy)."""

    def __init__(self, strings: TokenStrings, top: int) -> None:
        self._strings = strings  # its table is built by the first worker that needs it, never on the loop
        self.top = top

    def known(self, token_id: int, logprob: float) -> TokenLogprob:
        token, raw = self._strings.table[token_id]
        return TokenLogprob(token, logprob, raw)

    def from_logits(self, logits: npt.ArrayLike, token_id: int) -> TokenLogprob:
        import numpy as np

        row: npt.NDArray[np.float32] = np.asarray(logits, dtype=np.float32).reshape(-1)
        peak = row.max()
        norm = float(peak + np.log(np.exp(row - peak).sum()))
        table = self._strings.table
        token, raw = table[token_id]
        top: tuple[TopLogprob, ...] = ()
        if self.top:
            # k passes of argmax: exact, in order, ties to the lower id, and about four times faster than
            # argpartition for k <= 20 over a 128k vocabulary (0.2-0.7 ms against 2.7 ms).
            work = row.copy()
            alternatives = []
            for _ in range(min(self.top, row.size)):
                i = int(work.argmax())
                if work[i] == -np.inf:
                    break  # the rest cannot be generated at all
                work[i] = -np.inf
                name, spelt = table[i]
                alternatives.append(TopLogprob(name, float(row[i]) - norm, spelt))
            top = tuple(alternatives)
        return TokenLogprob(token, float(row[token_id]) - norm, raw, top)


class TextAssembler:
    """Turns generated ids into safe-to-send text deltas, honouring stop strings."""

    def __init__(self, pieces: list[bytes], stop: Iterable[str]) -> None:
        self._pieces = pieces
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopStrings(stop)

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    @property
    def matched(self) -> str | None:
        """The stop string that ended the text, once ``stopped``."""
        return self._stops.matched

    def feed(self, token_id: int) -> str:
        """Text that may be sent now; sets ``stopped`` when a stop string completes."""
        return self._stops.feed(self._decoder.decode(self._pieces[token_id]))

    def flush(self) -> str:
        """At the end of generation: whatever was held back is plain text after all."""
        # The decoder's last characters first: fed after the flush, a partial stop among them was lost.
        out = self._stops.feed(self._decoder.decode(b"", final=True))
        return out + self._stops.flush()


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


def check_context(request: GenerationRequest, prompt_tokens: int, context: int) -> int:
    """The output budget this request may use; an error when the prompt leaves no room for it."""
    room = context - prompt_tokens
    param = "messages" if request.messages is not None else "prompt"
    if request.max_tokens is None:
        if room <= 0:
            raise BackendError(
                ErrorKind.CONTEXT_LENGTH,
                f"This model's maximum context length is {context} tokens. "
                f"However, your {param} resulted in {prompt_tokens} tokens.",
                param=param,
            )
        return room
    if request.max_tokens > room:
        raise BackendError(
            ErrorKind.CONTEXT_LENGTH,
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + request.max_tokens} tokens ({prompt_tokens} in the {param}, "
            f"{request.max_tokens} in the completion). Please reduce the length of the {param} or completion.",
            param=param,
        )
    return request.max_tokens


def seed32(seed: int) -> int:
    """OpenAI's seed (any integer) as the engines' unsigned 32 bits, never 0xFFFFFFFF (llama.cpp's "random")."""
    return seed % 0xFFFFFFFF


def _extra(request: GenerationRequest, name: str, types: tuple[type, ...]) -> Any:
    # Engine-specific fields arrive untyped from the client: a string must not reach the engine's C code.
    value = request.extra.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
        raise BackendError(ErrorKind.BAD_REQUEST, f"'{name}' must be a number", param=name)
    return value


def extra_int(request: GenerationRequest, name: str, default: int) -> int:
    """An integer engine-specific field (``top_k``, ``min_tokens``, ...), else a 400 naming it."""
    value = _extra(request, name, (int,))
    return default if value is None else int(value)


def extra_float(request: GenerationRequest, name: str, default: float) -> float:
    """A numeric engine-specific field (``min_p``, ``repetition_penalty``, ...), else a 400 naming it."""
    value = _extra(request, name, (int, float))
    return default if value is None else float(value)


def _tool_history(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


class InProcessEngine:
    """What both in-process backends share: one GGUF vocabulary, its chat template, a worker pool.

    Subclasses tokenize, build the engine's token loop and implement ``health``
    and ``generate``; text assembly, concurrency and cancellation live here.
    """

    def __init__(
        self, name: str, model_name: str, vocab: Vocabulary, context_length: int, slots: int, max_queue: int
    ) -> None:
        self.name = name
        self.context_length = context_length
        self._model_name = model_name
        self._vocab = vocab
        self._pieces = piece_table(vocab)
        self._strings = TokenStrings(vocab, self._pieces)
        self._stop_ids = frozenset(vocab.stop_ids)
        self._tool_format: str | None = None
        """How the model writes tool calls (the model's ``tool_parser``): an answer ends after its calls."""
        self.use_template(vocab.chat_template)
        self._workers = ThreadedGeneration(name, slots, max_queue)

    @property
    def generated_tokens(self) -> int:
        return self._workers.generated_tokens

    def models(self) -> list[str]:
        return [self._model_name]

    async def load(self) -> Load | None:
        return Load(running=self._workers.running, waiting=self._workers.waiting)

    async def aclose(self) -> None:
        self._workers.shutdown()

    def use_template(self, template: str | None) -> None:
        """Render chat with ``template`` (the GGUF's; ChatML with tools when it has none)."""
        self._chat = ChatRenderer(template)
        # A template that never mentions them would drop tools and tool-call history without a word.
        self._template_takes_tools = template is None or ("tools" in template and "tool_calls" in template)

    def prompt_text(self, request: GenerationRequest) -> str:
        """The prompt as text: chat through the model's template, with the request's tools (the gateway
        parses the calls the model writes). ``tool_choice: none`` leaves them out, so the model is not
        invited to write a call nobody will read."""
        if request.messages is None:
            return request.prompt or ""
        tools = request.tools if request.tool_choice != "none" else ()
        if not self._template_takes_tools and (tools or _tool_history(request.messages)):
            raise BackendError(
                ErrorKind.BAD_REQUEST,
                f"this backend's chat template of {self._model_name} does not render tools",
                param="tools" if tools else "messages",
                retryable=True,  # another backend of the model may render them with its own template
            )
        return self._chat.render(request.messages, tools=tools or None, continue_final=request.continue_final)

    def logprob_maker(self, request: GenerationRequest) -> LogprobMaker | None:
        """Where the worker builds logprobs, when the request asked for them."""
        return LogprobMaker(self._strings, request.top_logprobs) if request.logprobs else None

    def stream(self, request: GenerationRequest, prompt_tokens: int, token_loop: TokenLoop) -> AsyncIterator[Chunk]:
        """Checks the context room, then streams what ``token_loop`` generates on a worker thread."""
        max_tokens = check_context(request, prompt_tokens, self.context_length)
        echo = (request.prompt or "") if request.echo and request.messages is None else ""
        offered = request.messages is not None and bool(request.tools) and request.tool_choice != "none"
        ended = answer_end(self._tool_format) if self._tool_format is not None and offered else None
        return self._workers.run(
            request, token_loop, prompt_tokens, self._pieces, self._stop_ids, max_tokens, echo, ended
        )
