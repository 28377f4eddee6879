"""The TGI contract fake against TGI's own client, the openai client and byte-level wire checks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
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
from tests.contract.fake_tgi import create_app
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread
from tests.polling import settles, wait_until

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]
GREEDY = {"max_new_tokens": 60, "do_sample": False, "details": True}
# Greedy output of the demo model for this prompt runs 1536 tokens before EOS: long enough that only
# max_new_tokens ends it, and slow enough (~0.25 s for 1024 tokens) that a disconnect lands mid-way.
LOOP_PROMPT = "a a ugly the"
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
    assert resp.details.generated_tokens == 34  # TGI counts the EOS token
    assert resp.details.seed is None  # greedy
    last = resp.details.tokens[-1]
    assert (last.text, last.special) == ("<|im_end|>", True)
    full = client.generate(fake.hello, do_sample=False, max_new_tokens=60, return_full_text=True)
    assert full.generated_text == fake.hello + GREETING_REPLY


def test_text_generation_client_generate_stream(fake: Fake) -> None:
    events = list(Client(fake.url, timeout=60).generate_stream(fake.hello, do_sample=False, max_new_tokens=60))
    assert "".join(e.token.text for e in events if not e.token.special) == GREETING_REPLY
    assert len(events) == 34  # one event per token, EOS included
    assert all(e.generated_text is None and e.details is None for e in events[:-1])
    assert events[-1].generated_text == GREETING_REPLY
    assert events[-1].details is not None
    assert events[-1].details.finish_reason == FinishReason.EndOfSequenceToken
    assert events[-1].details.generated_tokens == 34


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
    assert final["details"] == {"finish_reason": "eos_token", "generated_tokens": 34, "seed": None} | {
        "input_length": n_in
    }
    assert list(events[0]) == ["index", "token", "generated_text", "details"]


def test_generate_stream_details_only_when_asked(fake: Fake) -> None:
    _, _, events = fake.events("/generate_stream", {"inputs": fake.hello, "parameters": {"max_new_tokens": 60}})
    assert events[-1]["generated_text"] == GREETING_REPLY
    assert events[-1]["details"] is None


def test_generate_json_and_headers(fake: Fake) -> None:
    resp = fake.post("/generate", {"inputs": fake.hello, "parameters": {"max_new_tokens": 60}})
    assert resp.status_code == 200
    assert resp.json() == {"generated_text": GREETING_REPLY}  # details default false
    assert resp.headers["x-generated-tokens"] == "34"
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
    assert len(events) == 34  # 33 tokens, then the error instead of the last one
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
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (n_in, 34)
    assert all(c.usage is None for c in chunks[:-1])
    assert {c.model for c in chunks} == {"enginegate-demo"}


def test_openai_client_chat_and_completions(fake: Fake) -> None:
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x", max_retries=0)
    chat = client.chat.completions.create(model="my-alias", messages=HELLO, temperature=0)
    assert chat.choices[0].message.content == GREETING_REPLY
    assert (chat.choices[0].finish_reason, chat.model, chat.id) == ("stop", "my-alias", "")
    assert chat.usage is not None and chat.usage.completion_tokens == 34
    comp = client.completions.create(model="enginegate-demo", prompt=ZEN_PROMPT, max_tokens=8, temperature=0)
    assert ZEN_CONTINUATION.startswith(comp.choices[0].text)
    assert comp.choices[0].finish_reason == "length"
    body = {"prompt": fake.hello, "max_tokens": 60, "temperature": 0, "stream": True}
    _, raw, events = fake.events("/v1/completions", body)
    assert raw.endswith(b"data:[DONE]\n\n")
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]] == [""] * 33 + ["eos_token"]
    assert events[-2]["choices"][0]["text"] == "<|im_end|>"  # the token text, special or not
    assert events[-2]["usage"]["completion_tokens"] == 34


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
