"""What to generate: ``GenerationRequest``, and the clock of one request's wait on its engine.

Compiled (``pyproject.toml``), as the records of ``routing.types`` are: the request path reads its fields
some seventy times a request and builds two (the door's, and the one sized for the chosen backend), so
it writes out its ``__init__`` (see ``values``), hence the ``misc`` code off here. ``backends.base``
re-exports both.
"""

# mypy: disable-error-code="misc"

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from values import value


@dataclass(slots=True)
class EngineClock:
    """Time one request spent waiting on its engine (connecting, generating, on the wire). The gateway
    subtracts it from the request's time in the gateway to report its own overhead."""

    waited_s: float = 0.0


@value(frozen=True)
class GenerationRequest:
    """What to generate, independent of any engine's wire format.

    Exactly one of ``messages`` (chat) and ``prompt`` (completion) is set.
    ``max_tokens`` None means "as many as the context leaves room for".
    ``extra`` holds fields the client sent that OpenAI does not define
    (``ignore_eos``, ``top_k``, ...): engines that know them use them.

    ``messages`` are OpenAI-shaped dicts: ``role``, ``content`` (a string, or a list of parts when it
    holds images: ``{"type": "text", "text"}`` and ``{"type": "image_url", "image_url": {"url"}}``),
    and, kept intact, ``name``, assistant ``tool_calls`` (OpenAI's list, arguments a JSON string) and
    a tool message's ``tool_call_id``. Every capability field is OpenAI's meaning; the routing has
    already sent the request only to a backend whose ``capabilities`` cover what it uses.
    """

    request_id: str
    model: str
    max_tokens: int | None = None
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    tools: tuple[dict[str, Any], ...] = ()
    """OpenAI function tools as the client sent them: ``{"type": "function", "function": {name, description,
    parameters}}``."""
    tool_choice: str | dict[str, Any] | None = None
    """None (the engine's default, "auto" with tools), "none", "auto", "required" or
    ``{"type": "function", "function": {"name": ...}}``."""
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    """None for plain text; ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {name,
    schema, strict}}`` as OpenAI defines them."""
    logprobs: bool = False
    top_logprobs: int = 0
    """Alternatives per token (0..20) when ``logprobs``; for completions, OpenAI's integer ``logprobs``."""
    n: int = 1
    """Choices asked for; a backend without a native ``n`` is asked ``n`` times (``Chunk.index``)."""
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    """Token id to a bias in [-100, 100]."""
    user: str | None = None
    echo: bool = False
    """Completions: the prompt is returned before the answer."""
    continue_final: bool = False
    """Chat: the last message is the assistant's and the answer continues it (an Anthropic prefill): the
    template renders that turn open, without its end-of-turn and without a new generation prompt."""
    stream: bool = False
    """The client reads the answer as it is generated: an engine that can either answer whole or stream
    (Triton's ensemble) streams it then."""
    whole: bool = False
    """The gateway takes this answer whole: nothing of it is needed before its end (the client asked
    for a whole answer and the attempt needs no first token: no hedging, no admission by queue wait).
    An engine that can answer either way (the OpenAI-compatible ones) is then asked for a whole
    answer, which costs it and the gateway less than a stream; the gateway waits for it under the
    whole answer's deadline (``WholeAnswers``)."""
    clock: EngineClock = field(default_factory=EngineClock, compare=False, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """More HTTP headers for this attempt's request to an engine reached over HTTP: the gateway's trace
    context (``traceparent``), which vLLM and TGI continue. Engines in process ignore them."""

    def __init__(
        self,
        request_id: str,
        model: str,
        max_tokens: int | None = None,
        messages: list[dict[str, Any]] | None = None,
        prompt: str | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: tuple[str, ...] = (),
        seed: int | None = None,
        extra: dict[str, Any] | None = None,
        tools: tuple[dict[str, Any], ...] = (),
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        response_format: dict[str, Any] | None = None,
        logprobs: bool = False,
        top_logprobs: int = 0,
        n: int = 1,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        logit_bias: dict[int, float] | None = None,
        user: str | None = None,
        echo: bool = False,
        continue_final: bool = False,
        stream: bool = False,
        whole: bool = False,
        clock: EngineClock | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.request_id = request_id
        self.model = model
        self.max_tokens = max_tokens
        self.messages = messages
        self.prompt = prompt
        self.temperature = temperature
        self.top_p = top_p
        self.stop = stop
        self.seed = seed
        self.extra = {} if extra is None else extra
        self.tools = tools
        self.tool_choice = tool_choice
        self.parallel_tool_calls = parallel_tool_calls
        self.response_format = response_format
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.n = n
        self.presence_penalty = presence_penalty
        self.frequency_penalty = frequency_penalty
        self.logit_bias = logit_bias
        self.user = user
        self.echo = echo
        self.continue_final = continue_final
        self.stream = stream
        self.whole = whole
        self.clock = EngineClock() if clock is None else clock
        self.headers = {} if headers is None else headers

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def sized(self, max_tokens: int) -> GenerationRequest:
        """This request with ``max_tokens`` set, as ``evolve(self, max_tokens=...)`` gives it, compiled: the
        gateway sizes every request that sets no length (``evolve``, interpreted, took 12,700 instructions)."""
        return GenerationRequest(
            self.request_id, self.model, max_tokens, self.messages, self.prompt, self.temperature, self.top_p,
            self.stop, self.seed, self.extra, self.tools, self.tool_choice, self.parallel_tool_calls,
            self.response_format, self.logprobs, self.top_logprobs, self.n, self.presence_penalty,
            self.frequency_penalty, self.logit_bias, self.user, self.echo, self.continue_final, self.stream,
            self.whole, self.clock, self.headers,
        )  # fmt: skip
