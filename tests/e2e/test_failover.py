"""Dispatch through a real server: failover before the first token, error events after it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Load, Usage
from gateway.app import create_app
from gateway.config import load_config
from tests.conftest import write_config
from tests.fakes import CONNECT_ERROR, UPSTREAM_ERROR, ScriptedBackend, factory, serve_in_thread
from tests.polling import wait_until

Fleet = tuple[str, ScriptedBackend, ScriptedBackend]
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]


@pytest.fixture()
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Two backends for model m, tried in order a then b; tests script their failures first."""
    a, b = ScriptedBackend("a", "m", words=["from", " a"]), ScriptedBackend("b", "m", words=["from", " b"])
    config = write_config(
        tmp_path / "c.yaml",
        """
routing: {first_token_timeout_s: 0.5}
limits: {health_interval_s: 0.2}
models: [{name: m, gguf: "{GGUF}"}]
backends:
  - {name: a, engine: ctranslate2, model: m}
  - {name: b, engine: ctranslate2, model: m}
""",
    )
    app = create_app(load_config(config), factory({"a": a, "b": b}))
    with serve_in_thread(app) as base:
        yield base, a, b


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=10)


@pytest.mark.parametrize("stream", [False, True])
def test_failure_before_first_token_moves_to_next_backend(fleet: Fleet, stream: bool) -> None:
    base, a, b = fleet
    a.fail_with, a.fail_after = CONNECT_ERROR, 0
    raw = client(base).chat.completions.with_raw_response.create(model="m", messages=HELLO, stream=stream)
    assert raw.headers["x-enginegate-backend"] == "b"
    parsed = raw.parse()
    if isinstance(parsed, openai.Stream):
        text = "".join(c.choices[0].delta.content or "" for c in parsed)
    else:
        text = parsed.choices[0].message.content or ""
    assert text == "from b"
    assert (a.calls, b.calls) == (1, 1)
    assert a.closed_streams == 1


def test_slow_first_token_times_out_to_next_backend(fleet: Fleet) -> None:
    base, a, _ = fleet
    a.first_delay = 5.0
    resp = client(base).chat.completions.create(model="m", messages=HELLO)
    assert resp.choices[0].message.content == "from b"
    assert a.closed_streams == 1


def test_non_retryable_error_is_not_retried(fleet: Fleet) -> None:
    base, a, b = fleet
    a.fail_with = BackendError(ErrorKind.BAD_REQUEST, "top_p must be < 1", param="top_p")
    with pytest.raises(openai.BadRequestError) as info:
        client(base).chat.completions.create(model="m", messages=HELLO)
    assert info.value.param == "top_p"
    assert b.calls == 0


def test_failure_after_first_token_ends_stream_with_error_event_and_done(fleet: Fleet) -> None:
    base, a, b = fleet
    a.fail_with, a.fail_after = UPSTREAM_ERROR, 1
    stream = client(base).chat.completions.create(model="m", messages=HELLO, stream=True)
    seen = []
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            seen.append(chunk.choices[0].delta.content or "")
    assert "".join(seen) == "from"
    # The gateway's words: what the engine said ("engine crashed") is for the logs.
    assert info.value.message == "The engine serving the model failed while answering."
    assert b.calls == 0, "after the commit point nothing is retried"
    raw = httpx.post(f"{base}/v1/chat/completions", json={"model": "m", "messages": HELLO, "stream": True})
    events = [line for line in raw.text.split("\n\n") if line]
    assert events[-2].startswith('data: {"error":')
    assert events[-1] == "data: [DONE]"
    assert a.closed_streams == 2


def test_failure_mid_answer_non_streaming_is_answered_by_the_next_backend(fleet: Fleet) -> None:
    """Nothing was sent to the client yet: the commit point of a whole answer is its end (issue 11.6)."""
    base, a, b = fleet
    a.fail_with, a.fail_after = UPSTREAM_ERROR, 1
    raw = client(base).chat.completions.with_raw_response.create(model="m", messages=HELLO)
    assert raw.headers["x-enginegate-backend"] == "b"
    assert raw.parse().choices[0].message.content == "from b"
    assert (a.calls, b.calls) == (1, 1) and a.closed_streams == 1


def test_all_overloaded_is_rate_limited_with_retry_after(fleet: Fleet) -> None:
    base, a, b = fleet
    a.fail_with = b.fail_with = BackendError(ErrorKind.OVERLOADED, "queue full", retry_after=2.5)
    with pytest.raises(openai.RateLimitError) as info:
        client(base).chat.completions.create(model="m", messages=HELLO)
    assert info.value.response.headers["retry-after"] == "3"
    assert (a.calls, b.calls) == (1, 1)


def test_unhealthy_backends_are_skipped_and_none_healthy_is_503(fleet: Fleet) -> None:
    base, a, b = fleet
    a.healthy = False
    wait_until(lambda: httpx.get(f"{base}/readyz").json()["backends"]["a"] is False, timeout=5)
    resp = client(base).chat.completions.create(model="m", messages=HELLO)
    assert resp.choices[0].message.content == "from b" and a.calls == 0
    b.healthy = False
    wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 503, timeout=5)
    with pytest.raises(openai.InternalServerError) as info:
        client(base).chat.completions.create(model="m", messages=HELLO)
    assert info.value.status_code == 503
    assert info.value.code == "no_backend_available"
    assert httpx.get(f"{base}/readyz").status_code == 503


def test_hedging_starts_the_next_backend_when_the_first_token_is_late(tmp_path: Path) -> None:
    a, b = ScriptedBackend("a", "m", words=["from", " a"]), ScriptedBackend("b", "m", words=["from", " b"])
    a.first_delay = 3.0
    config = write_config(
        tmp_path / "hedge.yaml",
        """
routing: {first_token_timeout_s: 10, hedging: true}
models: [{name: m, gguf: "{GGUF}", params_b: 0.001}]
backends:
  - {name: a, engine: ctranslate2, model: m}
  - {name: b, engine: ctranslate2, model: m, cost_per_hour: 1}
""",
    )
    import time

    with serve_in_thread(create_app(load_config(config), factory({"a": a, "b": b}))) as base:
        started = time.monotonic()
        raw = client(base).chat.completions.with_raw_response.create(
            model="m", messages=HELLO, extra_headers={"x-ttft-budget-ms": "200"}
        )
        took = time.monotonic() - started
        assert raw.headers["x-enginegate-backend"] == "b"
        assert raw.parse().choices[0].message.content == "from b"
        assert took < 2.0, "the hedge answered; nobody waited for the slow first token"
        assert (a.calls, b.calls) == (1, 1)
        assert a.closed_streams == 1, "the losing attempt was cancelled"
        # Without a first-token budget there is nothing to be late against: no hedge.
        b.calls = 0
        a.first_delay = 0.3
        raw = client(base).chat.completions.with_raw_response.create(model="m", messages=HELLO)
        assert raw.headers["x-enginegate-backend"] == "a" and b.calls == 0


def test_client_leaving_before_the_first_token_cancels_quietly(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    base, a, _ = fleet
    a.first_delay = 0.45  # under the 0.5 s first-token timeout: a stays the one being waited for
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base}/v1/chat/completions", json={"model": "m", "messages": HELLO}, timeout=0.15)
    wait_until(lambda: a.closed_streams == 1, timeout=5, message="the backend's stream was closed")
    assert a.calls == 1 and a.finished == 0, "the generation was stopped, not run to its end"
    assert not [r for r in caplog.records if r.levelname == "ERROR"], [r.getMessage() for r in caplog.records]
    ok = httpx.post(f"{base}/v1/chat/completions", json={"model": "m", "messages": HELLO}, timeout=10)
    assert ok.status_code == 200


def test_every_response_is_counted_with_its_status_class_and_errors_carry_the_gateway_headers(fleet: Fleet) -> None:
    """An error-ratio alert sees 4xx storms and routing 503s (issue 11.11: they never reached the counter)."""
    base, a, b = fleet
    post = f"{base}/v1/chat/completions"
    assert httpx.post(post, json={"model": "nope", "messages": HELLO}).status_code == 404
    bad = httpx.post(post, content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "x-enginegate-overhead-ms" in bad.headers
    a.fail_with = b.fail_with = UPSTREAM_ERROR
    failed = httpx.post(post, json={"model": "m", "messages": HELLO})
    assert failed.status_code == 502
    assert failed.headers["x-enginegate-backend"] == "b" and "x-enginegate-overhead-ms" in failed.headers
    assert httpx.get(f"{base}/v1/nowhere").status_code == 404
    text = httpx.get(f"{base}/metrics").text
    for labels in (
        'backend="none",code="4xx",model="other",outcome="error",route="chat"',
        'backend="b",code="5xx",model="m",outcome="error",route="chat"',
        'backend="none",code="4xx",model="none",outcome="error",route="other"',
    ):
        assert f"enginegate_requests_total{{{labels}}}" in text, text


class Queued(ScriptedBackend):
    """An engine that runs 4 requests and reports 496 more waiting."""

    async def load(self) -> Load | None:
        return Load(running=4, waiting=496)


def test_an_engine_with_a_long_queue_sheds_new_requests_at_once_with_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 12.4: a fast 503 with Retry-After from the predicted wait, never a 504 a minute later."""
    busy = Queued("busy", "m")
    monkeypatch.setenv("EG_TEST_ADMIN", "admin-secret")
    config = write_config(
        tmp_path / "queue.yaml",
        """
routing: {max_queue_wait_s: 0.001}
limits: {health_interval_s: 0.2}
admin: {api_key_env: EG_TEST_ADMIN}
models: [{name: m, gguf: "{GGUF}"}]
backends: [{name: busy, engine: ctranslate2, model: m, max_concurrency: 4}]
""",
    )
    with serve_in_thread(create_app(load_config(config), factory({"busy": busy}))) as base:
        with pytest.raises(openai.InternalServerError) as info:
            client(base).chat.completions.create(model="m", messages=HELLO)
        assert info.value.status_code == 503 and info.value.code == "overloaded"
        assert int(info.value.response.headers["retry-after"]) >= 1
        assert busy.calls == 0
        explain = httpx.post(
            f"{base}/admin/route/explain",
            json={"model": "m", "prompt_tokens": 10},
            headers={"authorization": "Bearer admin-secret"},
        )
        assert "queue full" in explain.text, explain.text


class Slow(ScriptedBackend):
    """First word at once, then one word every 0.1 s."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.calls += 1
        for i, word in enumerate(self.words):
            if i:
                await asyncio.sleep(0.1)
            yield Chunk(text=word)
        yield Chunk(finish_reason="stop", usage=Usage(3, len(self.words)))


def test_a_whole_answer_reports_its_time_to_first_token_not_its_end(tmp_path: Path) -> None:
    """Non-streaming answers commit at their end; their TTFT (learned by routing, shown in the histogram)
    is still when the first token came (else a long answer would teach routing its backend is slow)."""
    slow = Slow("slow", "m", words=["a", " b", " c", " d", " e", " f"])
    config = write_config(
        tmp_path / "ttft.yaml",
        """
models: [{name: m, gguf: "{GGUF}"}]
backends: [{name: slow, engine: ctranslate2, model: m}]
""",
    )
    with serve_in_thread(create_app(load_config(config), factory({"slow": slow}))) as base:
        answer = client(base).chat.completions.create(model="m", messages=HELLO)
        assert answer.choices[0].message.content == "a b c d e f"
        text = httpx.get(f"{base}/metrics").text
    ttft = metric_sum(text, "enginegate_time_to_first_token_seconds_sum")
    e2e = metric_sum(text, "enginegate_request_duration_seconds_sum")
    assert e2e >= 0.5 and ttft < 0.25, (ttft, e2e)


def metric_sum(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
