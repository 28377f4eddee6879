"""Text assembly shared by the in-process engines: UTF-8 across tokens, stop strings, context room."""

from __future__ import annotations

import pytest

from backends.base import BackendError, ErrorKind, GenerationRequest
from backends.inproc import TextAssembler, check_context

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
