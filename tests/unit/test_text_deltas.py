"""Text deltas that arrive together travel as one chunk of ``pieces`` and an OpenAI-compatible engine's
text events are read through a ``TextTemplate``, not parsed whole: what a client gets must not depend
on either, nor on how the engine's bytes were split into reads."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from backends.base import Chunk, one_by_one, pieces_of
from backends.http_base import HttpSettings
from backends.openai_answer import Answer
from backends.openai_events import TextTemplate, first_text
from backends.vllm import VLLMBackend
from benchmarks.asgi import CONFIG, post, started
from gateway.app import create_app
from gateway.config import load_config
from gateway.doors.openai_shapes import ResponseShape
from gateway.doors.openai_surface import OpenAIAnswer
from gateway.pipeline.events import Events
from tests.fakes import factory, serve_in_thread, sse_engine

VLLM_TEXT = (
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    '"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}'
)


def _learned(data: str) -> TextTemplate | None:
    doc = orjson.loads(data)
    text = first_text(doc)
    assert text is not None
    template = TextTemplate.learn(data, doc, text)
    assert doc == orjson.loads(data)  # learning leaves the document as it was
    return template


def _with_text(data: str, text: str) -> str:
    return data.replace('" tok"', orjson.dumps(text).decode())


@pytest.mark.parametrize("text", [" hi", 'a "quoted" word', "é\n\tü 中文", "\\", "</s>"])
def test_a_template_reads_the_same_event_with_another_text(text: str) -> None:
    template = _learned(VLLM_TEXT)
    assert template is not None
    assert template.read(_with_text(VLLM_TEXT, text)) == text


@pytest.mark.parametrize(
    "event",
    [
        _with_text(VLLM_TEXT, ""),  # an empty delta: parsed whole (it is no piece of text)
        VLLM_TEXT.replace('" tok"', '"a","x":"b"'),  # two strings where the text was: another document
        VLLM_TEXT.replace('"finish_reason":null', '"finish_reason":"stop"'),
        VLLM_TEXT.replace('"created":1', '"created":2'),
        VLLM_TEXT.replace('" tok"', "null"),
    ],
)
def test_a_template_reads_nothing_else(event: str) -> None:
    template = _learned(VLLM_TEXT)
    assert template is not None
    assert template.read(event) is None


def _wire(data: str) -> bytes:
    return b"data: " + data.encode() + b"\n\n"


def _read_wire(template: TextTemplate, piece: bytes) -> str | None:
    """The text of ``piece`` read by ``template`` from its bytes when it is one event of one line, as
    ``EventBatches._scan`` gives it one."""
    lines = piece.split(b"\n")
    texts: list[str] = []
    if len(lines) != 3 or lines[1] or lines[2] or not template.read_event(lines[0], texts):
        assert not texts
        return None
    return texts[0]


@pytest.mark.parametrize("text", [" hi", 'a "quoted" word', "é\n\tü 中文", "\\", "</s>", "\n\n"])
def test_a_template_reads_a_read_of_one_event_without_parsing_it_whole(text: str) -> None:
    template = _learned(VLLM_TEXT)
    assert template is not None
    assert _read_wire(template, _wire(_with_text(VLLM_TEXT, text))) == text


@pytest.mark.parametrize(
    "piece",
    [
        _wire(VLLM_TEXT)[:-1],  # the event's blank line not yet come
        _wire(VLLM_TEXT).replace(b"\n", b"\r\n"),
        _wire(VLLM_TEXT).replace(b"data: ", b"data:"),  # no space: the parser's
        b": ping\n" + _wire(VLLM_TEXT),
        _wire(VLLM_TEXT).replace(b"tok", b"\xff\xfe"),  # not UTF-8: decoded with replacements by the parser
        _wire(VLLM_TEXT).replace(b"tok", b"t\x01k"),  # a control character as it is: not JSON
        _wire(VLLM_TEXT).replace(b"tok", b"t\tk"),
        _wire(VLLM_TEXT.replace('" tok"', '"a","x":"b"')),
        _wire(_with_text(VLLM_TEXT, "")),
        b"event: error\n" + _wire(VLLM_TEXT),
        _wire(VLLM_TEXT.replace(',"choices"', '\ndata: ,"choices"')),  # two lines of data
    ],
)
def test_a_template_reads_no_other_read(piece: bytes) -> None:
    template = _learned(VLLM_TEXT)
    assert template is not None
    assert _read_wire(template, piece) is None


def _json_text(string: bytes) -> str | None:
    """What a whole parse reads of ``string`` where a text goes: a text (not empty), or None."""
    try:
        text = orjson.loads(string)
    except orjson.JSONDecodeError:
        return None
    return text if type(text) is str and text else None


def test_a_template_reads_any_bytes_where_the_text_goes_as_json_does() -> None:
    """Plain strings are read as they are and the rest by orjson: the two agree on every string."""
    template = _learned(VLLM_TEXT)
    assert template is not None
    before, after = _wire(VLLM_TEXT).split(b'" tok"')
    rng = random.Random(1)
    pieces = [b"a", b" ", b'"', b"\\", b"\\n", b"\\u00e9", b"\\ud800", b"\x00", b"\x1f", b"\x7f", b"\xc3\xa9",
              b"\xe4\xb8\xad", b"\xff", b"\xed\xa0\x80", b"\xc3", b",", b"}"]  # fmt: skip
    strings = [b'"' + b"".join(rng.choices(pieces, k=rng.randint(0, 6))) + b'"' for _ in range(3000)]
    for string in [*strings, b'"', b'""', b'"a"b"', b'"a" "b"', b"x"]:
        texts: list[str] = []
        read = template.read_event((before + string + after).rstrip(b"\n"), texts)
        expected = _json_text(string)
        assert (texts[0] if read else None) == expected, string
        assert len(texts) == read


def test_a_template_reads_a_run_of_its_events_in_one_read_and_stops_at_anything_else() -> None:
    template = _learned(VLLM_TEXT)
    assert template is not None
    texts = ["a", "b\n\n", ' "c"', "é"]
    run = b"".join(_wire(_with_text(VLLM_TEXT, t)) for t in texts)
    finish = _wire(VLLM_TEXT.replace('"finish_reason":null', '"finish_reason":"stop"'))
    for rest in (finish + _wire(VLLM_TEXT), b"data: [DONE]\n\n", b"x"):
        got: list[str] = []
        for line in (run + rest).split(b"\n")[::2]:
            if not template.read_event(line, got):
                break
        assert got == texts, rest


def test_no_wire_reading_for_a_template_whose_event_spans_lines() -> None:
    """Data of two lines is joined with a line break that the wire does not show where it is."""
    template = _learned(VLLM_TEXT.replace(',"choices"', '\n,"choices"'))
    assert template is not None and template.read(_with_text(VLLM_TEXT, "x").replace(',"choices"', '\n,"choices"'))
    assert not template.read_event(_wire(VLLM_TEXT.replace(',"choices"', '\n,"choices"')).split(b"\n")[0], [])


def test_no_template_where_the_text_cannot_be_placed_for_sure() -> None:
    ascii_escaped = '{"choices": [{"index": 0, "delta": {"content": "\\u00e9"}}]}'  # Python's json.dumps
    assert _learned(ascii_escaped) is None
    twice = '{"choices":[{"index":0,"delta":{"content":"x"}}],"echo":{"content":"x"}}'
    assert _learned(twice) is None
    elsewhere = '{"choices":[{"index":0,"delta":{"content":"\\u0079"}}],"echo":{"content":"y"}}'  # not the delta's
    assert _learned(elsewhere) is None
    spaced = _learned('{"choices": [{"index": 0, "delta": {"content": "x"}}]}')
    assert spaced is not None and spaced.read('{"choices": [{"index": 0, "delta": {"content": "yz"}}]}') == "yz"


def test_pieces_are_one_chunk_each_and_stale_ones_are_not_used() -> None:
    chunk = Chunk("abc", more=False, index=1, pieces=("a", "b", "c"))
    assert [(c.text, c.more, c.index, c.pieces) for c in one_by_one(chunk)] == [
        ("a", True, 1, ()),
        ("b", True, 1, ()),
        ("c", False, 1, ()),
    ]
    stale = Chunk("xyz", pieces=("a", "b"))  # a wrapper rewrote the text and kept the field
    assert pieces_of(stale) == ()
    assert [c.text for c in one_by_one(stale)] == ["xyz"]


@pytest.mark.parametrize("chat", [True, False])
def test_pieces_are_written_one_event_each_whatever_else_the_chunk_carries(chat: bool) -> None:
    answer = OpenAIAnswer(ResponseShape(chat, "r", "m", False, 1))
    chunk = Chunk("abc", "stop", index=0, pieces=("a", "b", "c"))  # a wrapper gave it the finish
    events = [orjson.loads(e[6:]) for e in (answer.chunk(chunk) or b"").split(b"\n\n") if e]
    key = "delta" if chat else "text"
    texts = [(c["delta"].get("content") if chat else c["text"]) for e in events for c in e["choices"] if key in c]
    assert texts == ["a", "b", "c"]
    assert [c["finish_reason"] for e in events for c in e["choices"]] == [None, None, "stop"]


@pytest.mark.parametrize("texts", [[" a"], [" a", 'b "c"', "é"]])
def test_texts_are_written_as_the_chunk_of_them_is(texts: list[str]) -> None:
    """``Events.texts`` (a pushed read of text alone) writes what ``Events.add`` writes for the chunk
    ``Answer.read`` makes of the same read: the stream's opening first, then each event."""
    by_chunk = Events(OpenAIAnswer(ResponseShape(True, "r", "m", False, 1)))
    by_texts = Events(OpenAIAnswer(ResponseShape(True, "r", "m", False, 1)))
    assert by_texts.text_events is not None
    for _ in range(2):  # with the opening held, then without
        assert by_texts.texts(texts) == by_chunk.add(Answer.text_chunk(texts))


def test_only_a_chat_stream_without_a_cache_or_a_listener_writes_texts() -> None:
    assert Events(OpenAIAnswer(ResponseShape(False, "r", "m", False, 1))).text_events is None  # completions
    assert Events(OpenAIAnswer(ResponseShape(True, "r", "m", False, 1)), keep=True).text_events is None
    assert Events(OpenAIAnswer(ResponseShape(True, "r", "m", False, 1))).text_events is not None


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def _chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None, created: int = 7) -> bytes:
    doc: dict[str, Any] = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": created, "model": "m"}
    return _event(doc | {"choices": choices} | ({"usage": usage} if usage else {}))


def _delta(text: str | None = None, index: int = 0, finish: str | None = None, **more: Any) -> dict[str, Any]:
    delta: dict[str, Any] = {} if text is None else {"content": text}
    delta |= more.pop("delta", {})
    return {"index": index, "delta": delta, "logprobs": more.pop("logprobs", None), "finish_reason": finish} | more


USAGE = {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}
TEXTS = [" Hel", "lo", ' "you"', " é中\n", "\\", "S", "TO", "P!", " after"]
STREAMS = {
    "text": [_chunk([_delta("", delta={"role": "assistant"})])]
    + [_chunk([_delta(t)]) for t in TEXTS]
    + [_chunk([_delta(None, finish="stop")]), _chunk([], USAGE)],
    "stop string across events": [_chunk([_delta(t)]) for t in TEXTS]
    + [_chunk([_delta(None, finish="length")], USAGE)],
    "two choices interleaved": [_chunk([_delta(t, i % 2)]) for i, t in enumerate(TEXTS)]
    + [_chunk([_delta(None, 0, "stop")]), _chunk([_delta(None, 1, "stop")], USAGE)],
    "tool call and logprobs between texts": [_chunk([_delta(t)]) for t in TEXTS[:3]]
    + [_chunk([_delta("x", logprobs={"content": [{"token": "x", "logprob": -0.5, "bytes": [120],
                                                  "top_logprobs": []}]})])]
    + [_chunk([_delta(t)]) for t in TEXTS[3:5]]
    + [_chunk([_delta(None, delta={"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                                   "function": {"name": "f", "arguments": "{}"}}]})])]
    + [_chunk([_delta(None, finish="tool_calls")], USAGE)],
    "a field that changes per event": [_chunk([_delta(t)], created=i) for i, t in enumerate(TEXTS)]
    + [_chunk([_delta(None, finish="stop")], USAGE)],
    "comments, fields and lines the parser reads": [_chunk([_delta(t)]) for t in TEXTS[:3]]
    + [b": ping\n\n", _chunk([_delta(" no space")]).replace(b"data: ", b"data:"),
       b"event: x\n" + _chunk([_delta(" named")]),
       _chunk([_delta(" two lines")]).replace(b',"choices"', b'\ndata: ,"choices"')]
    + [_chunk([_delta(t)]) for t in TEXTS[3:]] + [_chunk([_delta(None, finish="stop")], USAGE)],
    "an error after texts": [_chunk([_delta(t)]) for t in TEXTS[:4]]
    + [b'data: {"error":{"message":"engine fell over","type":"internal_error","code":500}}\n\n'],
    "a text event cut by a line without data: (not JSON)": [_chunk([_delta(t)]) for t in TEXTS[:4]]
    + [_chunk([_delta(" cut")]).replace(b'" cut"', b'" cut"\n')],
}  # fmt: skip
ASKED: dict[str, dict[str, Any]] = {
    "comments, fields and lines the parser reads": {},
    "an error after texts": {},
    "a text event cut by a line without data: (not JSON)": {},
    "text": {},
    "stop string across events": {"stop": ["STOP"]},
    "two choices interleaved": {"n": 2},
    "tool call and logprobs between texts": {"logprobs": True},
    "a field that changes per event": {},
}


def _splits(body: bytes, events: list[bytes], how: str, seed: int) -> list[bytes]:
    if how == "whole":
        return [body]
    if how == "by event":
        return [*events, b"data: [DONE]\n\n"]
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(body)), 12))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


async def _client_events(tmp_path: Path, pieces: list[bytes], asked: dict[str, Any]) -> list[Any]:
    """The SSE documents a client gets (ids and times left out) when the engine writes ``pieces``."""
    server, url = await sse_engine(pieces)
    backend = VLLMBackend("b", "m", HttpSettings(url=url, served_model="m"))
    try:
        config = tmp_path / "g.yaml"
        config.write_text(CONFIG)
        app = create_app(load_config(config), factory({"b": backend}))
        lifespan = await started(app)
        body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True, **asked}
        writes: list[bytes] = []
        assert await post(app, "/v1/chat/completions", orjson.dumps(body), writes) == 200
        lifespan.cancel()
    finally:
        await backend.aclose()
        server.close()
    return _docs(b"".join(writes))


def _docs(raw_stream: bytes) -> list[Any]:
    docs: list[Any] = []
    for raw in raw_stream.split(b"\n\n"):
        if raw.startswith(b"data: {"):
            doc = orjson.loads(raw[6:])
            docs.append({k: v for k, v in doc.items() if k not in ("id", "created", "system_fingerprint")})
        elif raw:
            docs.append(raw.decode())
    return docs


def _served_events(tmp_path: Path, pieces: list[bytes], asked: dict[str, Any]) -> list[Any]:
    """``_client_events`` through a real server (uvicorn, in a thread) from an engine that writes each
    piece a few milliseconds apart: the engine's events arrive one per read, and the chunks are
    written to the client in the engine connection's callback (``AnswerStream.push_to``)."""
    loop = asyncio.new_event_loop()
    engine = threading.Thread(target=loop.run_forever, daemon=True)
    engine.start()
    server, url = asyncio.run_coroutine_threadsafe(sse_engine(pieces, 0.003), loop).result(10)
    try:
        config = tmp_path / "served.yaml"
        config.write_text(CONFIG)
        backend = VLLMBackend("b", "m", HttpSettings(url=url, served_model="m"))
        app = create_app(load_config(config), factory({"b": backend}))
        body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True, **asked}
        with serve_in_thread(app) as base:
            answer = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
        assert answer.status_code == 200
        return _docs(answer.content)
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        engine.join(10)


@pytest.mark.parametrize("name", list(STREAMS))
def test_what_a_client_gets_does_not_depend_on_how_the_engine_bytes_arrived(tmp_path: Path, name: str) -> None:
    events = STREAMS[name]
    body = b"".join(events) + b"data: [DONE]\n\n"
    runs = {
        f"{how} {seed}": asyncio.run(_client_events(tmp_path, _splits(body, events, how, seed), ASKED[name]))
        for how, seed in (("by event", 0), ("whole", 0), ("random", 1), ("random", 2))
    }
    runs["served, paced"] = _served_events(tmp_path, _splits(body, events, "by event", 0), ASKED[name])
    reference = runs["by event 0"]
    texts = [d["choices"][0]["delta"].get("content") for d in reference if isinstance(d, dict) and d.get("choices")]
    assert len([t for t in texts if t]) >= 3  # the stream has text events to compare
    for how, docs in runs.items():
        assert docs == reference, how
    if name == "stop string across events":
        assert "".join(t or "" for t in texts) == ' Hello "you" é中\n\\'  # cut before the stop, never after
