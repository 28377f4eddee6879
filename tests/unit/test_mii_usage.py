"""MII REST counts only what it generated in all: the usage of an answer cut at a stop string is its share."""

from __future__ import annotations

from dataclasses import replace

from backends.base import GenerationRequest, WholeAnswers
from backends.deepspeed_mii import MiiRestBackend, kept_tokens, rest_payload
from backends.http_base import HttpSettings


def test_completion_tokens_are_those_of_the_text_kept() -> None:
    text = "one two three four five six seven eight nine ten " * 2 + "STOP and a lot more text after it"
    kept = text[: text.index("STOP")]
    assert kept_tokens(60, text, kept, len("STOP")) < 60 * 0.8
    assert kept_tokens(60, text, text, 0) == 60
    assert kept_tokens(60, "", "", 0) == 60
    assert kept_tokens(3, "abcdef", "", 1) == 1


def test_stop_strings_are_not_sent_and_the_backend_answers_whole() -> None:
    req = GenerationRequest(request_id="r", model="m", prompt="x", stop=("Simple is",))
    assert "stop" not in rest_payload(req, "x", 16)  # a non-token stop would also disable MII's EOS check
    backend = MiiRestBackend("r", "m", HttpSettings(url="http://127.0.0.1:9", served_model="m"), deployment="d")
    assert isinstance(backend, WholeAnswers) and backend.answers_whole(replace(req, stream=True))
