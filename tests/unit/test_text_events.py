"""A chat stream's plain events rendered around their delta (``ResponseShape.plain_event``,
``text_events``, ``role_events``) are byte for byte the events the document path makes: every client
parses them as before."""

from __future__ import annotations

import random

import pytest

from backends.base import Chunk
from gateway.doors.openai_shapes import ResponseShape
from gateway.doors.openai_surface import OpenAIAnswer
from gateway.http.exchange import event

TEXTS = [
    " tok",
    "",
    'quote " and \\ backslash',
    "line\nbreak\ttab",
    "\x00\x01\x1f control",
    "é ü 中文 🙂",
    "\u2028\u2029",
    "</script>",
    'quote, comma ",',
    '","',
]


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("model", ["m", 'a "quoted" model', "modèle/🙂", "\x00enginegate-text\x00"])
@pytest.mark.parametrize("request_id", ["req-1", 'q"\\\u2028'])
def test_plain_events_are_the_documents_events(include_usage: bool, model: str, request_id: str) -> None:
    shape = ResponseShape(True, request_id, model, include_usage, n=3)
    rng = random.Random(0)
    texts = [t for t in TEXTS if t] + [
        "".join(rng.choice('ab"\\\n é🙂\x07') for _ in range(rng.randint(1, 40))) for _ in range(200)
    ]
    texts += [  # nothing to escape: runs of them are encoded as one list
        "".join(rng.choice("ab ,é🙂[]/<") for _ in range(rng.randint(1, 9))) for _ in range(200)
    ]
    for i, text in enumerate(texts):
        index = i % 3
        finish = (None, None, "stop", "length", 'a "reason"')[i % 5]
        for chunk in (Chunk(text, index=index), Chunk(text, finish, index=index), Chunk("", finish, index=index)):
            doc = shape.delta(chunk)
            if doc is not None:
                assert shape.plain_event(chunk) == event(doc), chunk
        run = texts[i : i + 1 + i % 4]
        assert shape.text_events(index, run) == b"".join(event(shape.delta(Chunk(t, index=index))) for t in run)
    assert shape.text_events(1, []) == b""
    roles = [event(shape._chunk({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None})) for i in range(3)]  # fmt: skip
    assert shape.role_events() == roles
    assert ResponseShape(False, request_id, model, include_usage, n=3).role_events() == []


def test_the_answer_uses_the_plain_events_and_the_document_for_the_rest() -> None:
    answer = OpenAIAnswer(ResponseShape(True, "req-2", "m", False))
    reference = ResponseShape(True, "req-2", "m", False)
    reference.created = answer.shape.created
    for chunk in (Chunk(" hi"), Chunk("", "stop"), Chunk(" end", "length"), Chunk("")):
        doc = reference.delta(chunk)
        assert answer.chunk(chunk) == (None if doc is None else event(doc))
