"""One conformance suite, run against every adapter: real engines where they run here, contract fakes otherwise."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from backends.base import Backend, BackendError, Chunk, ErrorKind, GenerationRequest, Tokenizing, WholeAnswers
from backends.capabilities import PREFILL, capabilities_of
from tests.conftest import GREETING_REPLY, ZEN_CONTINUATION, ZEN_PROMPT
from tests.contract.control import GENERIC_FAULTS, FakeControl
from tests.contract.subjects import ALL, Subject, closed_port_url, subject
from tests.polling import eventually, eventually_async, settles, wait_until

T = TypeVar("T")
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module", params=ALL)
def subj(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Subject]:
    def real_engine(name: str) -> str:
        return str(request.getfixturevalue(f"{name}_url"))

    with subject(request.param, tmp_path_factory.mktemp(request.param), real_engine) as s:
        yield s


def run(subj: Subject, body: Callable[[Backend], Awaitable[T]], **make: Any) -> T:
    async def go() -> T:
        backend = subj.make(**make)
        try:
            return await body(backend)
        finally:
            await backend.aclose()

    return asyncio.run(go())


def req(**kw: Any) -> GenerationRequest:
    kw.setdefault("temperature", 0.0)
    return GenerationRequest(request_id="t", model="enginegate-demo", **kw)


async def collect(backend: Backend, request: GenerationRequest) -> list[Chunk]:
    return [c async for c in backend.generate(request)]


def text_of(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks)


def deltas(chunks: list[Chunk]) -> int:
    """Text deltas as the engine sent them (those that arrived in one read are one chunk's ``pieces``)."""
    return sum(len(c.pieces) or 1 for c in chunks if c.text)


def test_chat_greedy_answer(subj: Subject) -> None:
    chunks = run(subj, lambda b: collect(b, req(messages=HELLO, max_tokens=60)))
    assert text_of(chunks) == GREETING_REPLY
    assert chunks[-1].finish_reason == "stop"
    assert all(c.finish_reason is None for c in chunks[:-1])
    if subj.streams:
        assert deltas(chunks) > 5, "a streaming engine streams"


def test_a_streamed_request_streams_with_its_finish_and_usage(subj: Subject) -> None:
    chunks = run(subj, lambda b: collect(b, req(messages=HELLO, max_tokens=8, stream=True)))
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage is not None
    assert all(c.finish_reason is None for c in chunks[:-1])
    if subj.streams_when_asked:
        assert deltas(chunks) > 3, "a request whose client streams is streamed"
    if subj.exact_usage or subj.streams_when_asked:  # a stream counts its tokens as they come
        assert chunks[-1].usage.completion_tokens == 8


def test_completion_greedy_answer(subj: Subject) -> None:
    chunks = run(subj, lambda b: collect(b, req(prompt=ZEN_PROMPT, max_tokens=40)))
    assert text_of(chunks).startswith(ZEN_CONTINUATION)
    assert chunks[-1].finish_reason == "length"


@pytest.mark.parametrize("stop", ["Simple", "Simple is"])
def test_stop_string_ends_the_answer_and_is_not_included(subj: Subject, stop: str) -> None:
    chunks = run(subj, lambda b: collect(b, req(prompt=ZEN_PROMPT, max_tokens=40, stop=(stop,))))
    assert text_of(chunks) == " ugly.\nExplicit is better than implicit.\n"
    assert chunks[-1].finish_reason == "stop"
    usage = chunks[-1].usage
    # About 12 tokens up to the stop: the usage is of the answer, not of all 40 an engine may have made.
    assert usage is not None and 0 < usage.completion_tokens < 20, usage


def test_max_tokens_reached_is_length_with_usage(subj: Subject) -> None:
    chunks = run(subj, lambda b: collect(b, req(messages=HELLO, max_tokens=5)))
    assert chunks[-1].finish_reason == "length"
    assert GREETING_REPLY.startswith(text_of(chunks)) and text_of(chunks)
    usage = chunks[-1].usage
    assert usage is not None
    if subj.exact_usage:
        assert usage.completion_tokens == 5
        assert usage.prompt_tokens == 16
    else:
        assert usage.completion_tokens > 0 and usage.prompt_tokens > 0


def test_cancellation_reaches_the_engine(subj: Subject) -> None:
    if subj.engine is not None:
        subj.engine.token_delay_s = 0.005  # a GPU's pace: 3000 tokens would take 15 s
    max_tokens = 3000

    async def body(backend: Backend) -> float:
        streams = bool(subj.streams_when_asked)  # a client that streams: streamed wherever the engine can
        request = req(prompt="The Zen", max_tokens=max_tokens, extra={"ignore_eos": True}, stream=streams)
        stream = backend.generate(request)
        if streams:
            got = 0
            async for chunk in stream:
                got += bool(chunk.text)
                if got == 2:
                    break
            await stream.aclose()  # type: ignore[attr-defined]
        else:
            task = asyncio.ensure_future(collect(backend, request))
            await eventually(lambda: subj.engine_tokens() > before, message="the engine never started")
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return subj.engine_tokens()

    try:
        before = subj.engine_tokens()
        at_close = run(subj, body)
        if subj.cancellable:
            # Ran to the end or not is read from the engine's own counter: it must come to rest, soon.
            kept_on = "the engine kept generating after the stream was closed"
            at_rest = settles(subj.engine_tokens, quiet_s=0.4, interval=0.05, message=kept_on)
            assert at_rest - before < max_tokens / 2, "the engine ran the request to its end"
        else:
            # The engine has no cancellation: the adapter closed its connection, the engine runs on.
            wait_until(lambda: subj.engine_tokens() > at_close, timeout=10, message="the engine stopped")
    finally:
        if subj.engine is not None:
            subj.engine.token_delay_s = 0.0


def test_context_overflow_maps_to_what_the_engine_makes_knowable(subj: Subject) -> None:
    long_prompt = req(prompt="Beautiful is better than ugly. " * 2000, max_tokens=16)
    if subj.context_error is None:  # the engine answers anyway (MII's OpenAI server)
        assert run(subj, lambda b: collect(b, long_prompt))[-1].finish_reason is not None
    else:
        with pytest.raises(BackendError) as info:
            run(subj, lambda b: collect(b, long_prompt))
        assert info.value.kind is subj.context_error
        assert info.value.retryable is (subj.context_error is not ErrorKind.CONTEXT_LENGTH)


def test_unreachable_engine_is_connect_error(subj: Subject) -> None:
    if subj.name in ("ctranslate2", "llama_cpp"):
        pytest.skip("in process: nothing to connect to")
    with pytest.raises(BackendError) as info:
        run(subj, lambda b: collect(b, req(messages=HELLO, max_tokens=5)), url=closed_port_url())
    assert info.value.kind is ErrorKind.CONNECT and info.value.retryable


def test_engine_faults_map_to_error_kinds(subj: Subject) -> None:
    if subj.control is None:
        pytest.skip("a real engine: its failures are exercised by the context and connect tests")
    for fault, kind in subj.faults.items():
        subj.control.fail_next = fault
        with pytest.raises(BackendError) as info:
            run(subj, lambda b: collect(b, req(messages=HELLO, max_tokens=8)))
        assert info.value.kind is kind, (fault, info.value)
        subj.control.fail_next = None


def test_slow_first_token_is_a_timeout(subj: Subject) -> None:
    if subj.control is None:
        pytest.skip("a real engine: no way to slow it down on purpose")
    subj.control.delay_s = 2.0
    try:
        with pytest.raises(BackendError) as info:
            run(subj, lambda b: collect(b, req(messages=HELLO, max_tokens=8)), read_timeout_s=0.3)
    finally:
        subj.control.delay_s = 0.0
    assert info.value.kind is ErrorKind.TIMEOUT and info.value.retryable


def test_health_and_load(subj: Subject) -> None:
    async def probe(backend: Backend) -> tuple[bool, Any]:
        return (await backend.health()).ok, await backend.load()

    def idle() -> bool:
        ok, load = run(subj, probe)
        # None: no gauges of its own, the gateway's count stands in (routing.load)
        return ok and (load is None or (load.running == 0 and load.waiting == 0))

    # Idle and healthy, polled: a request an earlier test gave up on may still be winding down.
    wait_until(idle, timeout=10, message="the engine never reported itself healthy and idle")
    if subj.control is not None and subj.health_can_fail:
        subj.control.healthy = False
        try:
            assert not run(subj, probe)[0]
        finally:
            subj.control.healthy = True


def fake_only(subj: Subject) -> FakeControl:
    if subj.control is None:
        pytest.skip("a real engine: no fault control")
    return subj.control


def test_backend_says_whether_it_answers_whole(subj: Subject) -> None:
    """To a client that does not stream; one that streams is streamed to wherever the engine can."""

    async def probe(backend: Backend) -> tuple[bool, bool]:
        def whole(request: GenerationRequest) -> bool:
            return isinstance(backend, WholeAnswers) and backend.answers_whole(request)

        return whole(req(prompt="x")), whole(req(prompt="x", stream=True))

    assert run(subj, probe) == (not subj.streams, not subj.streams_when_asked)


ASKED_WHOLE = {"vllm", "llama_server", "trtllm_serve"}
"""OpenAI-compatible engines asked ``stream: false`` when the gateway takes the answer whole."""


def test_an_answer_taken_whole_is_asked_whole_where_the_engine_can(subj: Subject) -> None:
    async def probe(backend: Backend) -> bool:
        return isinstance(backend, WholeAnswers) and backend.answers_whole(req(prompt="x", whole=True))

    assert run(subj, probe) == (subj.name in ASKED_WHOLE or not subj.streams)


WHOLE_CASES = {
    "chat": {"messages": HELLO, "max_tokens": 60},
    "length": {"messages": HELLO, "max_tokens": 5},
    "completion": {"prompt": ZEN_PROMPT, "max_tokens": 40},
    "stop": {"prompt": ZEN_PROMPT, "max_tokens": 40, "stop": ("never", "Simple is")},
}


@pytest.mark.parametrize("case", sorted(WHOLE_CASES))
def test_an_answer_asked_whole_is_the_streamed_answer(subj: Subject, case: str) -> None:
    """Text, finish reason, the stop string named and usage (cached tokens included) are the same whether
    the engine streamed the answer or answered it whole."""

    def summary(chunks: list[Chunk]) -> tuple[str, str | None, str | None, Any, bool]:
        last = chunks[-1]
        usage = last.usage
        assert usage is not None
        # The second of two same prompts may find it in the engine's cache: the count is reported either way.
        counts = dataclasses.replace(usage, cached_tokens=None)
        return text_of(chunks), last.finish_reason, last.stop_sequence, counts, usage.cached_tokens is None

    streamed = run(subj, lambda b: collect(b, req(**WHOLE_CASES[case])))
    whole = run(subj, lambda b: collect(b, req(whole=True, **WHOLE_CASES[case])))
    assert summary(whole) == summary(streamed)
    assert all(c.finish_reason is None for c in whole[:-1])


def test_request_id_reaches_the_engine(subj: Subject) -> None:
    control = fake_only(subj)
    rid = f"rid-{subj.name}-1"
    run(subj, lambda b: collect(b, GenerationRequest(request_id=rid, model="m", prompt="Hi", max_tokens=3)))
    assert rid in [seen.request_id for seen in control.seen], "X-Request-Id header"
    if subj.own_request_id:
        assert rid in control.started, "the engine's own request id field"


def test_engine_queue_is_read_as_waiting(subj: Subject) -> None:
    """10 requests on an engine that runs 2 at a time: its load says 2 running, 8 waiting."""
    control = fake_only(subj)
    assert subj.engine is not None
    if subj.make().load_map is None:  # type: ignore[attr-defined]
        pytest.skip("the engine exposes no load gauges: the gateway counts for itself")
    control.max_running, subj.engine.token_delay_s = 2, 0.005

    async def body(backend: Backend) -> Any:
        request = req(prompt="The Zen", max_tokens=3000, extra={"ignore_eos": True})
        tasks = [asyncio.ensure_future(collect(backend, request)) for _ in range(10)]
        try:
            seen: list[Any] = []

            async def loaded() -> bool:
                seen.append(await backend.load())
                return seen[-1] is not None and (seen[-1].running, seen[-1].waiting) == (2, 8)

            await eventually_async(loaded, timeout=10, interval=0.05, message=lambda: f"load never 2+8: {seen[-1]}")
            return seen[-1]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    try:
        load = run(subj, body)
    finally:
        control.max_running, subj.engine.token_delay_s = None, 0.0
    assert load is not None and (load.running, load.waiting) == (2, 8), load
    wait_until(lambda: control.running == 0 and subj.engine is not None and subj.engine.active_streams == 0)


def test_connection_closed_before_the_answer_is_one_generation(subj: Subject) -> None:
    """The engine took the request, then its connection closed before a response byte: the request fails
    (another backend may take it) and the engine started exactly one generation for it, never a resent one."""
    control = fake_only(subj)

    async def body(backend: Backend) -> int:
        await collect(backend, req(messages=HELLO, max_tokens=3))  # a pooled connection, to be reused
        before = len(control.started)
        control.fail_next = "drop"
        with pytest.raises(BackendError) as info:
            await collect(backend, req(messages=HELLO, max_tokens=3))
        assert info.value.retryable
        return len(control.started) - before

    try:
        assert run(subj, body) <= 1
    finally:
        control.fail_next = None


# What each generic fault must become; "drop" and "refuse" leave the kind to the HTTP client.
GENERIC_KINDS = {
    "status_500": {ErrorKind.UPSTREAM},
    "status_503": {ErrorKind.OVERLOADED},
    "status_429": {ErrorKind.OVERLOADED},
    "cut": {ErrorKind.PROTOCOL, ErrorKind.UPSTREAM},
    "error_event": {ErrorKind.UPSTREAM},
    "malformed": {ErrorKind.PROTOCOL},
    "refuse": {ErrorKind.CONNECT, ErrorKind.PROTOCOL},
    "drop": {ErrorKind.CONNECT, ErrorKind.PROTOCOL},
    "hang": {ErrorKind.TIMEOUT},
}


def test_generic_faults_become_retryable_errors(subj: Subject) -> None:
    control = fake_only(subj)
    assert set(GENERIC_KINDS) == set(GENERIC_FAULTS)
    control.retry_after_s = 3.0
    try:
        for fault, kinds in GENERIC_KINDS.items():
            control.fail_next = fault
            with pytest.raises(BackendError) as info:
                run(subj, lambda b: collect(b, req(prompt=ZEN_PROMPT, max_tokens=12)), read_timeout_s=1.0)
            err = info.value
            if fault in ("cut", "error_event", "malformed") and not subj.streams:
                kinds = kinds | {ErrorKind.PROTOCOL}  # a whole answer cut or spoilt is unreadable JSON
            assert err.kind in kinds and err.retryable, (fault, err)
            if fault in ("status_503", "status_429"):
                assert err.retry_after == 3.0, (fault, err)
            assert control.fail_next is None, f"{fault} was not taken"
    finally:
        control.reset()


def test_slow_tokens_still_answer(subj: Subject) -> None:
    control = fake_only(subj)
    control.token_delay_s = 0.05
    try:
        chunks = run(subj, lambda b: collect(b, req(prompt=ZEN_PROMPT, max_tokens=8)), read_timeout_s=5.0)
    finally:
        control.token_delay_s = 0.0
    assert text_of(chunks) and chunks[-1].finish_reason == "length"


# Engines whose answers name the client's stop string that ended them (Anthropic's stop_sequence): the
# gateway's own cut knows it, and vLLM and trtllm-serve report theirs. llama-server stops without saying
# which; Triton's and MII REST's adapters do not pass it on yet.
NAMES_STOP = {"ctranslate2", "llama_cpp", "vllm", "trtllm_serve", "tgi", "tgi_messages", "mii_openai"}


@pytest.mark.parametrize("stop", ["Simple", "Simple is"])
def test_the_stop_string_that_ended_the_answer_is_named(subj: Subject, stop: str) -> None:
    if subj.name not in NAMES_STOP:
        pytest.skip(f"{subj.name} does not say which stop string ended an answer")
    chunks = run(subj, lambda b: collect(b, req(prompt=ZEN_PROMPT, max_tokens=40, stop=("never", stop))))
    assert (chunks[-1].finish_reason, chunks[-1].stop_sequence) == ("stop", stop)
    ended = run(subj, lambda b: collect(b, req(messages=HELLO, max_tokens=60, stop=("never",))))
    assert (ended[-1].finish_reason, ended[-1].stop_sequence) == ("stop", None)


def test_a_final_assistant_turn_is_continued_where_declared(subj: Subject) -> None:
    """An Anthropic prefill: the answer goes on from the assistant's text, as the greedy answer would."""
    prefix = "Hello! I am the"
    messages = [*HELLO, {"role": "assistant", "content": prefix}]

    async def continued(backend: Backend) -> list[Chunk]:
        if PREFILL not in capabilities_of(backend).features:
            pytest.skip(f"{subj.name} does not declare {PREFILL}")
        return await collect(backend, req(messages=messages, max_tokens=60, continue_final=True))

    chunks = run(subj, continued)
    assert prefix + text_of(chunks) == GREETING_REPLY and chunks[-1].finish_reason == "stop"


def test_an_engines_tokenize_route_counts_the_prompt_it_is_sent(subj: Subject) -> None:
    """``Tokenizing`` engines: the count equals the ``usage.prompt_tokens`` of the same request, tools included."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    request = req(messages=HELLO, max_tokens=64, tools=(tool,), tool_choice="required")

    async def both(backend: Backend) -> tuple[int, list[Chunk]]:
        if not isinstance(backend, Tokenizing):
            pytest.skip(f"{subj.name} has no tokenize route")
        return await backend.count_prompt(request), await collect(backend, request)

    counted, chunks = run(subj, both)
    usage = chunks[-1].usage
    assert usage is not None and counted == usage.prompt_tokens > 20
