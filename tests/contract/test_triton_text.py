"""Triton's text: the fake streams the ensemble's real per-token quirk; the adapter's modes turn it into exact text."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.base import GenerationRequest
from backends.trtllm import Cumulative, guided_decoding, log_probs, paired, token_count, triton_payload
from tests.conftest import ZEN_CONTINUATION, ZEN_PROMPT
from tests.contract import fake_triton
from tests.contract.control import FakeControl
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    engine = TinyEngine(tmp_path_factory.mktemp("triton-text") / "cache")
    with serve_in_thread(fake_triton.create_app(engine, FakeControl()), "/v2/health/ready") as url:
        yield url


def streamed(url: str, model: str, **extra: object) -> list[dict[str, object]]:
    body = {"text_input": ZEN_PROMPT, "max_tokens": 12, "stream": True, "top_k": 1, **extra}
    resp = httpx.post(f"{url}/v2/models/{model}/generate_stream", json=body, timeout=30)
    assert resp.status_code == 200
    return [json.loads(line[6:]) for line in resp.text.split("\n\n") if line.startswith("data: ")]


def test_the_ensembles_per_token_stream_loses_word_leading_spaces(triton: str) -> None:
    """As the real ensemble does (its postprocessing decodes each token alone): "Machine", "learning"."""
    pieces = [str(doc["text_output"]) for doc in streamed(triton, "ensemble")]
    joined = "".join(pieces)
    assert joined != ZEN_CONTINUATION[: len(joined)]
    assert joined == ZEN_CONTINUATION.replace(" ", "")[: len(joined)]


def test_the_bls_model_with_accumulate_tokens_streams_the_text_so_far(triton: str) -> None:
    texts = [str(doc["text_output"]) for doc in streamed(triton, "tensorrt_llm_bls", return_log_probs=True)]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert ZEN_CONTINUATION.startswith(texts[-1]) and len(texts) == 12


def test_cumulative_text_is_diffed_and_a_half_character_waits() -> None:
    text = Cumulative()
    assert text.feed(" ugly") == " ugly"
    assert text.feed(" ugly. \ufffd") == ". "  # half of a multi-byte character: held
    assert text.feed(" ugly. é") == "é"
    assert text.feed(" ugly, rewritten") == ""  # text already sent changed: nothing until it agrees
    with pytest.raises(ValueError):
        text.close(" ugly, rewritten")
    assert Cumulative().close("all") == "all"


def test_token_counts_come_from_output_log_probs() -> None:
    assert token_count({"output_log_probs": [0.0, -1.2, -0.3]}) == 3
    assert token_count({"output_log_probs": [[0.0], [-1.2]]}) == 2
    assert token_count({"text_output": "x"}) is None


def test_payload_carries_the_request_id_and_asks_for_token_counts() -> None:
    req = GenerationRequest(request_id="req-7", model="m", prompt="x", stop=("Simple is",))
    payload = triton_payload(req, "x", 16, stream=False)
    assert payload["id"] == "req-7" and payload["return_log_probs"] is True and payload["stream"] is False
    assert payload["stop_words"] == ["Simple is"]


def test_log_probs_keep_the_tokens_order_and_pair_with_their_text() -> None:
    assert log_probs({"output_log_probs": [[-0.5, -1.0], [-2.0]]}) == [-0.5, -1.0, -2.0]  # [beam][token], flattened
    assert log_probs({"text_output": "x"}) is None
    one = paired(" ugly", [-0.25])
    assert [(t.token, t.logprob) for t in one] == [(" ugly", -0.25)]
    # Several tokens in one response (speculative decoding): the text cannot be split, the values stay exact.
    assert [(t.token, t.logprob) for t in paired("ab", [-1.0, -2.0])] == [("ab", -1.0), ("", -2.0)]


@pytest.mark.parametrize(
    ("response_format", "inputs"),
    [
        (None, {}),
        ({"type": "text"}, {}),
        ({"type": "json_object"}, {"guided_decoding_guide_type": "json"}),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}, "strict": True}},
            {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": '{"type": "object"}'},
        ),
        ({"type": "json_schema", "json_schema": {"name": "p"}}, {"guided_decoding_guide_type": "json"}),
    ],
)
def test_response_format_becomes_the_ensembles_guide(
    response_format: dict[str, Any] | None, inputs: dict[str, str]
) -> None:
    assert guided_decoding(response_format) == inputs
