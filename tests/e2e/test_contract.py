"""One OpenAI contract through a real gateway process, with the official ``openai`` client.

Every field of the spec either takes effect or gets a 400 that names it; a field no backend serving
the model honours is refused (or, with ``routing.drop_unsupported``, dropped and named in
``x-enginegate-dropped``); a request that needs a capability goes to the backend that has it; the
answer's length without ``max_tokens`` is the same rule on every engine; ``n`` gives indexed choices.
The in-process engines serve here (CTranslate2 and llama.cpp on the demo model).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ZEN_PROMPT, GatewayProcess, write_config

# Every gateway here serves llama.cpp in process too (llama-cpp-python, the `llama` extra).
pytestmark = pytest.mark.engines

LENGTH_CAP = 64
HELLO: list[Any] = [{"role": "user", "content": "Hello"}]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 12}, "count": {"type": "integer"}},
    "required": ["answer", "count"],
    "additionalProperties": False,
}

FLEET = """
limits: {max_tokens: %d}
routing: {drop_unsupported: %s}
models:
  - {name: demo-ct2, gguf: "{GGUF}"}
  - {name: demo-llama, gguf: "{GGUF}"}
  - {name: demo-both, gguf: "{GGUF}"}
backends:
  - {name: ct2-only, engine: ctranslate2, model: demo-ct2}
  - {name: llama-only, engine: llama_cpp, model: demo-llama}
  - {name: both-ct2, engine: ctranslate2, model: demo-both}
  - {name: both-llama, engine: llama_cpp, model: demo-both}
"""


def _gateway(tmp: Path, cache_dir: Path, drop: bool) -> Iterator[GatewayProcess]:
    config = write_config(tmp / "contract.yaml", FLEET % (LENGTH_CAP, "true" if drop else "false"))
    proc = GatewayProcess(config, cache_dir)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def contract_gateway(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[GatewayProcess]:
    yield from _gateway(tmp_path_factory.mktemp("contract"), cache_dir, drop=False)


@pytest.fixture(scope="module")
def client(contract_gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{contract_gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def bad_request(call: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    return info.value


def test_a_misspelt_field_is_an_unrecognized_argument(client: openai.OpenAI) -> None:
    err = bad_request(
        lambda: client.chat.completions.create(model="demo-ct2", messages=HELLO, extra_body={"temprature": 0.2})
    )
    assert err.param == "temprature"
    assert "Unrecognized request argument supplied: temprature" in err.message


@pytest.mark.parametrize("model", ["demo-ct2", "demo-llama"])
def test_answer_length_without_max_tokens_is_the_capped_context_on_every_engine(
    client: openai.OpenAI, model: str
) -> None:
    resp = client.completions.create(model=model, prompt=ZEN_PROMPT, temperature=0)
    assert resp.usage is not None and resp.usage.completion_tokens == LENGTH_CAP
    assert resp.choices[0].finish_reason == "length"


@pytest.mark.parametrize("model", ["demo-ct2", "demo-llama"])
def test_n_gives_indexed_choices_and_summed_usage(client: openai.OpenAI, model: str) -> None:
    resp = client.chat.completions.create(model=model, messages=HELLO, n=2, max_tokens=6, temperature=0)
    assert [c.index for c in resp.choices] == [0, 1]
    assert resp.usage is not None and resp.usage.completion_tokens == 12
    stream = client.chat.completions.create(
        model=model,
        messages=HELLO,
        n=2,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts: dict[int, str] = {0: "", 1: ""}
    finishes: dict[int, str] = {}
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts[0] == texts[1] == resp.choices[0].message.content  # greedy: the same answer twice
    assert finishes == {0: "length", 1: "length"}
    assert usage is not None and usage.completion_tokens == 12


@pytest.mark.parametrize("model", ["demo-ct2", "demo-llama"])
def test_a_seed_reproduces_a_sampled_answer(client: openai.OpenAI, model: str) -> None:
    def sample(seed: int) -> str:
        resp = client.completions.create(model=model, prompt=ZEN_PROMPT, temperature=1.5, seed=seed, max_tokens=16)
        return resp.choices[0].text

    first = sample(1)
    assert [sample(1) for _ in range(4)] == [first] * 4
    assert any(sample(s) != first for s in (2, 3, 4))


def test_json_schema_goes_to_the_backend_that_constrains_and_validates(client: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA, "strict": True}}
    resp = client.chat.completions.create(
        model="demo-both", messages=HELLO, response_format=fmt, temperature=0, max_tokens=64
    )
    doc = json.loads(resp.choices[0].message.content or "")
    assert set(doc) == {"answer", "count"} and isinstance(doc["count"], int) and isinstance(doc["answer"], str)
    err = bad_request(
        lambda: client.chat.completions.create(model="demo-ct2", messages=HELLO, response_format=fmt, max_tokens=20)
    )
    assert err.param == "response_format"
    assert "no backend serving it supports json_schema" in err.message and "ct2-only" not in err.message


# Spec fields and whether the gateway takes them (here: the in-process llama.cpp engine) or refuses
# them by name. Taken fields are checked for effect by the adapter suites; here, none is silently lost.
TAKEN: list[tuple[str, Any]] = [
    ("temperature", 0.5),
    ("top_p", 0.9),
    ("max_tokens", 4),
    ("max_completion_tokens", 4),
    ("stop", ["\n"]),
    ("seed", 3),
    ("n", 1),
    ("user", "u-1"),
    ("metadata", {"app": "tests"}),
    ("safety_identifier", "abc"),
    ("prompt_cache_key", "k"),
    ("store", False),
    ("service_tier", "auto"),
    ("modalities", ["text"]),
    ("response_format", {"type": "text"}),
    ("stream", False),
    ("logprobs", False),
    ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0),
]
REFUSED: list[tuple[str, Any]] = [
    ("audio", {"voice": "alloy", "format": "mp3"}),
    ("prediction", {"type": "content", "content": "Hello"}),
    ("reasoning_effort", "low"),
    ("verbosity", "low"),
    ("web_search_options", {}),
    ("functions", [{"name": "f", "parameters": {}}]),
    ("function_call", "auto"),
    ("store", True),
    ("service_tier", "flex"),
    ("modalities", ["text", "audio"]),
    ("metadata", 3),
    ("logit_bias", {"x": 3}),
    ("top_logprobs", 3),
    ("tool_choice", "auto"),
    ("parallel_tool_calls", True),
    ("stream_options", {"include_usage": True}),
    ("n", 0),
    ("temperature", 3),
    ("prompt_cache_retention", "24h"),
    ("moderation", {}),
]


@pytest.mark.parametrize(("field", "value"), TAKEN, ids=[f"{f}={v!r}" for f, v in TAKEN])
def test_spec_fields_the_gateway_takes(contract_gateway: GatewayProcess, field: str, value: Any) -> None:
    body = {"model": "demo-llama", "messages": HELLO, "max_tokens": 4, field: value}
    resp = httpx.post(f"{contract_gateway.base_url}/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(("field", "value"), REFUSED, ids=[f"{f}={v!r}" for f, v in REFUSED])
def test_spec_fields_refused_by_name(contract_gateway: GatewayProcess, field: str, value: Any) -> None:
    body = {"model": "demo-llama", "messages": HELLO, "max_tokens": 4, field: value}
    resp = httpx.post(f"{contract_gateway.base_url}/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"].split(".")[0].split("[")[0] == field, error
    assert error["type"] == "invalid_request_error"


def test_dropped_fields_are_named_in_a_header(tmp_path: Path, cache_dir: Path) -> None:
    gateways = _gateway(tmp_path, cache_dir, drop=True)
    gateway = next(gateways)
    try:
        fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}}
        body = {"model": "demo-ct2", "messages": HELLO, "max_tokens": 4, "response_format": fmt, "temprature": 1}
        resp = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-enginegate-dropped"] == "response_format,temprature"
        plain = httpx.post(
            f"{gateway.base_url}/v1/chat/completions",
            json={"model": "demo-ct2", "messages": HELLO, "max_tokens": 4},
            timeout=60,
        )
        assert "x-enginegate-dropped" not in plain.headers
    finally:
        next(gateways, None)


@pytest.mark.parametrize("model", ["demo-ct2", "demo-llama"])
def test_an_empty_prompt_is_answered_from_the_start_of_text(contract_gateway: GatewayProcess, model: str) -> None:
    """Found by fuzzing: CTranslate2 crashed on an empty token list (a 502 that opened its breaker)."""
    for _ in range(6):  # more than the breaker's threshold: none of them may count as an engine fault
        resp = httpx.post(
            f"{contract_gateway.base_url}/v1/completions",
            json={"model": model, "prompt": "", "max_tokens": 3},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] >= 1


def test_an_image_for_a_model_without_images_is_a_400_naming_it(contract_gateway: GatewayProcess) -> None:
    """Found by fuzzing: the prompt counter rendered the image part with the chat template (a 500)."""
    image = {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}
    resp = httpx.post(
        f"{contract_gateway.base_url}/v1/chat/completions",
        json={"model": "demo-ct2", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]},
        timeout=60,
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "messages[0].content" and "supports images" in error["message"]
