"""One conformance suite, run against every adapter: real engines where they run here, contract fakes otherwise."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from backends.base import Backend, BackendError, Chunk, ErrorKind, GenerationRequest
from tests.conftest import GREETING_REPLY, ZEN_CONTINUATION, ZEN_PROMPT
from tests.contract.subjects import ALL, Subject, closed_port_url, subject

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


def test_chat_greedy_answer(subj: Subject) -> None:
    chunks = run(subj, lambda b: collect(b, req(messages=HELLO, max_tokens=60)))
    assert text_of(chunks) == GREETING_REPLY
    assert chunks[-1].finish_reason == "stop"
    assert all(c.finish_reason is None for c in chunks[:-1])
    if subj.streams:
        assert sum(1 for c in chunks if c.text) > 5, "a streaming engine streams"


def test_completion_greedy_answer(subj: Subject) -> None:
    chunks = run(subj, lambda b: collect(b, req(prompt=ZEN_PROMPT, max_tokens=40)))
    assert text_of(chunks).startswith(ZEN_CONTINUATION)
    assert chunks[-1].finish_reason == "length"


def test_stop_string_ends_the_answer_and_is_not_included(subj: Subject) -> None:
    chunks = run(subj, lambda b: collect(b, req(prompt=ZEN_PROMPT, max_tokens=40, stop=("Simple",))))
    assert text_of(chunks) == " ugly.\nExplicit is better than implicit.\n"
    assert chunks[-1].finish_reason == "stop"


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
        request = req(prompt="The Zen", max_tokens=max_tokens, extra={"ignore_eos": True})
        stream = backend.generate(request)
        if subj.streams:
            got = 0
            async for chunk in stream:
                got += bool(chunk.text)
                if got == 2:
                    break
            await stream.aclose()  # type: ignore[attr-defined]
        else:
            task = asyncio.ensure_future(collect(backend, request))
            await asyncio.sleep(0.3)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.5)
        return subj.engine_tokens()

    try:
        before = subj.engine_tokens()
        settled = run(subj, body)
        time.sleep(0.7)
        later = subj.engine_tokens()
    finally:
        if subj.engine is not None:
            subj.engine.token_delay_s = 0.0
    if not subj.cancellable:
        # The engine has no cancellation: the adapter closed its connection, the engine runs on.
        assert subj.engine is not None and later > settled
        return
    assert later == settled, "the engine kept generating after the stream was closed"
    assert settled - before < max_tokens / 2


def test_context_overflow_maps_to_what_the_engine_makes_knowable(subj: Subject) -> None:
    long_prompt = req(prompt="Beautiful is better than ugly. " * 2000, max_tokens=16)
    if subj.context_error is None:  # the engine answers anyway (MII's OpenAI server)
        assert run(subj, lambda b: collect(b, long_prompt))[-1].finish_reason is not None
        return
    with pytest.raises(BackendError) as info:
        run(subj, lambda b: collect(b, long_prompt))
    assert info.value.kind is subj.context_error
    assert info.value.retryable is (subj.context_error is not ErrorKind.CONTEXT_LENGTH)


def test_unreachable_engine_is_connect_error(subj: Subject) -> None:
    if subj.name in ("ctranslate2", "llama_cpp"):
        return  # in process: nothing to connect to
    with pytest.raises(BackendError) as info:
        run(subj, lambda b: collect(b, req(messages=HELLO, max_tokens=5)), url=closed_port_url())
    assert info.value.kind is ErrorKind.CONNECT and info.value.retryable


def test_engine_faults_map_to_error_kinds(subj: Subject) -> None:
    if subj.control is None:
        return  # real engines: their failures are exercised by the context and connect tests
    for fault, kind in subj.faults.items():
        subj.control.fail_next = fault
        with pytest.raises(BackendError) as info:
            run(subj, lambda b: collect(b, req(messages=HELLO, max_tokens=8)))
        assert info.value.kind is kind, (fault, info.value)
        subj.control.fail_next = None


def test_slow_first_token_is_a_timeout(subj: Subject) -> None:
    if subj.control is None:
        return
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

    healthy, load = run(subj, probe)
    assert healthy
    assert load is not None and load.running == 0 and load.waiting == 0
    if subj.control is not None and subj.health_can_fail:
        subj.control.healthy = False
        try:
            assert not run(subj, probe)[0]
        finally:
            subj.control.healthy = True
