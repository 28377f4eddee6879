"""The TGI contract fake against TGI's own client, the openai client and byte-level wire checks."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)
from prometheus_client.parser import text_string_to_metric_families
from text_generation import Client
from text_generation.errors import (
    GenerationError,
    IncompleteGenerationError,
    OverloadedError,
    ValidationError,
)
from text_generation.types import FinishReason

from tests.conftest import GREETING_REPLY, ZEN_CONTINUATION, ZEN_PROMPT
from tests.contract.control import FakeControl
from tests.contract.fake_tgi import DEFAULT_TOOL_PROMPT, ChatState, FakeTGI, create_app, parse_tools
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread
from tests.polling import settles, wait_until

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]
GREEDY = {"max_new_tokens": 60, "do_sample": False, "details": True}
# Greedy output of the demo model for this prompt runs past 1100 tokens without EOS: long enough that
# only max_new_tokens ends it, and slow enough (~0.25 s for 1024 tokens) that a disconnect lands mid-way.
LOOP_PROMPT = "the the the"
# From /work/shared/reference/tgi/examples.json.
OVERLOADED_EVENT_RAW = b'data:{"error":"Model is overloaded","error_type":"overloaded"}\n\n'
CHAT_TOP_P_ERROR_MESSAGE = "Input validation error: `top_p` must be > 0.0 and < 1.0"
CHAT_TOP_P_ERROR_RAW = (
    b'data:{"error":{"message":"Input validation error: `top_p` must be > 0.0 and < 1.0","http_status_code":422}}'
    b"\n\ndata:[DONE]\n\n"
)


@dataclass
class Fake:
    url: str
    engine: TinyEngine
    control: FakeControl

    @property
    def greeting_tokens(self) -> int:
        """Tokens TGI reports for the greedy greeting: its text's, and the end token (TGI counts it)."""
        return self.engine.count_tokens(GREETING_REPLY) + 1

    @property
    def hello(self) -> str:
        return self.engine.render_chat([{"role": "user", "content": "Hello"}])

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=60)

    def events(self, path: str, body: dict[str, Any]) -> tuple[httpx.Response, bytes, list[Any]]:
        """Status, raw bytes and decoded ``data:`` payloads of one SSE response."""
        resp = self.post(path, body)
        frames = [f for f in resp.content.split(b"\n\n") if f]
        assert all(f.startswith(b"data:") and not f.startswith(b"data: ") for f in frames), resp.content
        return resp, resp.content, [f[5:].decode() if f == b"data:[DONE]" else json.loads(f[5:]) for f in frames]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyEngine]:
    before = set(threading.enumerate())
    yield TinyEngine(tmp_path_factory.mktemp("tgi-engine"))
    for thread in set(threading.enumerate()) - before:  # no generator thread may outlive the engine
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def served(engine: TinyEngine) -> Iterator[tuple[str, FakeControl]]:
    control = FakeControl()
    with serve_in_thread(create_app(engine, control), ready_path="/health") as url:
        yield url, control


@pytest.fixture()
def fake(served: tuple[str, FakeControl], engine: TinyEngine) -> Fake:
    url, control = served
    control.fail_next, control.delay_s, control.healthy = None, 0.0, True
    return Fake(url, engine, control)


def metrics(fake: Fake) -> dict[str, dict[tuple[str, ...], float]]:
    """Family -> (sample name, "label=value"...) -> value, as prometheus_client parses /metrics."""
    families = text_string_to_metric_families(httpx.get(f"{fake.url}/metrics").text)
    return {
        fam.name: {(s.name, *(f"{k}={v}" for k, v in sorted(s.labels.items()))): s.value for s in fam.samples}
        for fam in families
    }


# --- the official text-generation client (native routes through the compat route "/") ---


def test_text_generation_client_generate_gives_the_greedy_greeting(fake: Fake) -> None:
    client = Client(fake.url, timeout=60)
    resp = client.generate(fake.hello, do_sample=False, max_new_tokens=60)
    assert resp.generated_text == GREETING_REPLY
    assert resp.details.finish_reason == FinishReason.EndOfSequenceToken
    assert resp.details.generated_tokens == fake.greeting_tokens  # TGI counts the EOS token
    assert resp.details.seed is None  # greedy
    last = resp.details.tokens[-1]
    assert (last.text, last.special) == ("<|im_end|>", True)
    full = client.generate(fake.hello, do_sample=False, max_new_tokens=60, return_full_text=True)
    assert full.generated_text == fake.hello + GREETING_REPLY


def test_text_generation_client_generate_stream(fake: Fake) -> None:
    events = list(Client(fake.url, timeout=60).generate_stream(fake.hello, do_sample=False, max_new_tokens=60))
    assert "".join(e.token.text for e in events if not e.token.special) == GREETING_REPLY
    assert len(events) == fake.greeting_tokens  # one event per token, EOS included
    assert all(e.generated_text is None and e.details is None for e in events[:-1])
    assert events[-1].generated_text == GREETING_REPLY
    assert events[-1].details is not None
    assert events[-1].details.finish_reason == FinishReason.EndOfSequenceToken
    assert events[-1].details.generated_tokens == fake.greeting_tokens


# --- raw framing ---


def test_generate_stream_framing(fake: Fake) -> None:
    resp, raw, events = fake.events("/generate_stream", {"inputs": fake.hello, "parameters": GREEDY})
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    assert resp.headers["x-accel-buffering"] == "no"
    assert b"[DONE]" not in raw
    assert raw.startswith(b'data:{"index":1,"token":{"id":')
    assert raw.endswith(b"}}\n\n")
    final = events[-1]
    token = final["token"]
    assert token == {"id": token["id"], "text": "<|im_end|>", "logprob": token["logprob"], "special": True}
    assert -1.0 < token["logprob"] < 0.0  # the demo model is sure its greeting ends here
    assert final["generated_text"] == GREETING_REPLY
    n_in = fake.engine.count_tokens(fake.hello)
    assert final["details"] == {
        "finish_reason": "eos_token",
        "generated_tokens": fake.greeting_tokens,
        "seed": None,
    } | {"input_length": n_in}
    assert list(events[0]) == ["index", "token", "generated_text", "details"]


def test_generate_stream_details_only_when_asked(fake: Fake) -> None:
    _, _, events = fake.events("/generate_stream", {"inputs": fake.hello, "parameters": {"max_new_tokens": 60}})
    assert events[-1]["generated_text"] == GREETING_REPLY
    assert events[-1]["details"] is None


def test_generate_json_and_headers(fake: Fake) -> None:
    resp = fake.post("/generate", {"inputs": fake.hello, "parameters": {"max_new_tokens": 60}})
    assert resp.status_code == 200
    assert resp.json() == {"generated_text": GREETING_REPLY}  # details default false
    assert resp.headers["x-generated-tokens"] == str(fake.greeting_tokens)
    assert resp.headers["x-prompt-tokens"] == str(fake.engine.count_tokens(fake.hello))
    assert resp.headers["x-compute-characters"] == str(len(fake.hello))
    assert {"x-compute-type", "x-total-time", "x-queue-time", "x-inference-time", "x-time-per-token"} <= set(
        resp.headers
    )


def test_chat_stream_framing(fake: Fake) -> None:
    body = {"model": "tgi", "messages": HELLO, "temperature": 0, "stream": True}
    resp, raw, events = fake.events("/v1/chat/completions", body)
    assert resp.status_code == 200
    assert raw.endswith(b"data:[DONE]\n\n")
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "" and c["usage"] is None for c in chunks)
    assert {c["system_fingerprint"] for c in chunks} == {"3.3.6-dev0-native"}
    assert {c["model"] for c in chunks} == {"enginegate-demo"}  # "tgi" means the served model
    assert list(chunks[0]) == ["object", "id", "created", "model", "system_fingerprint", "choices", "usage"]
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == GREETING_REPLY
    assert chunks[-1]["choices"][0] == {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": "stop",
    }


def test_stop_sequence_stays_in_the_text(fake: Fake) -> None:
    params = GREEDY | {"stop": ["demo"]}
    out = fake.post("/generate", {"inputs": fake.hello, "parameters": params}).json()
    assert out["generated_text"] == "Hello! I am the enginegate demo"
    assert out["details"]["finish_reason"] == "stop_sequence"
    _, _, events = fake.events("/generate_stream", {"inputs": fake.hello, "parameters": params})
    assert events[-1]["details"]["finish_reason"] == "stop_sequence"
    assert events[-1]["generated_text"] == "Hello! I am the enginegate demo"


def test_length_and_the_1024_token_chunks(fake: Fake) -> None:
    out = fake.post("/generate", {"inputs": ZEN_PROMPT, "parameters": GREEDY | {"max_new_tokens": 3}}).json()
    assert out["details"]["finish_reason"] == "length"
    assert out["details"]["generated_tokens"] == 3
    assert ZEN_CONTINUATION.startswith(out["generated_text"])
    # 3000 passes validation (only min(3000, 1024) is checked); the re-queued chunk would exceed max_input_tokens.
    big = fake.post("/generate", {"inputs": LOOP_PROMPT, "parameters": GREEDY | {"max_new_tokens": 3000}}).json()
    assert (big["details"]["finish_reason"], big["details"]["generated_tokens"]) == ("length", 1024)


# --- validation traps ---


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"temperature": 0}, "`temperature` must be strictly positive"),
        ({"top_p": 1.0}, "`top_p` must be > 0.0 and < 1.0"),
        ({"top_k": 0}, "`top_k` must be strictly positive"),
        ({"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "`stop` supports up to 4 stop sequences. Given: 5"),
    ],
)
def test_native_validation_traps(fake: Fake, params: dict[str, Any], message: str) -> None:
    resp = fake.post("/generate", {"inputs": fake.hello, "parameters": params})
    assert resp.status_code == 422
    assert resp.json() == {"error": f"Input validation error: {message}", "error_type": "validation"}
    stream, raw, _ = fake.events("/generate_stream", {"inputs": fake.hello, "parameters": params})
    assert stream.status_code == 200  # validation runs inside the stream
    assert raw == b"data:" + json.dumps(resp.json(), separators=(",", ":")).encode() + b"\n\n"


def test_max_total_tokens_message(fake: Fake) -> None:
    long_prompt = "Beautiful is better than ugly. " * 200
    n_in = fake.engine.count_tokens(long_prompt)
    assert 1024 < n_in < 2048
    resp = fake.post("/generate", {"inputs": long_prompt, "parameters": {"max_new_tokens": 1000}})
    assert resp.status_code == 422
    assert resp.json()["error"] == (
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 2048. "
        f"Given: {n_in} `inputs` tokens and 1000 `max_new_tokens`"
    )
    short = fake.post("/generate", {"inputs": long_prompt, "parameters": {"max_new_tokens": 10}})
    assert short.json()["error"] == f"Input validation error: `inputs` must have less than 1024 tokens. Given: {n_in}"


def test_deserializer_behaviour(fake: Fake) -> None:
    unknown = fake.post("/generate", {"inputs": fake.hello, "parameters": GREEDY | {"made_up": 1}, "x": 2})
    assert unknown.json()["generated_text"] == GREETING_REPLY  # unknown fields are ignored
    null_stop = fake.post("/generate", {"inputs": fake.hello, "parameters": {"stop": None}})
    assert null_stop.status_code == 422  # axum's rejection, plain text
    assert null_stop.headers["content-type"].startswith("text/plain")
    assert null_stop.text.startswith("Failed to deserialize the JSON body into the target type: parameters.stop")
    missing = fake.post("/generate", {"parameters": GREEDY})
    assert (missing.status_code, missing.text) == (
        422,
        "Failed to deserialize the JSON body into the target type: missing field `inputs`",
    )
    # No max_new_tokens: max_total_tokens - input_length (capped to a 1024 chunk), so EOS ends it here.
    default = fake.post("/generate", {"inputs": fake.hello, "parameters": {"details": True}}).json()
    assert default["details"]["finish_reason"] == "eos_token"


def test_chat_top_p_one(fake: Fake) -> None:
    body = {"model": "enginegate-demo", "messages": HELLO, "top_p": 1.0}
    resp = fake.post("/v1/chat/completions", body)
    assert resp.status_code == 422
    assert resp.json() == {"error": CHAT_TOP_P_ERROR_MESSAGE, "error_type": "validation"}
    stream = fake.post("/v1/chat/completions", body | {"stream": True})
    assert (stream.status_code, stream.content) == (200, CHAT_TOP_P_ERROR_RAW)
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIError, match="top_p"):
        list(client.chat.completions.create(model="enginegate-demo", messages=HELLO, top_p=1.0, stream=True))


# --- faults ---


def test_fault_overloaded(fake: Fake) -> None:
    client = Client(fake.url, timeout=60)
    fake.control.fail_next = "overloaded"
    with pytest.raises(OverloadedError):
        client.generate(fake.hello, max_new_tokens=60)
    fake.control.fail_next = "overloaded"
    resp = fake.post("/generate", {"inputs": fake.hello, "parameters": GREEDY})
    assert (resp.status_code, resp.json()) == (429, {"error": "Model is overloaded", "error_type": "overloaded"})
    fake.control.fail_next = "overloaded"
    stream = fake.post("/generate_stream", {"inputs": fake.hello, "parameters": GREEDY})
    assert (stream.status_code, stream.content) == (200, OVERLOADED_EVENT_RAW)
    assert fake.post("/generate", {"inputs": fake.hello, "parameters": GREEDY}).status_code == 200  # one-shot


def test_fault_overloaded_midstream(fake: Fake) -> None:
    fake.control.fail_next = "overloaded_midstream"
    resp, raw, events = fake.events("/generate_stream", {"inputs": fake.hello, "parameters": GREEDY})
    assert resp.status_code == 200
    assert [e.get("index") for e in events[:3]] == [1, 2, 3]
    assert raw.endswith(b"\n\n" + OVERLOADED_EVENT_RAW) and len(events) == 4
    fake.control.fail_next = "overloaded_midstream"
    with pytest.raises(OverloadedError):
        list(Client(fake.url, timeout=60).generate_stream(fake.hello, max_new_tokens=60))


def test_fault_generation(fake: Fake) -> None:
    fake.control.fail_next = "generation"
    resp = fake.post("/generate", {"inputs": fake.hello, "parameters": GREEDY})
    assert resp.status_code == 424
    assert resp.json()["error_type"] == "generation"
    assert resp.json()["error"].startswith("Request failed during generation: ")
    fake.control.fail_next = "generation"
    _, _, events = fake.events("/generate_stream", {"inputs": fake.hello, "parameters": GREEDY})
    assert len(events) == 4 and events[-1]["error_type"] == "generation"
    fake.control.fail_next = "generation"
    with pytest.raises(GenerationError):
        Client(fake.url, timeout=60).generate(fake.hello, max_new_tokens=60)


def test_fault_incomplete(fake: Fake) -> None:
    fake.control.fail_next = "incomplete"
    resp = fake.post("/generate", {"inputs": fake.hello, "parameters": GREEDY})
    assert (resp.status_code, resp.json()) == (
        500,
        {"error": "Incomplete generation", "error_type": "incomplete_generation"},
    )
    fake.control.fail_next = "incomplete"
    _, _, events = fake.events("/generate_stream", {"inputs": fake.hello, "parameters": GREEDY})
    assert len(events) == fake.greeting_tokens  # all tokens but the last, then the error instead of it
    assert events[-1] == {"error": "Incomplete generation stream", "error_type": "incomplete_generation_stream"}
    fake.control.fail_next = "incomplete"
    with pytest.raises(IncompleteGenerationError):
        Client(fake.url, timeout=60).generate(fake.hello, max_new_tokens=60)


def test_fault_validation(fake: Fake) -> None:
    fake.control.fail_next = "validation"
    with pytest.raises(ValidationError):
        Client(fake.url, timeout=60).generate(fake.hello, max_new_tokens=60)
    fake.control.fail_next = "validation"
    resp = fake.post("/v1/chat/completions", {"messages": HELLO, "temperature": 0})
    assert resp.status_code == 422
    assert resp.json()["error_type"] == "validation"


def test_delay_is_queue_time(fake: Fake) -> None:
    fake.control.delay_s = 0.6
    result: list[httpx.Response] = []
    worker = threading.Thread(
        target=lambda: result.append(fake.post("/generate", {"inputs": fake.hello, "parameters": GREEDY}))
    )
    started = time.monotonic()
    worker.start()
    wait_until(
        lambda: metrics(fake)["tgi_queue_size"][("tgi_queue_size",)] == 1,
        message="the delayed request was never counted in tgi_queue_size while it waited",
    )
    worker.join(timeout=30)
    assert time.monotonic() - started >= 0.6
    assert int(result[0].headers["x-queue-time"]) >= 500
    assert metrics(fake)["tgi_queue_size"][("tgi_queue_size",)] == 0


# --- info, health, models, metrics ---


def test_info_health_models(fake: Fake) -> None:
    info = httpx.get(f"{fake.url}/info").json()
    assert info["model_id"] == "enginegate-demo"
    assert (info["max_input_tokens"], info["max_total_tokens"]) == (1024, 2048)
    assert (info["version"], info["router"], info["max_stop_sequences"]) == ("3.3.6-dev0", "text-generation-router", 4)
    health = httpx.get(f"{fake.url}/health")
    assert (health.status_code, health.content) == (200, b"")
    fake.control.healthy = False
    sick = httpx.get(f"{fake.url}/health")
    assert (sick.status_code, sick.json()) == (503, {"error": "unhealthy", "error_type": "healthcheck"})
    models = httpx.get(f"{fake.url}/v1/models").json()
    assert models == {
        "object": "list",
        "data": [{"id": "enginegate-demo", "object": "model", "created": 0, "owned_by": "enginegate-demo"}],
    }


def test_metrics_parse_with_tgi_names(fake: Fake) -> None:
    before = metrics(fake)
    assert fake.post("/generate", {"inputs": fake.hello, "parameters": GREEDY}).status_code == 200
    assert fake.post("/generate", {"inputs": fake.hello, "parameters": {"temperature": 0}}).status_code == 422
    after = metrics(fake)

    def value(fams: dict[str, Any], family: str, *key: Any) -> float:
        return float(fams.get(family, {}).get(key, 0))

    requests = ("tgi_request_count", "tgi_request_count_total")
    assert value(after, *requests) == value(before, *requests) + 2
    assert value(after, "tgi_request_success", "tgi_request_success_total") >= 1
    failures = ("tgi_request_failure_total", "err=validation")
    assert value(after, "tgi_request_failure", *failures) == value(before, "tgi_request_failure", *failures) + 1
    assert after["tgi_queue_size"] == {("tgi_queue_size",): 0}
    assert after["tgi_batch_current_size"] == {("tgi_batch_current_size",): 0}
    assert value(after, "tgi_request_generated_tokens", "tgi_request_generated_tokens_count") >= 1
    assert "tgi_request_duration" in after and "tgi_request_input_length" in after


# --- the openai client on the Messages API and /v1/completions ---


def test_openai_client_chat_stream_with_usage(fake: Fake) -> None:
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="enginegate-demo",
            messages=HELLO,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == GREETING_REPLY
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    n_in = fake.engine.count_tokens(fake.hello)
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (n_in, fake.greeting_tokens)
    assert all(c.usage is None for c in chunks[:-1])
    assert {c.model for c in chunks} == {"enginegate-demo"}


def test_openai_client_chat_and_completions(fake: Fake) -> None:
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x", max_retries=0)
    chat = client.chat.completions.create(model="my-alias", messages=HELLO, temperature=0)
    assert chat.choices[0].message.content == GREETING_REPLY
    assert (chat.choices[0].finish_reason, chat.model, chat.id) == ("stop", "my-alias", "")
    assert chat.usage is not None and chat.usage.completion_tokens == fake.greeting_tokens
    comp = client.completions.create(model="enginegate-demo", prompt=ZEN_PROMPT, max_tokens=8, temperature=0)
    assert ZEN_CONTINUATION.startswith(comp.choices[0].text)
    assert comp.choices[0].finish_reason == "length"
    body = {"prompt": fake.hello, "max_tokens": 60, "temperature": 0, "stream": True}
    _, raw, events = fake.events("/v1/completions", body)
    assert raw.endswith(b"data:[DONE]\n\n")
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]] == [""] * (fake.greeting_tokens - 1) + ["eos_token"]
    assert events[-2]["choices"][0]["text"] == "<|im_end|>"  # the token text, special or not
    assert events[-2]["usage"]["completion_tokens"] == fake.greeting_tokens


# --- cancellation ---


def test_client_disconnect_stops_generation(fake: Fake) -> None:
    body = {"inputs": LOOP_PROMPT, "parameters": {"max_new_tokens": 3000, "do_sample": False, "details": True}}
    full = fake.post("/generate", body).json()["details"]
    assert (full["finish_reason"], full["generated_tokens"]) == ("length", 1024)  # only the limit ends it
    start, threads = fake.engine.generated_tokens, set(threading.enumerate())
    with httpx.Client(timeout=30) as client, client.stream("POST", f"{fake.url}/generate_stream", json=body) as resp:
        first = next(line for line in resp.iter_lines() if line.startswith("data:"))
        assert json.loads(first[5:])["index"] == 1
    # Closing the engine stream sets its stop flag; its worker thread then finishes the step in flight and exits.
    for worker in set(threading.enumerate()) - threads:
        worker.join(timeout=5)
        assert not worker.is_alive()
    assert fake.engine.active_streams == 0
    # Stopped means the counter stays put: settles fails if it is still moving at its deadline.
    settled = settles(lambda: fake.engine.generated_tokens, quiet_s=0.5) - start
    assert 0 < settled < full["generated_tokens"]  # stopped well before the 1024 a finished request makes


# --- capabilities as TGI's schema has them (docs/openapi.json; router/src/lib.rs, chat.rs) ---

CITY: dict[str, object] = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": CITY},
}
WEATHER_Q: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]
DESERIALIZE = "Failed to deserialize the JSON body into the target type: "


@pytest.mark.parametrize(
    ("grammar", "status", "error"),
    [
        ({"type": "json_schema", "json_schema": {"schema": CITY}}, 422, "response_format: missing field `value`"),
        ({"type": "json_object"}, 422, "response_format: missing field `value`"),
        ({"type": "grammar", "value": "x"}, 422, "response_format: unknown variant `grammar`"),
        ({"type": "regex", "value": 3}, 422, "response_format: invalid type: int `3`, expected a string"),
        ({"type": "json_schema", "value": {"name": "x"}}, 422, "response_format: missing field `schema`"),
    ],
    ids=["openai_json_schema", "openai_json_object", "unknown_type", "regex_not_string", "no_schema"],
)
def test_openai_response_formats_are_not_tgis_shape(
    fake: Fake, grammar: dict[str, Any], status: int, error: str
) -> None:
    resp = fake.post("/v1/chat/completions", {"messages": HELLO, "response_format": grammar})
    assert resp.status_code == status
    assert resp.text.startswith(DESERIALIZE + error), resp.text


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"type": "object"}, "grammar is not valid: Grammar must have a 'properties' field"),
        ({"properties": {"a": {"type": 5}}}, "grammar is not valid: "),
        ("{not json", "grammar is not valid: "),
        (3, "grammar is not supported"),
    ],
    ids=["no_properties", "not_a_schema", "unparsable_string", "not_an_object"],
)
def test_grammar_validation(fake: Fake, value: Any, message: str) -> None:
    resp = fake.post("/generate", {"inputs": "x", "parameters": {"grammar": {"type": "json", "value": value}}})
    assert resp.status_code == 422
    assert resp.json()["error_type"] == "validation"
    assert resp.json()["error"].startswith(f"Input validation error: {message}")


def test_grammars_force_schema_valid_json_with_keys_in_order(fake: Fake) -> None:
    schema = {"properties": {"zeta": {"type": "integer", "minimum": 3}, "alpha": {"type": "boolean"}}}
    for grammar in ({"type": "json", "value": schema}, {"type": "json", "value": json.dumps(schema)}):
        out = fake.post("/generate", {"inputs": "x", "parameters": GREEDY | {"grammar": grammar}}).json()
        assert out["generated_text"] == '{"alpha": true, "zeta": 3}'  # serde_json's maps are sorted
        assert out["details"]["finish_reason"] == "eos_token"
    chat = {"messages": HELLO, "response_format": {"type": "json_schema", "value": {"name": "s", "schema": schema}}}
    answer = fake.post("/v1/chat/completions", chat).json()
    assert json.loads(answer["choices"][0]["message"]["content"]) == {"alpha": True, "zeta": 3}
    regex = fake.post(
        "/generate", {"inputs": "x", "parameters": GREEDY | {"grammar": {"type": "regex", "value": "[0-9]+"}}}
    )
    assert regex.json()["generated_text"] == "0"


def test_top_n_tokens(fake: Fake) -> None:
    params = GREEDY | {"top_n_tokens": 2, "max_new_tokens": 3}
    _, _, events = fake.events("/generate_stream", {"inputs": fake.hello, "parameters": params})
    assert list(events[0]) == ["index", "token", "top_tokens", "generated_text", "details"]
    for ev in events:
        tops = ev["top_tokens"]
        assert len(tops) == 2 and tops[0]["logprob"] >= tops[1]["logprob"]
        assert tops[0]["id"] == ev["token"]["id"]  # greedy: the chosen token is the likeliest
        assert abs(tops[0]["logprob"] - ev["token"]["logprob"]) < 1e-4
    whole = fake.post("/generate", {"inputs": fake.hello, "parameters": params}).json()["details"]
    assert [t[0]["id"] for t in whole["top_tokens"]] == [t["id"] for t in whole["tokens"]]
    too_many = fake.post("/generate", {"inputs": fake.hello, "parameters": {"top_n_tokens": 6}})
    assert too_many.json()["error"] == "Input validation error: `top_n_tokens` must be >= 0 and <= 5. Given: 6"


def test_chat_logprobs_and_unused_fields(fake: Fake) -> None:
    body = {"messages": HELLO, "temperature": 0, "logprobs": True, "top_logprobs": 2, "n": 3, "logit_bias": [0.5]}
    answer = fake.post("/v1/chat/completions", body).json()
    assert len(answer["choices"]) == 1  # n is unused
    content = answer["choices"][0]["logprobs"]["content"]
    assert "".join(t["token"] for t in content) == GREETING_REPLY + "<|im_end|>"  # the end token is listed
    assert all(len(t["top_logprobs"]) == 2 and set(t) == {"token", "logprob", "top_logprobs"} for t in content)
    as_openai = fake.post("/v1/chat/completions", {"messages": HELLO, "logit_bias": {"5": 1}})
    assert as_openai.status_code == 422  # TGI's logit_bias is a list of floats
    assert as_openai.text == DESERIALIZE + "logit_bias: invalid type: dict `{'5': 1}`, expected a sequence"


def test_tool_call_answer_with_the_openai_client(fake: Fake) -> None:
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="-")
    answer = client.chat.completions.create(
        model="tgi",
        messages=WEATHER_Q,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=200,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"  # TGI's, not "tool_calls"
    assert choice.message.content is None
    calls = [c for c in choice.message.tool_calls or [] if isinstance(c, ChatCompletionMessageFunctionToolCall)]
    assert [(c.id, c.type, c.function.name) for c in calls] == [("0", "function", "get_weather")]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}  # a JSON string, as OpenAI's


def test_tool_call_stream_is_tgis_chat_state(fake: Fake) -> None:
    body = {
        "messages": WEATHER_Q, "tools": [WEATHER_TOOL], "tool_choice": "required", "stream": True, "max_tokens": 200,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    _, _, events = fake.events("/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks]
    # Tokens held while the name was unknown, one per piece, and the end token: more than there are pieces.
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > len(calls) + 1
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)  # no finish after a call
    assert calls[0] == {
        "index": 0,
        "id": "0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "{"},
    }
    assert all(c["function"]["name"] is None and c["id"] == "0" for c in calls[1:])
    arguments = "".join(c["function"]["arguments"] for c in calls)
    # "{" stands for the token that completed the name: when it ended at the name's closing quote, the
    # separating comma follows (TGI's quirk, tokenizer-dependent; see the ChatState test below).
    assert json.loads(re.sub(r"^\{\s*,", "{", arguments)) == {"city": "Paris"}


def chat_state_events(tokens: list[str]) -> list[list[dict[str, Any]] | None]:
    state = ChatState(True, False, {"id": "", "created": 0, "model": "m", "system_fingerprint": "f"}, False, "0")
    return [
        state.push({"index": i, "token": {"id": 1, "text": t, "logprob": 0.0, "special": False}, "details": None})
        for i, t in enumerate(tokens, 1)
    ]


def pieces(events: list[list[dict[str, Any]] | None]) -> list[tuple[str | None, str]]:
    return [
        (call["function"]["name"], call["function"]["arguments"])
        for chunks in events
        for chunk in chunks or []
        for call in chunk["choices"][0]["delta"]["tool_calls"]
    ]


def test_chat_state_is_tgis_on_tgis_own_token_sequence() -> None:
    # router/src/chat.rs test_chat_stream_tool_get_weather, token for token.
    head = ['{"', "function", '":', ' {"', "_", "name", '":', ' "', "get", "_current", "_weather"]
    tail = ['",', ' "', "location", '":', ' "', "San", " Francisco", ",", " CA", '",', ' "', "format", '":', ' "']
    events = chat_state_events([*head, *tail, "c", "elsius", '"}}'])
    assert all(e == [] for e in events[: len(head)])  # held until the name parses
    got = pieces(events)
    assert got[0] == ("get_current_weather", "{") and all(name is None for name, _ in got[1:])
    assert "".join(a for _, a in got) == '{ "location": "San Francisco, CA", "format": "celsius"}'
    # The same call with the name's closing quote alone in its token: the comma starts the arguments.
    split = chat_state_events([*head, '"', ",", ' "', "location", '":', ' "', "Paris", '"}}'])
    assert "".join(a for _, a in pieces(split)) == '{, "location": "Paris"}'
    assert chat_state_events(['{"function": {"_name": "no_tool"', "}}"])[0] is None  # ChatEvent::NoTool


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            {"tools": [WEATHER_TOOL], "response_format": {"type": "json", "value": CITY}},
            "Grammar and tools are mutually exclusive",
        ),
        ({"tools": [WEATHER_TOOL], "tool_choice": "get_time"}, "Tool with name get_time not found"),
    ],
    ids=["tools_and_grammar", "unknown_tool"],
)
def test_tool_errors(fake: Fake, body: dict[str, Any], error: str) -> None:
    resp = fake.post("/v1/chat/completions", {"messages": HELLO} | body)
    assert (resp.status_code, resp.json()) == (422, {"error": error, "error_type": "tool_error"})


def test_tool_shapes_serde_refuses(fake: Fake) -> None:
    no_params = {"type": "function", "function": {"name": "ping"}}
    resp = fake.post("/v1/chat/completions", {"messages": HELLO, "tools": [no_params]})
    assert (resp.status_code, resp.text) == (422, DESERIALIZE + "tools[0].function: missing field `arguments`")
    bad_choice = fake.post("/v1/chat/completions", {"messages": HELLO, "tool_choice": {"name": "x"}})
    assert bad_choice.status_code == 422
    assert "did not match any variant of untagged enum ToolTypeDeserializer" in bad_choice.text


def test_auto_tool_choice_without_a_call_generates_again(fake: Fake) -> None:
    body = {"messages": HELLO, "tools": [WEATHER_TOOL], "temperature": 0, "max_tokens": 200}
    answer = fake.post("/v1/chat/completions", body).json()
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": GREETING_REPLY}
    _, _, events = fake.events("/v1/chat/completions", body | {"stream": True})
    assert "".join(e["choices"][0]["delta"]["content"] for e in events[:-1]) == GREETING_REPLY
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_message_bodies_serde_reads(fake: Fake) -> None:
    call = {"id": "0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [*WEATHER_Q, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "18 C"}]
    assert fake.post("/v1/chat/completions", {"messages": history, "max_tokens": 5}).status_code == 200
    for bad in ({"role": "assistant", "content": None}, {"role": "user"}, {"content": "x"}):
        resp = fake.post("/v1/chat/completions", {"messages": [bad]})
        assert (resp.status_code, resp.text.startswith(DESERIALIZE + "messages[0]")) == (422, True), resp.text


def test_tools_reach_the_template_as_tgi_serializes_them(engine: TinyEngine) -> None:
    tgi = FakeTGI(engine, FakeControl(), "enginegate-demo", 1024, 2048, None, False)
    tools: list[Any] = [WEATHER_TOOL]
    body: dict[str, Any] = {"messages": [dict(m) for m in WEATHER_Q], "tools": tools}
    req, using_tools = tgi.chat_request(body, parse_tools(tools), "required", None)
    assert using_tools
    # The demo template uses `tools`: TGI hands them over (the schema as a string under `arguments`,
    # so this template, which reads `parameters`, shows none) and pushes the tool prompt onto the question.
    assert '{"type": "function", "function": {"name": "get_weather"}}' in req.inputs
    assert f"What is the weather in Paris?\n---\n{DEFAULT_TOOL_PROMPT}<|im_end|>" in req.inputs
    assert req.grammar is not None and set(req.grammar["value"]["$functions"]) == {"get_weather"}
