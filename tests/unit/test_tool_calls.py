"""Tool-call parsers: models' call text in, OpenAI's streamed tool-call pieces out."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from backends.base import Chunk, ToolCallDelta, Usage
from backends.tool_calls import PARSERS, ToolCallParser, parser_for, with_tool_calls

PARIS = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def run(parser: ToolCallParser, pieces: list[str]) -> tuple[list[str], list[ToolCallDelta]]:
    """Feed ``pieces``, then finish: the content pieces sent and every tool-call delta."""
    content: list[str] = []
    calls: list[ToolCallDelta] = []
    for piece in pieces:
        text, got = parser.feed(piece)
        content.append(text)
        calls += got
    text, got = parser.finish()
    content.append(text)
    return content, calls + got


def splits(text: str, seed: int) -> list[str]:
    """``text`` cut at random places, as tokens arrive."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def assembled(calls: list[ToolCallDelta]) -> list[tuple[str, str, Any]]:
    """(id, name, arguments) per call, assembled the way OpenAI clients do: by index."""
    by_index: dict[int, list[ToolCallDelta]] = {}
    for d in calls:
        by_index.setdefault(d.index, []).append(d)
    out = []
    for index in sorted(by_index):
        first, *rest = by_index[index]
        assert first.id is not None and first.name is not None, "a call's first piece names it"
        assert all(d.id is None and d.name is None for d in rest), "id and name come once, first"
        out.append((first.id, first.name, json.loads("".join(d.arguments for d in by_index[index]))))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_hermes_call_is_parsed_however_the_text_is_split(seed: int) -> None:
    parser = parser_for("hermes")
    content, calls = run(parser, splits(PARIS, seed))
    assert "".join(content) == ""
    [(call_id, name, args)] = assembled(calls)
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", call_id)
    assert (name, args) == ("get_weather", {"city": "Paris"})
    assert parser.called


def test_hermes_tag_text_is_never_sent_as_content() -> None:
    parser = parser_for("hermes")
    text = "Let me look.\n" + PARIS
    content, calls = run(parser, list(text))  # one character at a time
    assert "".join(content) == "Let me look."
    assert all("<" not in piece for piece in content)
    assert [c[1] for c in assembled(calls)] == ["get_weather"]


def test_hermes_several_calls_are_numbered_in_order() -> None:
    second = PARIS.replace("Paris", "Rome")
    content, calls = run(parser_for("hermes"), [PARIS + "\n" + second + "\n"])
    assert "".join(content) == ""
    assert [d.index for d in calls] == [0, 0, 1, 1]
    got = assembled(calls)
    assert [a for _, _, a in got] == [{"city": "Paris"}, {"city": "Rome"}]
    assert got[0][0] != got[1][0]


@pytest.mark.parametrize("seed", range(10))
def test_plain_text_passes_through_unchanged(seed: int) -> None:
    text = "A <b>bold</b> answer: 1 < 2, <tool_ and  spaces  \n"
    content, calls = run(parser_for("hermes"), splits(text, seed))
    assert "".join(content) == text
    assert calls == []


def test_malformed_call_falls_back_to_content_without_tags() -> None:
    parser = parser_for("hermes")
    content, calls = run(parser, ["Sure. <tool_call>\n{not json}\n</tool_call>"])
    assert calls == [] and not parser.called
    assert "".join(content) == "Sure. \n{not json}\n"


def test_object_without_a_name_is_not_a_call() -> None:
    content, calls = run(parser_for("hermes"), ['<tool_call>{"arguments": {}}</tool_call>'])
    assert calls == [] and "".join(content) == '{"arguments": {}}'


def test_call_cut_before_its_end_tag_still_counts_when_complete() -> None:
    _, calls = run(parser_for("hermes"), [PARIS.removesuffix("</tool_call>")])
    assert [a for _, _, a in assembled(calls)] == [{"city": "Paris"}]
    content, calls = run(parser_for("hermes"), ['<tool_call>\n{"name": "get_wea'])
    assert calls == [] and "".join(content) == '\n{"name": "get_wea'


def test_arguments_given_as_a_json_string_are_an_object() -> None:
    text = '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    _, calls = run(parser_for("hermes"), [text])
    assert assembled(calls)[0][2] == {"x": 1}


def test_seeded_ids_are_deterministic() -> None:
    ids = [assembled(run(parser_for("hermes", seed=3), [PARIS])[1])[0][0] for _ in range(2)]
    other = assembled(run(parser_for("hermes", seed=4), [PARIS])[1])[0][0]
    assert ids[0] == ids[1] != other


def test_feed_is_linear_in_the_new_text() -> None:
    # 200k single-character feeds inside a call: rescanning the body each time would take minutes.
    parser = parser_for("hermes")
    started = time.monotonic()
    parser.feed('<tool_call>{"name": "f", "arguments": {"s": "')
    for _ in range(200_000):
        parser.feed("a")
    _, calls = parser.feed('"}}</tool_call>')
    assert time.monotonic() - started < 5.0
    assert len(assembled(calls)[0][2]["s"]) == 200_000


@pytest.mark.parametrize("seed", range(10))
def test_llama3_json_answer_is_a_call(seed: int) -> None:
    text = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
    content, calls = run(parser_for("llama3_json"), splits(text, seed))
    assert "".join(content) == ""
    assert [(n, a) for _, n, a in assembled(calls)] == [("get_weather", {"city": "Paris"})]


def test_llama3_json_several_calls_and_plain_answers() -> None:
    two = '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}'
    assert [n for _, n, _ in assembled(run(parser_for("llama3_json"), [two])[1])] == ["a", "b"]
    plain = "The weather is fine."
    content, calls = run(parser_for("llama3_json"), list(plain))
    assert "".join(content) == plain and calls == []
    other_json = '{"temperature": 18}'
    parser = parser_for("llama3_json")
    content, calls = run(parser, [other_json])
    assert "".join(content) == other_json and calls == [] and not parser.called


@pytest.mark.parametrize("seed", range(10))
def test_mistral_calls_both_forms(seed: int) -> None:
    old = 'Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    content, calls = run(parser_for("mistral"), splits(old, seed))
    assert "".join(content) == "Checking."
    assert [(n, a) for _, n, a in assembled(calls)] == [("get_weather", {"city": "Paris"})]
    new = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]f[ARGS]{}'
    _, calls = run(parser_for("mistral"), splits(new, seed))
    assert [(n, a) for _, n, a in assembled(calls)] == [("get_weather", {"city": "Paris"}), ("f", {})]


def test_mistral_malformed_and_plain() -> None:
    content, calls = run(parser_for("mistral"), ["[TOOL_CALLS][{oops"])
    assert calls == [] and "".join(content) == "[{oops"
    content, calls = run(parser_for("mistral"), list("[1] and [TOOL] text"))
    assert "".join(content) == "[1] and [TOOL] text" and calls == []


def test_every_named_parser_exists_and_unknown_is_refused() -> None:
    for name in PARSERS:
        assert parser_for(name).called is False
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        parser_for("nope")


async def _chunks(texts: list[str], finish: str = "stop") -> AsyncIterator[Chunk]:
    for text in texts:
        yield Chunk(text=text)
    yield Chunk(text="", finish_reason=finish, usage=Usage(10, len(texts)))


def _collect(stream: AsyncIterator[Chunk]) -> list[Chunk]:
    async def go() -> list[Chunk]:
        return [c async for c in stream]

    return asyncio.run(go())


def test_stream_rewrite_sends_call_pieces_and_tool_calls_finish() -> None:
    pieces = ["<tool", '_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>']
    out = _collect(with_tool_calls(_chunks(pieces), "hermes", seed=1))
    assert "".join(c.text for c in out) == ""
    deltas = [d for c in out for d in c.tool_calls]
    assert all(len(c.tool_calls) <= 1 for c in out), "one call piece per chunk, as OpenAI streams them"
    assert [(n, a) for _, n, a in assembled(deltas)] == [("get_weather", {"city": "Paris"})]
    assert out[-1].finish_reason == "tool_calls" and out[-1].usage == Usage(10, 3)
    assert [c.finish_reason for c in out[:-1]] == [None] * (len(out) - 1)
    assert not out[-1].more


def test_stream_rewrite_leaves_plain_answers_alone() -> None:
    out = _collect(with_tool_calls(_chunks(["Hello", " world", "!"], finish="length"), "hermes"))
    assert "".join(c.text for c in out) == "Hello world!"
    assert out[-1].finish_reason == "length" and out[-1].usage == Usage(10, 3)
    assert not any(c.tool_calls for c in out)


def test_stream_rewrite_keeps_choices_apart() -> None:
    async def two() -> AsyncIterator[Chunk]:
        yield Chunk(text="<tool_call>", index=0)
        yield Chunk(text="Hi", index=1)
        yield Chunk(text='{"name": "f", "arguments": {}}</tool_call>', index=0, finish_reason="stop")
        yield Chunk(text="!", index=1, finish_reason="stop")

    out = _collect(with_tool_calls(two(), "hermes"))
    assert "".join(c.text for c in out if c.index == 1) == "Hi!"
    assert [c.finish_reason for c in out if c.finish_reason] == ["tool_calls", "stop"]
    assert {c.index for c in out if c.tool_calls} == {0}


# What the demo model writes, greedily, for the OpenAI Agents SDK's get_weather tool (its schema has
# "title" and "additionalProperties"): a complete call, then no end tag but text, in which a second
# start tag comes later. llama.cpp's lazy grammar would force the end tag there; the answer is the call.
UNCLOSED = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    "It is better than implex.\nCo model.\nIt is better than <tool_call>\nIt is better than ugly."
)


@pytest.mark.parametrize("seed", range(20))
def test_hermes_call_followed_by_text_is_the_call_and_ends_the_answer(seed: int) -> None:
    parser = parser_for("hermes")
    content, calls = run(parser, splits(UNCLOSED, seed))
    assert "".join(content) == ""
    assert [(n, a) for _, n, a in assembled(calls)] == [("get_weather", {"city": "Paris"})]
    assert parser.called and parser.over


def test_hermes_call_counts_at_its_closing_brace_before_the_end_tag() -> None:
    parser = parser_for("hermes")
    _, calls = parser.feed('<tool_call>\n{"name": "f", "arguments": {"s": "a}\\"}", "n": [{}]}}')
    assert [(n, a) for _, n, a in assembled(calls)] == [("f", {"s": 'a}"}', "n": [{}]})]
    assert not parser.over  # the end tag or another call may still come
    assert parser.feed("\n</tool_call>\n<tool_") == ("", [])
    _, more = parser.feed('call>{"name": "g", "arguments": {}}</tool_call>')
    assert [d.index for d in more] == [1, 1] and not parser.over
    assert parser.feed("Done.") == ("", []) and parser.over
    assert parser.feed("<tool_call>") == ("", [])  # nothing after the end


def test_hermes_malformed_body_never_sends_tags() -> None:
    for text in ("<tool_call>\nHello <tool_call> there </tool_call>", "<tool_call>\nHi <tool_call>\nthere"):
        content, calls = run(parser_for("hermes"), splits(text, 3))
        assert calls == [] and "tool_call" not in "".join(content)


@pytest.mark.parametrize("seed", range(10))
def test_hermes_end_tag_with_no_call_open_is_dropped(seed: int) -> None:
    """A sampled answer may be text with a stray end tag (CI once saw `` Rome?"}}\n  </tool_call>``
    from the demo model): the tag is not content, the text around it is, and the answer goes on."""
    text = ' Rome?"}}\n  </tool_call> and </tool_call></tool_call>more </tool_ca'
    parser = parser_for("hermes")
    content, calls = run(parser, splits(text, seed))
    assert calls == [] and not parser.called and not parser.over
    assert "".join(content) == ' Rome?"}}\n   and more </tool_ca'
    content, calls = run(parser_for("hermes"), splits("Hi</tool_call>\n" + PARIS, seed))
    assert "".join(content) == "Hi" and [(n, a) for _, n, a in assembled(calls)] == [("get_weather", {"city": "Paris"})]


def test_answer_end_stops_at_the_first_text_after_a_call() -> None:
    from backends.tool_calls import answer_end

    ended = answer_end("hermes")
    pieces = ["<tool_call>", "\n", '{"name":', ' "f", "arguments": {}}', "\n", "It", " is"]
    assert [ended(p) for p in pieces] == [False] * 5 + [True, True]
    plain = answer_end("hermes")
    assert not any(plain(p) for p in ["Hello", " <b>", "</tool_call>", "!"])
