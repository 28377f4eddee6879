"""What clients see at the front door, through a real server and the official ``openai`` client: one
Authorization header or a 400, error messages in the gateway's words (the engine's go to the log with
the request id), echoed input cut short, the gateway's own request id for every request, /metrics
behind a key when keys are required, and /readyz that is not ready when no backend can take a request."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from backends.base import BackendError, ErrorKind
from backends.http_errors import from_event, from_response
from gateway.app import create_app
from gateway.config import load_config
from tests.conftest import write_config
from tests.fakes import ScriptedBackend, factory, serve_in_thread
from tests.polling import wait_until

Fleet = tuple[str, ScriptedBackend, ScriptedBackend]
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]
FLEET = """
routing: {first_token_timeout_s: 2, breaker: {threshold: 1, cooldown_s: 5}}
limits: {health_interval_s: 0.2}
models: [{name: m, gguf: "{GGUF}"}]
backends:
  - {name: gpu-node-a, engine: ctranslate2, model: m}
  - {name: gpu-node-b, engine: ctranslate2, model: m}
"""
# What an engine's internal failure looks like: hosts, paths, a traceback, and a marker to look for.
INTERNAL = (
    b'{"object":"error","message":"CUDA error: device-side assert triggered in /opt/vllm/worker/model_runner.py:812 '
    b'on gpu-7.cluster.internal:8000 (marker-7f3a)\\nTraceback (most recent call last):\\n  File \\"x.py\\""}'
)


@pytest.fixture()
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    a, b = ScriptedBackend("gpu-node-a", "m"), ScriptedBackend("gpu-node-b", "m")
    app = create_app(load_config(write_config(tmp_path / "c.yaml", FLEET)), factory({"gpu-node-a": a, "gpu-node-b": b}))
    with serve_in_thread(app) as base:
        yield base, a, b


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=10)


def said(exc: openai.APIError) -> str:
    """The error's message as the gateway wrote it (the client prefixes a status error's with its code)."""
    body = exc.body
    return str(body["message"]) if isinstance(body, dict) and "message" in body else exc.message


def test_two_authorization_headers_are_a_400_on_every_route(fleet: Fleet) -> None:
    base, a, _ = fleet
    twice = [("authorization", "Bearer one"), ("authorization", "Bearer two")]
    body = {"model": "m", "messages": HELLO, "max_tokens": 4}
    answers = [
        httpx.post(f"{base}/v1/chat/completions", json=body, headers=twice),
        httpx.post(f"{base}/v1/messages", json={**body, "max_tokens": 4}, headers=twice),
        httpx.get(f"{base}/v1/models", headers=twice),
        httpx.get(f"{base}/metrics", headers=twice),
        httpx.get(f"{base}/admin/fleet", headers=twice),
        httpx.post(f"{base}/v1/chat/completions", json=body, headers=[("x-api-key", "k1"), ("x-api-key", "k2")]),
    ]
    assert [r.status_code for r in answers] == [400] * len(answers)
    assert answers[0].json()["error"]["code"] == "duplicate_header"
    assert answers[1].json()["type"] == "error"  # Anthropic's error shape on its own door
    assert a.calls == 0
    once = httpx.post(f"{base}/v1/chat/completions", json=body, headers={"authorization": "Bearer one"})
    assert once.status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_an_engines_internal_error_reaches_the_log_not_the_client(
    fleet: Fleet, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    base, a, b = fleet
    a.fail_with = b.fail_with = from_response("gpu-node-a", 500, INTERNAL, {})
    if stream:  # after the first token: the error event of a stream, from the engine's own event
        a.fail_after = 1
        a.fail_with = from_event("gpu-node-a", {"error": {"message": INTERNAL.decode(), "code": 500}})
    caplog.set_level(logging.WARNING, logger="enginegate")
    with pytest.raises(openai.APIError) as info:
        answer = client(base).chat.completions.create(model="m", messages=HELLO, stream=stream)
        for _ in answer:
            pass
    message = said(info.value)
    for secret in ("marker-7f3a", "CUDA", "gpu-7", "/opt/vllm", "Traceback", "gpu-node-a", "gpu-node-b", "500"):
        assert secret not in message, message
    assert message == "The engine serving the model failed while answering."
    logged = [r for r in caplog.records if "marker-7f3a" in str(getattr(r, "error", ""))]
    assert logged and all(r.levelno == logging.WARNING for r in logged)
    ids = {getattr(r, "request_id", None) for r in logged}
    if not stream:  # the id the client got is the one in the log
        assert isinstance(info.value, openai.APIStatusError)
        assert ids == {info.value.response.headers["x-request-id"]}
    else:
        assert len(ids) == 1 and None not in ids


def test_an_engines_refusal_keeps_its_words_without_the_backend_name_or_raw_bytes(fleet: Fleet) -> None:
    base, a, _ = fleet
    a.fail_with = from_response("gpu-node-a", 400, b'{"message":"top_p must be in (0, 1], got 7.","code":400}', {})
    with pytest.raises(openai.BadRequestError) as info:
        client(base).chat.completions.create(model="m", messages=HELLO)
    assert said(info.value) == "top_p must be in (0, 1], got 7."
    a.fail_with = from_response("gpu-node-a", 400, b"<html><body><h1>400 Bad Request</h1>nginx</body></html>", {})
    with pytest.raises(openai.BadRequestError) as info:
        client(base).chat.completions.create(model="m", messages=HELLO)
    assert said(info.value) == "The engine refused the request as invalid."


def test_huge_input_is_echoed_cut_short(fleet: Fleet) -> None:
    base, _, _ = fleet
    name = "m" * 100_000
    for extra in ({name: 1}, {"temperature": name}, {"messages": [{"role": name, "content": "hi"}]}):
        with pytest.raises(openai.BadRequestError) as bad:
            client(base).chat.completions.create(model="m", messages=HELLO, extra_body=extra)
        assert len(bad.value.response.content) < 600, extra.keys()
    with pytest.raises(openai.NotFoundError) as info:
        client(base).chat.completions.create(model=name, messages=HELLO)
    assert info.value.code == "model_not_found"
    assert "`" + "m" * 64 + "…`" in said(info.value) and len(info.value.response.content) < 400
    with pytest.raises(openai.NotFoundError) as info:
        client(base).embeddings.create(model=name, input="hi")
    assert len(info.value.response.content) < 400


def test_every_request_gets_its_own_id_and_the_clients_is_kept_beside_it(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    base, _, _ = fleet
    caplog.set_level(logging.INFO, logger="enginegate.request")
    chat = client(base).chat.completions
    raws = [chat.with_raw_response.create(model="m", messages=HELLO, extra_headers={"x-request-id": "same-1"})]
    raws.append(chat.with_raw_response.create(model="m", messages=HELLO, extra_headers={"x-request-id": "same-1"}))
    ids = [r.headers["x-request-id"] for r in raws]
    assert len(set(ids)) == 2 and "same-1" not in ids
    assert [r.headers["x-client-request-id"] for r in raws] == ["same-1", "same-1"]
    assert len({r.parse().id for r in raws}) == 2  # the completions' ids too
    logged = {(getattr(r, "request_id", None), getattr(r, "client_request_id", None)) for r in caplog.records}
    assert {(i, "same-1") for i in ids} <= logged
    models = httpx.get(f"{base}/v1/models", headers={"x-request-id": "same-1"})
    assert models.headers["x-client-request-id"] == "same-1" and models.headers["x-request-id"] not in ids
    for odd in ("x" * 129, "two words", "a\tb"):  # too long, or outside the charset: not kept at all
        answer = httpx.get(f"{base}/v1/models", headers={"x-request-id": odd})
        assert "x-client-request-id" not in answer.headers and len(answer.headers["x-request-id"]) == 32


def test_readyz_is_not_ready_while_no_backend_can_take_a_request(fleet: Fleet) -> None:
    base, a, b = fleet
    assert httpx.get(f"{base}/readyz").status_code == 200
    a.fail_with = b.fail_with = BackendError(ErrorKind.CONNECT, "connection refused")
    with pytest.raises(openai.APIError):
        client(base).chat.completions.create(model="m", messages=HELLO)
    # Both breakers opened (threshold 1, for 5 s): every request would get a 503 now.
    with pytest.raises(openai.InternalServerError) as info:
        client(base).chat.completions.create(model="m", messages=HELLO)
    assert info.value.status_code == 503
    down = httpx.get(f"{base}/readyz")
    assert down.status_code == 503 and down.json()["status"] == "not_ready"
    assert down.json()["reason"] == "no backend can take a request: 2 with an open circuit breaker (of 2)"
    a.fail_with = b.fail_with = None  # the engines are back: the breakers let probes through after the cooldown
    wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 200, timeout=15)
    assert client(base).chat.completions.create(model="m", messages=HELLO).choices[0].message.content
    a.healthy = b.healthy = False
    wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 503, timeout=5)
    assert httpx.get(f"{base}/readyz").json()["reason"] == "no backend can take a request: 2 unhealthy (of 2)"
    b.healthy = True
    wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 200, timeout=5)


METERED = """
auth: {required: true}
metrics: {api_key_env: EG_TEST_METRICS_KEY}
models: [{name: m, gguf: "{GGUF}"}]
backends: [{name: b, engine: ctranslate2, model: m}]
"""


def test_metrics_need_the_key_when_keys_are_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EG_TEST_METRICS_KEY", "scrape-secret")
    app = create_app(load_config(write_config(tmp_path / "c.yaml", METERED)), factory({"b": ScriptedBackend("b", "m")}))
    with serve_in_thread(app) as base:
        bare = httpx.get(f"{base}/metrics")
        assert bare.status_code == 401 and bare.json()["error"]["code"] == "invalid_api_key"
        assert "enginegate_" not in bare.text
        assert httpx.get(f"{base}/metrics", headers={"authorization": "Bearer wrong"}).status_code == 401
        good = httpx.get(f"{base}/metrics", headers={"authorization": "Bearer scrape-secret"})
        assert good.status_code == 200 and "enginegate_" in good.text


def test_metrics_without_a_key_to_ask_for_are_refused_when_keys_are_required(tmp_path: Path) -> None:
    config = METERED.replace("metrics: {api_key_env: EG_TEST_METRICS_KEY}\n", "")
    app = create_app(load_config(write_config(tmp_path / "c.yaml", config)), factory({"b": ScriptedBackend("b", "m")}))
    with serve_in_thread(app) as base:
        refused = httpx.get(f"{base}/metrics")
        assert refused.status_code == 403 and "metrics.api_key_env" in refused.json()["error"]["message"]


def test_backend_headers_can_be_kept_from_clients(tmp_path: Path) -> None:
    a, b = ScriptedBackend("gpu-node-a", "m"), ScriptedBackend("gpu-node-b", "m")
    config = write_config(tmp_path / "c.yaml", "server: {backend_headers: false}\n" + FLEET)
    app = create_app(load_config(config), factory({"gpu-node-a": a, "gpu-node-b": b}))
    with serve_in_thread(app) as base:
        answered = client(base).chat.completions.with_raw_response.create(model="m", messages=HELLO)
        a.fail_with = b.fail_with = BackendError(ErrorKind.UPSTREAM, "engine crashed on gpu-node-a")
        failed = httpx.post(f"{base}/v1/chat/completions", json={"model": "m", "messages": HELLO})
    assert failed.status_code == 502 and "gpu-node" not in failed.text
    for headers in (answered.headers, failed.headers):
        assert "x-enginegate-backend" not in headers and not any("gpu-node" in v for v in headers.values())
