"""Shadow traffic against contract fakes: a vLLM primary, a TensorRT-LLM candidate (trtllm-serve), each
over its own TinyEngine, so each side's requests, tokens and finish reasons are the engines' own word.

The client is answered by the primary only; the candidate receives the mirrored share; a key's limits
never see the shadows; shutdown cancels a shadow in flight (the candidate sees the connection close);
the candidate's failure never reaches the client; the report agrees with what the engines counted.
"""

from __future__ import annotations

import io
import random
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import Gateway, create_app
from gateway.cli import main as cli_main
from gateway.config import load_config
from gateway.telemetry.shadow_report import read, summarize
from tests.conftest import write_config
from tests.contract import fake_trtllm_serve, fake_vllm
from tests.contract.control import FakeControl
from tests.contract.fake_vllm import FakeVLLM
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread
from tests.polling import wait_until

MODEL = "enginegate-demo"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]


@dataclass
class Engines:
    vllm_url: str
    vllm: FakeVLLM
    vllm_engine: TinyEngine
    trt_url: str
    trt: FakeControl
    trt_engine: TinyEngine
    trt_received: list[dict[str, Any]]


@pytest.fixture(scope="module")
def engines(cache_dir: Path) -> Iterator[Engines]:
    with ExitStack() as stack:
        vllm_engine, trt_engine = TinyEngine(cache_dir), TinyEngine(cache_dir)
        vllm_app = fake_vllm.create_app(vllm_engine)
        control, received = FakeControl(), []  # type: ignore[var-annotated]
        trt_app = fake_trtllm_serve.create_app(trt_engine, control, received=received)
        vllm_url = stack.enter_context(serve_in_thread(vllm_app, "/health"))
        trt_url = stack.enter_context(serve_in_thread(trt_app, "/health"))
        yield Engines(vllm_url, vllm_app.state.fake, vllm_engine, trt_url, control, trt_engine, received)


@pytest.fixture
def fresh(engines: Engines) -> Engines:
    engines.vllm.received.clear()
    engines.trt_received.clear()
    engines.trt.reset()
    engines.trt.seen.clear()
    # The engine's own pace (each token's), which a whole answer takes as a stream does: the control's
    # pace spaces a response's pieces, and a whole answer is one piece.
    engines.trt_engine.token_delay_s = 0.0
    return engines


def _config(tmp: Path, e: Engines, shadow: str, extra: str = "", trt_url: str | None = None, rule: str = "") -> Path:
    return write_config(
        tmp / "shadow.yaml",
        f"""
limits: {{health_interval_s: 0.5}}
{extra}
models:
  - {{name: {MODEL}, params_b: 8, dtype: bf16, context: 8192}}
backends:
  - {{name: vllm, engine: vllm, url: "{e.vllm_url}", model: {MODEL}, gpu: H100, cost_per_hour: 4}}
  - {{name: trt-candidate, engine: trtllm_serve, url: "{trt_url or e.trt_url}", model: {MODEL}, gpu: H100,
      cost_per_hour: 4, pool: trt}}
routing:
  rules:
    - {{name: mirror, match: {{models: [{MODEL}]}}, require: [vllm], shadow: {shadow}{rule}}}
""",
    )


@contextmanager
def gateway(config: Path) -> Iterator[tuple[str, Gateway]]:
    app = create_app(load_config(config))
    assert isinstance(app, Gateway)
    with serve_in_thread(app) as url:
        yield url, app


def _client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)


def _sample(app: Gateway, name: str, **labels: str) -> float:
    return app.state.metrics.registry.get_sample_value(name, labels) or 0.0


def test_the_client_is_answered_by_the_primary_and_the_candidate_gets_every_mirrored_request(
    fresh: Engines, tmp_path: Path
) -> None:
    with gateway(_config(tmp_path, fresh, "{to: trt-candidate, share: 1.0}")) as (url, app):
        client = _client(url)
        for i in range(6):
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=HELLO, max_tokens=8, temperature=0, stream=i % 2 == 1
            )
            assert raw.headers["x-enginegate-backend"] == "vllm"
            if i % 2 == 0:
                assert raw.parse().choices[0].message.content  # type: ignore[union-attr]
            else:
                assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)  # type: ignore[union-attr]
        wait_until(lambda: len(app.state.shadows.ring) == 6, message="every pair recorded")
        assert len(fresh.vllm.received) == 6  # the primary: once per client request, never the shadows
        assert len(fresh.trt_received) == 6  # the candidate: every request, mirrored
        assert all(s.request_id.endswith("-shadow") for s in fresh.trt.seen)
        assert _sample(app, "enginegate_shadow_requests_total", rule="mirror", candidate="trt-candidate") == 6
        # Shadows are not client requests: the request counter counts six, all answered by vllm (written
        # to the registry within a tenth of a second: gateway/telemetry/pending.py).
        served = {"route": "chat", "model": MODEL, "backend": "vllm", "outcome": "ok", "code": "2xx"}
        wait_until(lambda: _sample(app, "enginegate_requests_total", **served) == 6, message="six requests counted")
        assert not _sample(app, "enginegate_requests_total", route="chat", model=MODEL, backend="trt-candidate",
                           outcome="ok", code="2xx")  # fmt: skip
        pairs = list(app.state.shadows.ring)
        assert all(p["agreement"] == {"method": "exact", "score": 1.0, "agree": True} for p in pairs)
        assert "texts" not in pairs[0] and "Hello" not in orjson.dumps(pairs).decode()  # no user text kept


def test_half_of_the_requests_are_mirrored_with_share_one_half(fresh: Engines, tmp_path: Path) -> None:
    random.seed(26)  # the draw is the process's random: pinned, the count is one number, not a flake
    n = 120
    with gateway(_config(tmp_path, fresh, "{to: trt, share: 0.5}")) as (url, app):
        client = _client(url)
        for _ in range(n):
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=1, temperature=0)
        wait_until(lambda: not app.state.shadows.tasks, message="every shadow done")
        sent = _sample(app, "enginegate_shadow_requests_total", rule="mirror", candidate="trt")
        assert len(fresh.trt_received) == sent and len(app.state.shadows.ring) == sent
    assert len(fresh.vllm.received) == n
    assert 0.35 * n <= sent <= 0.65 * n, sent


def test_shadows_never_count_against_the_keys_limits(fresh: Engines, tmp_path: Path) -> None:
    from gateway.tenancy.keys import digest, new_token

    key_id, token = new_token()
    auth = f'auth: {{required: true, keys: [{{id: "{key_id}", sha256: "{digest(token)}", rpm: 3}}]}}'
    with gateway(_config(tmp_path, fresh, "{to: trt-candidate, share: 1.0}", auth)) as (url, _app):
        client = _client(url, token)
        remaining = []
        for _ in range(3):  # with the shadows counted, the second request would be over the limit
            raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=HELLO, max_tokens=2)
            remaining.append(raw.headers["x-ratelimit-remaining-requests"])
        wait_until(lambda: len(fresh.trt_received) == 3, message="the three requests were mirrored")
        assert remaining == ["2", "1", "0"]
        with pytest.raises(openai.RateLimitError):  # the limit itself is live
            client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)


def test_the_candidates_failure_never_reaches_the_client(fresh: Engines, tmp_path: Path) -> None:
    with gateway(_config(tmp_path, fresh, "{to: trt-candidate, share: 1.0}")) as (url, app):
        client = _client(url)
        for fault in ("status_500", "cut", "error_event"):
            fresh.trt.fail_next = fault
            for stream in (True, False):
                raw = client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=HELLO, max_tokens=8, temperature=0, stream=stream
                )
                assert raw.status_code == 200 and raw.headers["x-enginegate-backend"] == "vllm"
                raw.parse()
                wait_until(lambda: not app.state.shadows.tasks)  # the next fault waits for this shadow
        wait_until(lambda: len(app.state.shadows.ring) == 6)
        failed = [p for p in app.state.shadows.ring if p["shadow"]["outcome"] == "error"]
        assert len(failed) == 3  # each fault struck the next mirrored request once
        assert all(p["primary"]["outcome"] == "ok" and p["agreement"] is None for p in failed)
        kinds = {p["shadow"]["error"] for p in failed}
        assert sum(_sample(app, "enginegate_shadow_failures_total", rule="mirror", candidate="trt-candidate",
                           kind=k) for k in kinds) == 3  # fmt: skip


def test_a_candidate_that_is_down_leaves_the_primary_answering(fresh: Engines, tmp_path: Path) -> None:
    config = _config(tmp_path, fresh, "{to: trt-candidate, share: 1.0}", trt_url="http://127.0.0.1:9")
    with gateway(config) as (url, app):
        answer = _client(url).chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, temperature=0)
        assert answer.choices[0].message.content
        # Unhealthy, the candidate takes nothing: the shadow is dropped and counted.
        labels = {"rule": "mirror", "candidate": "trt-candidate", "reason": "no_backend"}
        wait_until(lambda: _sample(app, "enginegate_shadow_dropped_total", **labels) == 1)


def test_shutdown_cancels_a_shadow_in_flight(fresh: Engines, tmp_path: Path) -> None:
    fresh.trt_engine.token_delay_s = 5.0  # the candidate's answer would take minutes: shutdown must not wait
    with gateway(_config(tmp_path, fresh, "{to: trt-candidate, share: 1.0}")) as (url, app):
        answer = _client(url).chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
        wait_until(lambda: fresh.trt.running == 1, message="the shadow is generating on the candidate")
        assert len(app.state.shadows.tasks) == 1
    # The server stopped: the shadow was cancelled, its connection closed and the engine stopped.
    wait_until(lambda: fresh.trt.running == 0, timeout=20, message="the candidate never saw the disconnect")
    assert not app.state.shadows.tasks
    labels = {"rule": "mirror", "candidate": "trt-candidate", "reason": "cancelled"}
    assert _sample(app, "enginegate_shadow_dropped_total", **labels) == 1
    assert not app.state.shadows.ring  # no comparison from half an answer


def test_the_end_of_a_drains_grace_cancels_shadows_in_flight(fresh: Engines, tmp_path: Path) -> None:
    fresh.trt_engine.token_delay_s = 5.0
    with gateway(_config(tmp_path, fresh, "{to: trt-candidate, share: 1.0}")) as (url, app):
        client = _client(url)
        assert client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4).choices[0].message
        wait_until(lambda: fresh.trt.running == 1, message="the shadow is generating on the candidate")
        [task] = app.state.shadows.tasks
        task.get_loop().call_soon_threadsafe(app.end_requests)  # what SIGTERM's drain does after the grace
        wait_until(lambda: fresh.trt.running == 0, timeout=20, message="the candidate never saw the disconnect")
        wait_until(lambda: not app.state.shadows.tasks)
        # The gateway still serves (the listener closes on its own schedule); a new request is answered.
        assert client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4).choices[0].message


def test_a_shadow_to_another_model_asks_that_model(fresh: Engines, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "models.yaml",
        f"""
limits: {{health_interval_s: 0.5}}
models:
  - {{name: {MODEL}, params_b: 8, dtype: bf16, context: 8192}}
  - {{name: demo-trt, params_b: 8, dtype: bf16, context: 8192}}
backends:
  - {{name: vllm, engine: vllm, url: "{fresh.vllm_url}", model: {MODEL}, gpu: H100}}
  - {{name: trt-candidate, engine: trtllm_serve, url: "{fresh.trt_url}", model: demo-trt, gpu: H100}}
routing:
  rules:
    - {{name: mirror, match: {{models: [{MODEL}]}}, shadow: {{to: demo-trt, share: 1.0}}}}
""",
    )
    with gateway(config) as (url, app):
        answer = _client(url).chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, temperature=0)
        assert answer.model == MODEL and answer.choices[0].message.content
        wait_until(lambda: len(app.state.shadows.ring) == 1)
    [body] = fresh.trt_received
    assert body["model"] == "demo-trt"
    [pair] = app.state.shadows.ring
    assert (pair["primary"]["model"], pair["shadow"]["model"], pair["shadow"]["backend"]) == (
        MODEL, "demo-trt", "trt-candidate"
    )  # fmt: skip


def test_a_full_rule_drops_its_shadows_instead_of_queueing_them(fresh: Engines, tmp_path: Path) -> None:
    fresh.trt_engine.token_delay_s = 5.0  # the first shadow holds the rule's one slot
    with gateway(_config(tmp_path, fresh, "{to: trt-candidate, share: 1.0, max_concurrency: 1}")) as (url, app):
        client = _client(url)
        for _ in range(3):
            assert client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4).choices[0].message
            wait_until(lambda: fresh.trt.running == 1, message="the first shadow is generating")
        labels = {"rule": "mirror", "candidate": "trt-candidate", "reason": "full"}
        assert _sample(app, "enginegate_shadow_dropped_total", **labels) == 2
        assert len(fresh.trt_received) == 1 and len(fresh.vllm.received) == 3


def _trt_counts(url: str) -> tuple[float, dict[str, float]]:
    text = httpx.get(f"{url}/prometheus/metrics", timeout=10).text
    tokens, reasons = 0.0, {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "trtllm_generation_tokens_total":
                tokens = s.value
            elif s.name == "trtllm_request_success_total":
                reasons[s.labels["finished_reason"]] = s.value
    return tokens, reasons


def test_the_report_agrees_with_what_the_engines_counted(
    fresh: Engines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "pairs.jsonl"
    monkeypatch.setenv("EG_SHADOW_TEST_ADMIN", "admin-secret")
    extra = f'shadow: {{log_path: "{log}"}}\nadmin: {{api_key_env: EG_SHADOW_TEST_ADMIN}}'
    trt_tokens, trt_reasons = _trt_counts(fresh.trt_url)
    vllm_tokens = fresh.vllm_engine.generated_tokens
    budget = ", default_latency_budget_ms: 60000"  # met by both; the last two ask the impossible of both
    config = _config(tmp_path, fresh, "{to: trt-candidate, share: 1.0}", extra, rule=budget)
    with gateway(config) as (url, _app):
        client = _client(url)
        finishes: dict[str, int] = {}
        for i, max_tokens in enumerate((2, 64, 3, 64, 1, 64)):  # cut by length, and ended by the model (stop)
            answer = client.chat.completions.create(
                model=MODEL, messages=HELLO, max_tokens=max_tokens, temperature=0, stream=i % 2 == 0,
                stream_options={"include_usage": True} if i % 2 == 0 else None,
                extra_headers={"x-ttft-budget-ms": "0.001"} if i >= 4 else None,
            )  # fmt: skip
            if i % 2:
                reason = answer.choices[0].finish_reason  # type: ignore[union-attr]
            else:
                reason = next(c.choices[0].finish_reason for c in answer if c.choices and c.choices[0].finish_reason)  # type: ignore[union-attr]
            finishes[reason] = finishes.get(reason, 0) + 1
        wait_until(lambda: log.exists() and len(log.read_bytes().splitlines()) == 6, message="six lines written")
        refused = httpx.get(f"{url}/admin/shadow", timeout=10)
        live = httpx.get(f"{url}/admin/shadow", headers={"authorization": "Bearer admin-secret"}, timeout=10)
    assert refused.status_code == 401  # the admin key, as every admin route
    assert live.status_code == 200 and live.json()["pairs"] == 6
    assert set(finishes) == {"length", "stop"}
    rows = summarize(read(log))
    assert len(rows) == 1
    row = rows[0]
    assert (row["rule"], row["primary_backend"], row["candidate_backend"]) == ("mirror", "vllm", "trt-candidate")
    assert row["pairs"] == 6
    now_tokens, now_reasons = _trt_counts(fresh.trt_url)
    assert row["candidate"]["completion_tokens"] == now_tokens - trt_tokens
    assert row["candidate"]["finish_reasons"] == {r: now_reasons[r] - trt_reasons.get(r, 0) for r in now_reasons
                                               if now_reasons[r] - trt_reasons.get(r, 0)}  # fmt: skip
    assert row["primary"]["completion_tokens"] == fresh.vllm_engine.generated_tokens - vllm_tokens
    assert row["primary"]["finish_reasons"] == finishes
    assert row["agreement"] == 1.0 and row["compared"] == 6
    assert row["with_budget"] == 6 and row["primary"]["budgets_met"] == row["candidate"]["budgets_met"] == 0.6667
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["shadow", "report", str(log), "--json"]) == 0
    assert orjson.loads(out.getvalue()) == orjson.loads(orjson.dumps(rows)) == live.json()["groups"]
