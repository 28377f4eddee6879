"""A chat stream's text deltas rendered from a template (``ResponseShape.text_event``) are byte for byte
the events the document path makes: every client parses them as before."""

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
]


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("model", ["m", 'a "quoted" model', "modèle/🙂"])
def test_text_events_are_the_documents_events(include_usage: bool, model: str) -> None:
    shape = ResponseShape(True, "req-1", model, include_usage, n=3)
    rng = random.Random(0)
    texts = [t for t in TEXTS if t] + [
        "".join(rng.choice('ab"\\\n é🙂\x07') for _ in range(rng.randint(1, 40))) for _ in range(200)
    ]
    for i, text in enumerate(texts):
        index = i % 3
        expected = event(shape.delta(Chunk(text, index=index)))
        assert shape.text_event(index, text) == expected, text


def test_the_answer_uses_the_template_for_text_alone_and_the_document_for_the_rest() -> None:
    answer = OpenAIAnswer(ResponseShape(True, "req-2", "m", False))
    reference = ResponseShape(True, "req-2", "m", False)
    reference.created = answer.shape.created
    for chunk in (Chunk(" hi"), Chunk("", "stop"), Chunk(" end", "length"), Chunk("")):
        doc = reference.delta(chunk)
        assert answer.chunk(chunk) == (None if doc is None else event(doc))


def test_a_model_name_holding_the_placeholder_falls_back_to_the_document() -> None:
    shape = ResponseShape(True, "req-3", "\x00enginegate-text\x00", False)
    assert shape.text_event(0, "x") is None
    assert OpenAIAnswer(shape).chunk(Chunk("x")) == event(shape.delta(Chunk("x")))
