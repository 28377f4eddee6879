"""Text assembly shared by the in-process engines: UTF-8 across tokens, stop strings, context room."""

from __future__ import annotations

import pytest

from backends.base import BackendError, ErrorKind, GenerationRequest
from backends.inproc import check_context
from backends.inproc_tokens import TextAssembler

PIECES = [b"Hel", b"lo", b" wor", b"ld", "é".encode()[:1], "é".encode()[1:], b"<", b"END", b">", b"!"]


def feed_all(asm: TextAssembler, ids: list[int]) -> str:
    out = ""
    for i in ids:
        out += asm.feed(i)
        if asm.stopped:
            return out
    return out + asm.flush()


def test_multibyte_character_split_across_tokens_is_sent_whole() -> None:
    asm = TextAssembler(PIECES, [])
    assert asm.feed(4) == ""
    assert asm.feed(5) == "é"


def test_stop_string_spanning_tokens_is_cut_and_never_sent() -> None:
    asm = TextAssembler(PIECES, ["<END>"])
    sent = [asm.feed(i) for i in (0, 1, 6, 7)]
    assert sent == ["Hel", "lo", "", ""]  # "<" and "<END" are held back: they may become the stop string
    assert asm.feed(8) == ""
    assert asm.stopped


def test_held_text_that_does_not_become_a_stop_is_released() -> None:
    asm = TextAssembler(PIECES, ["<END>"])
    assert feed_all(asm, [0, 6, 9, 1]) == "Hel<!lo"
    assert not asm.stopped


def test_earliest_of_several_stops_wins() -> None:
    asm = TextAssembler(PIECES, ["ld", "lo"])
    assert feed_all(asm, [0, 1, 2, 3]) == "Hel"


def req(max_tokens: int | None, chat: bool = False) -> GenerationRequest:
    if chat:
        return GenerationRequest("r", "m", max_tokens=max_tokens, messages=[{"role": "user", "content": "x"}])
    return GenerationRequest("r", "m", max_tokens=max_tokens, prompt="x")


def test_context_room() -> None:
    assert check_context(req(None), 10, 100) == 90
    assert check_context(req(90), 10, 100) == 90
    with pytest.raises(BackendError) as info:
        check_context(req(91, chat=True), 10, 100)
    assert info.value.kind is ErrorKind.CONTEXT_LENGTH and info.value.param == "messages"
    assert not info.value.retryable
    with pytest.raises(BackendError):
        check_context(req(None), 100, 100)


def test_full_queue_is_overloaded_and_slots_are_released() -> None:
    import asyncio
    import threading
    from collections.abc import Callable, Iterator

    from backends.inproc_threads import ThreadedGeneration
    from tests.polling import eventually

    gate = threading.Event()

    def slow_loop(cancelled: Callable[[], bool]) -> Iterator[int]:
        while not gate.is_set() and not cancelled():
            gate.wait(0.01)
        yield 0

    async def scenario() -> None:
        workers = ThreadedGeneration("t", slots=1, max_queue=0)
        request = GenerationRequest("r", "m", max_tokens=1, prompt="x")

        async def consume() -> list[str]:
            return [c.text async for c in workers.run(request, slow_loop, 1, [b"a"], frozenset(), 1)]

        first = asyncio.create_task(consume())
        await eventually(lambda: workers.running == 1, timeout=5, message="the first request never ran")
        with pytest.raises(BackendError) as info:
            await consume()
        assert info.value.kind is ErrorKind.OVERLOADED and info.value.retryable
        gate.set()
        assert "".join(await first) == "a"
        await eventually(lambda: workers.running == 0, timeout=5, message="the slot was never freed")
        assert "".join(await consume()) == "a"
        workers.shutdown()

    asyncio.run(scenario())


def test_characters_the_decoder_completes_at_the_end_are_sent_even_if_they_begin_a_stop() -> None:
    # A lone UTF-8 lead byte decodes to U+FFFD only at the end; a stop beginning with it must not swallow it.
    asm = TextAssembler(PIECES, ["\ufffdEND"])
    assert asm.feed(0) + asm.feed(4) == "Hel"
    assert asm.flush() == "\ufffd"
