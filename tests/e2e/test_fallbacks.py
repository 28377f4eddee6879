"""Aliases and fallback chains through a real server (docs/traffic.md): a fallback is taken for each
cause, before the first token only, the answer names the model that served it (body and
``x-enginegate-model``) and ``enginegate_fallbacks_total`` counts it by cause."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from backends.base import BackendError, ErrorKind, Load
from gateway.app import create_app
from gateway.config import load_config
from gateway.tenancy.keys import digest, new_token
from tests.conftest import write_config
from tests.fakes import CONNECT_ERROR, UPSTREAM_ERROR, ScriptedBackend, factory, serve_in_thread
from tests.polling import wait_until

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]
CONFIG = """
routing:
  first_token_timeout_s: 5
  rules: [{name: strict-a, match: {models: [a]}, mode: strict}]
limits: {health_interval_s: 0.2}
models:
  - name: a
    gguf: "{GGUF}"
    context: 160
    aliases: [chat-default, gpt-4o-mini]
    fallbacks:
      - {model: long, when: [context_window]}
      - b
      - c
  - {name: b, gguf: "{GGUF}"}
  - {name: c, gguf: "{GGUF}"}
  - {name: long, gguf: "{GGUF}"}
backends:
  - {name: a1, engine: ctranslate2, model: a, capabilities: {enable: [tools]}}
  - {name: b1, engine: ctranslate2, model: b}
  - {name: c1, engine: ctranslate2, model: c, capabilities: {enable: [tools]}}
  - {name: long1, engine: ctranslate2, model: long}
"""


class Fleet:
    def __init__(self, base: str, backends: dict[str, ScriptedBackend]) -> None:
        self.base = base
        self.a, self.b, self.c, self.long = (backends[n] for n in ("a1", "b1", "c1", "long1"))

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0, timeout=20)

    def fallbacks(self, source: str, to: str, cause: str) -> float:
        """``enginegate_fallbacks_total`` for one (from, to, cause), 0 when never counted."""
        text = httpx.get(f"{self.base}/metrics").text
        series = f'enginegate_fallbacks_total{{cause="{cause}",from_model="{source}",to_model="{to}"}} '
        line = next((x for x in text.splitlines() if x.startswith(series)), None)
        return float(line.rsplit(" ", 1)[1]) if line is not None else 0.0


@pytest.fixture()
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    backends = {n: ScriptedBackend(n, n[:-1] if n != "long1" else "long", words=["from", f" {n}"])
                for n in ("a1", "b1", "c1", "long1")}  # fmt: skip
    app = create_app(load_config(write_config(tmp_path / "c.yaml", CONFIG)), factory(dict(backends)))
    with serve_in_thread(app) as base:
        yield Fleet(base, backends)


def _chat(fleet: Fleet, model: str = "chat-default", stream: bool = False, **extra: Any) -> tuple[str, str, str]:
    """(the answer's text, its body's model, its x-enginegate-model header) through the openai client."""
    messages: list[ChatCompletionMessageParam] = extra.pop("messages", HELLO)
    raw = fleet.client().chat.completions.with_raw_response.create(
        model=model, messages=messages, stream=stream, **extra
    )
    parsed = raw.parse()
    if isinstance(parsed, openai.Stream):
        chunks = list(parsed)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        model_named = chunks[0].model
    else:
        text, model_named = parsed.choices[0].message.content or "", parsed.model
    return text, model_named, raw.headers["x-enginegate-model"]


def test_an_alias_is_answered_by_its_model_which_the_answer_names(fleet: Fleet) -> None:
    assert _chat(fleet, "gpt-4o-mini") == ("from a1", "a", "a")
    assert _chat(fleet, "a", stream=True) == ("from a1", "a", "a")
    assert (fleet.b.calls, fleet.fallbacks("a", "b", "unavailable")) == (0, 0)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (CONNECT_ERROR, "unavailable"),
        (BackendError(ErrorKind.OVERLOADED, "queue full", retry_after=1.0), "overloaded"),
        (BackendError(ErrorKind.CONTENT_REFUSED, "refused by the content policy"), "content_refused"),
        (BackendError(ErrorKind.CONTEXT_LENGTH, "This model's maximum context length is 48 tokens"), "context_window"),
    ],
    ids=["unavailable", "overloaded", "content_refused", "engine_context"],
)
def test_an_engine_that_cannot_serve_before_its_first_token_hands_over_to_the_next_model(
    fleet: Fleet, error: BackendError, cause: str, stream: bool
) -> None:
    fleet.a.fail_with = error
    to = "long" if cause == "context_window" else "b"
    assert _chat(fleet, stream=stream) == (f"from {to}1", to, to)
    assert fleet.fallbacks("a", to, cause) == 1
    # A refusal naming the context is first tried once more sized to it (``Reopening``), then handed over.
    assert fleet.a.calls == (2 if cause == "context_window" else 1) and fleet.c.calls == 0


def test_no_healthy_backend_falls_back(fleet: Fleet) -> None:
    fleet.a.healthy = False
    wait_until(lambda: httpx.get(f"{fleet.base}/readyz").json()["backends"]["a1"] is False, message="a1 still up")
    assert _chat(fleet) == ("from b1", "b", "b")
    assert (fleet.a.calls, fleet.fallbacks("a", "b", "unavailable")) == (0, 1)


def test_a_budget_unmeetable_in_strict_mode_falls_back(fleet: Fleet) -> None:
    answer = _chat(fleet, extra_headers={"x-ttft-budget-ms": "0.0001"})
    assert answer == ("from b1", "b", "b")
    assert (fleet.a.calls, fleet.fallbacks("a", "b", "budget")) == (0, 1)


def test_a_prompt_past_the_model_s_context_goes_to_the_context_window_fallback(fleet: Fleet) -> None:
    long_prompt: list[ChatCompletionMessageParam] = [{"role": "user", "content": "many words here " * 80}]
    assert _chat(fleet, messages=long_prompt) == ("from long1", "long", "long")
    assert (fleet.a.calls, fleet.fallbacks("a", "long", "context_window")) == (0, 1)


def test_a_step_not_covering_the_cause_is_passed_over(fleet: Fleet) -> None:
    fleet.a.fail_with = CONNECT_ERROR  # long is for context_window only
    assert _chat(fleet)[2] == "b"
    assert fleet.long.calls == 0


def test_a_fallback_lacking_a_capability_the_request_uses_is_skipped(fleet: Fleet) -> None:
    fleet.a.fail_with = CONNECT_ERROR
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert _chat(fleet, tools=tools) == ("from c1", "c", "c")  # b's backend takes no tools
    assert (fleet.b.calls, fleet.fallbacks("a", "b", "unavailable"), fleet.fallbacks("a", "c", "unavailable")) == (
        0, 0, 1,
    )  # fmt: skip


def test_no_fallback_after_the_first_token_the_stream_ends_in_an_error_event(fleet: Fleet) -> None:
    fleet.a.fail_with, fleet.a.fail_after = UPSTREAM_ERROR, 1
    body = {"model": "chat-default", "messages": HELLO, "stream": True}
    with httpx.stream("POST", f"{fleet.base}/v1/chat/completions", json=body, timeout=20) as resp:
        text = resp.read().decode()
    assert resp.status_code == 200 and resp.headers["x-enginegate-model"] == "a"
    assert '"content":"from"' in text and '"error"' in text and text.endswith("data: [DONE]\n\n")
    assert (fleet.b.calls, fleet.c.calls, fleet.fallbacks("a", "b", "unavailable")) == (0, 0, 0)


def test_a_bad_request_is_not_another_model_s_to_answer(fleet: Fleet) -> None:
    fleet.a.fail_with = BackendError(ErrorKind.BAD_REQUEST, "top_p must be < 1", param="top_p")
    with pytest.raises(openai.BadRequestError):
        _chat(fleet)
    assert fleet.b.calls == 0


def test_when_the_whole_chain_fails_the_client_gets_the_last_error_and_each_step_is_counted(fleet: Fleet) -> None:
    for backend in (fleet.a, fleet.b, fleet.c):
        backend.fail_with = CONNECT_ERROR
    with pytest.raises(openai.APIStatusError) as info:
        _chat(fleet)
    assert info.value.status_code == 502
    assert (fleet.a.calls, fleet.b.calls, fleet.c.calls, fleet.long.calls) == (1, 1, 1, 0)
    assert fleet.fallbacks("a", "b", "unavailable") == 1 and fleet.fallbacks("b", "c", "unavailable") == 1


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/v1/completions", {"prompt": "Hello", "max_tokens": 5}, lambda doc: doc["model"]),
        ("/v1/responses", {"input": "Hello"}, lambda doc: doc["model"]),
        ("/v1/messages", {"messages": HELLO, "max_tokens": 5}, lambda doc: doc["model"]),
    ],
    ids=["completions", "responses", "messages"],
)
def test_every_front_door_falls_back_and_names_the_serving_model(
    fleet: Fleet, path: str, body: dict[str, object], named: object
) -> None:
    fleet.a.fail_with = CONNECT_ERROR
    resp = httpx.post(f"{fleet.base}{path}", json={"model": "chat-default", **body}, timeout=20)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-enginegate-model"] == "b" and named(resp.json()) == "b"  # type: ignore[operator]
    assert fleet.fallbacks("a", "b", "unavailable") == 1


def test_models_list_aliases_naming_the_model_that_answers(fleet: Fleet) -> None:
    listed = {m.id: m for m in fleet.client().models.list()}
    assert set(listed) == {"a", "b", "c", "long", "chat-default", "gpt-4o-mini"}
    assert listed["gpt-4o-mini"].model_dump().get("root") == "a" and "root" not in listed["a"].model_dump()
    assert fleet.client().models.retrieve("chat-default").model_dump()["root"] == "a"


class Queued(ScriptedBackend):
    """Reports a long queue: the gateway's admission control predicts a wait past its limit."""

    async def load(self) -> Load | None:
        return Load(running=64, waiting=5000)


def test_every_backend_shed_by_the_gateway_s_admission_falls_back(tmp_path: Path) -> None:
    config = CONFIG.replace("first_token_timeout_s: 5", "first_token_timeout_s: 5\n  max_queue_wait_s: 0.05")
    backends: dict[str, ScriptedBackend] = {n: ScriptedBackend(n, n[:-1], words=["from", f" {n}"])
                                            for n in ("b1", "c1")}  # fmt: skip
    backends["a1"] = Queued("a1", "a", words=["from", " a1"])
    backends["long1"] = ScriptedBackend("long1", "long")
    app = create_app(load_config(write_config(tmp_path / "c.yaml", config)), factory(dict(backends)))
    with serve_in_thread(app) as base:
        fleet = Fleet(base, backends)
        wait_until(lambda: _shed(base), message="a1's queue was never polled")
        assert _chat(fleet) == ("from b1", "b", "b")
        assert fleet.a.calls == 0 and fleet.fallbacks("a", "b", "overloaded") == 1


def _shed(base: str) -> bool:
    """Whether routing sheds a request for ``a`` now (its backend's reported queue has been polled)."""
    text = httpx.get(f"{base}/metrics").text
    waiting = re.search(r'^enginegate_backend_waiting\{backend="a1"\} (\S+)$', text, re.M)
    return waiting is not None and float(waiting[1]) >= 5000


def test_the_log_says_which_model_served_and_why_it_fell_back(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    fleet.a.fail_with = CONNECT_ERROR
    with caplog.at_level(logging.INFO, logger="enginegate.request"):
        _chat(fleet)
        wait_until(lambda: any(r.msg == "request" for r in caplog.records), message="no request log line")
    steps = [r for r in caplog.records if r.msg == "fallback"]
    assert [(r.from_model, r.to_model, r.cause) for r in steps] == [("a", "b", "unavailable")]  # type: ignore[attr-defined]
    line = next(r for r in caplog.records if r.msg == "request")
    assert (line.model, line.fallbacks) == ("b", 1)  # type: ignore[attr-defined]


def test_a_fallback_the_key_may_not_use_is_skipped_and_its_aliases_are_what_it_sees(tmp_path: Path) -> None:
    key_id, token = new_token()
    auth = f"auth: {{required: true, keys: [{{id: '{key_id}', sha256: '{digest(token)}', models: [a, c]}}]}}\n"
    backends = {n: ScriptedBackend(n, n[:-1] if n != "long1" else "long", words=["from", f" {n}"])
                for n in ("a1", "b1", "c1", "long1")}  # fmt: skip
    app = create_app(load_config(write_config(tmp_path / "c.yaml", auth + CONFIG)), factory(dict(backends)))
    with serve_in_thread(app) as base:
        fleet = Fleet(base, backends)
        fleet.a.fail_with = CONNECT_ERROR
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0, timeout=20)
        answer = client.chat.completions.create(model="chat-default", messages=HELLO)
        assert answer.model == "c" and fleet.b.calls == 0  # b is not the key's to use
        assert {m.id for m in client.models.list()} == {"a", "c", "chat-default", "gpt-4o-mini"}


def test_admin_explain_shows_the_chain_for_an_alias(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EG_TEST_ADMIN", "admin-secret")
    backends = {n: ScriptedBackend(n, n[:-1] if n != "long1" else "long") for n in ("a1", "b1", "c1", "long1")}
    config = write_config(tmp_path / "c.yaml", "admin: {api_key_env: EG_TEST_ADMIN}\n" + CONFIG)
    with serve_in_thread(create_app(load_config(config), factory(dict(backends)))) as base:
        doc = httpx.post(
            f"{base}/admin/route/explain",
            json={"model": "chat-default", "prompt_tokens": 1000},
            headers={"authorization": "Bearer admin-secret"},
        ).json()
    assert doc["request"]["model"] == "a" and doc["reason"] == "nothing_fits"
    assert [(s["model"], s["tried_now"]) for s in doc["fallbacks"]] == [("long", True), ("b", True), ("c", True)]
    assert doc["fallbacks"][0]["when"] == ["context_window"] and doc["fallbacks"][0]["verdict"].startswith(
        "would take it: long1 first"
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": HELLO}),
        ("/v1/completions", {"prompt": "Hello", "max_tokens": 5}),
        ("/v1/responses", {"input": "Hello"}),
        ("/v1/messages", {"messages": HELLO, "max_tokens": 5}),
    ],
    ids=["chat", "completions", "responses", "messages"],
)
def test_every_front_door_s_stream_names_the_fallback_model(fleet: Fleet, path: str, body: dict[str, object]) -> None:
    fleet.a.fail_with = CONNECT_ERROR
    doc = {"model": "chat-default", "stream": True, **body}
    with httpx.stream("POST", f"{fleet.base}{path}", json=doc, timeout=20) as resp:
        text = resp.read().decode()
    assert resp.status_code == 200 and resp.headers["x-enginegate-model"] == "b", text
    assert '"model":"b"' in text and '"model":"a"' not in text and "chat-default" not in text
    assert '" b1"' in text  # b's second word, in the door's own delta event
