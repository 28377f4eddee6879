"""What the in-process engines (CTranslate2, llama.cpp) share.

Both load the same llama GGUF, render chat with its template, generate token
ids in a worker thread and turn ids into text deltas here, on the event loop:

- ``backends.inproc_tokens``: ids to text (``TextAssembler``) and to OpenAI's logprobs (``LogprobMaker``).
- ``backends.inproc_threads``: the blocking token loop on worker threads (``ThreadedGeneration``).
- here: the engine base both share (``InProcessEngine``), context and extra-field checks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from backends.base import (
    BackendError,
    Chunk,
    ErrorKind,
    GenerationRequest,
    Load,
)
from backends.gguf_vocab import Vocabulary
from backends.inproc_threads import ThreadedGeneration, TokenLoop
from backends.inproc_tokens import LogprobMaker, TokenStrings, piece_table
from backends.text import ChatRenderer
from backends.tool_calls import answer_end

if TYPE_CHECKING:
    pass


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
