"""The console's routes and the admin endpoint it reads the decisions from, in process: ``/console`` is
there only with an admin key (and only on the admin port), every file carries the strict headers, and
``GET /admin/decisions`` holds the last routed requests, bounded, newest first, without prompt data."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from gateway.config import load_config
from gateway.console import CSP
from gateway.telemetry.decisions import RecentDecisions
from routing.decisions import Candidate, Decision, Prediction, Reason
from routing.types import RequestFeatures
from tests.conftest import write_config
from tests.fakes import ScriptedBackend, factory, serve_in_thread

FLEET = """
admin: {{api_key_env: EG_CONSOLE_UNIT{admin}}}
limits: {{health_interval_s: 0.2}}
models:
  - {{name: m}}
backends:
  - {{name: b, engine: vllm, url: "http://127.0.0.1:9", model: m}}
"""
KEY = "console-unit-key"
FILES = {
    "/console": "text/html",
    "/console/console.js": "text/javascript",
    "/console/console.css": "text/css",
    "/console/favicon.svg": "image/svg+xml",
}


def _get(app: object, paths: list[str], port: int = 80) -> dict[str, httpx.Response]:
    async def go() -> dict[str, httpx.Response]:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url=f"http://localhost:{port}") as client:
            return {path: await client.get(path) for path in paths}

    return asyncio.run(go())


def _app(tmp_path: Path, admin: str = "") -> object:
    config = write_config(tmp_path / "c.yaml", FLEET.format(admin=admin))
    return create_app(load_config(config), factory({"b": ScriptedBackend("b", "m")}))


def test_the_console_is_served_with_strict_headers_when_an_admin_key_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EG_CONSOLE_UNIT", KEY)
    answers = _get(_app(tmp_path), [*FILES, "/console/missing.js", "/console/..%2Fapp.py"])
    for path, media in FILES.items():
        resp = answers[path]
        assert resp.status_code == 200, (path, resp.text)
        assert resp.headers["content-type"].startswith(media)
        assert resp.headers["content-security-policy"] == CSP
        assert resp.headers["x-content-type-options"] == "nosniff"
        assert resp.headers["x-frame-options"] == "DENY"
        assert resp.headers["cache-control"] == "no-store"
    for path in ("/console/missing.js", "/console/..%2Fapp.py"):  # only the listed files, never the folder
        assert answers[path].status_code == 404
    # The page loads only what the package ships: no other host, no inline script or style for the CSP to refuse.
    html = answers["/console"].text
    assert "http://" not in html and "https://" not in html and "<style" not in html and " style=" not in html
    assert "<script>" not in html and "onclick" not in html.lower()
    assert ".innerHTML" not in answers["/console/console.js"].text  # every value drawn as text


@pytest.mark.parametrize("admin", ["", "unset"])
def test_without_an_admin_key_the_console_is_an_unknown_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, admin: str
) -> None:
    # No admin section at all, or one naming a variable that holds nothing: /console is a 404 like any unknown path.
    if admin:
        monkeypatch.delenv("EG_CONSOLE_UNIT", raising=False)
        app = _app(tmp_path)
    else:
        text = FLEET.format(admin="").replace("admin: {api_key_env: EG_CONSOLE_UNIT}\n", "")
        config = write_config(tmp_path / "c.yaml", text)
        app = create_app(load_config(config), factory({"b": ScriptedBackend("b", "m")}))
    for path, resp in _get(app, list(FILES)).items():
        assert resp.status_code == 404, path
        assert resp.json()["error"]["code"] == "unknown_url"
        assert "content-security-policy" not in resp.headers


def test_with_an_admin_port_the_console_answers_only_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EG_CONSOLE_UNIT", KEY)
    app = _app(tmp_path, ", port: 9911")
    assert _get(app, ["/console"], port=80)["/console"].status_code == 404
    assert _get(app, ["/console"], port=9911)["/console"].status_code == 200


def _decision(backend: str) -> Decision:
    prediction = Prediction(ttft_ms=12.0, tpot_ms=3.0, e2e_ms=60.0, queue_ms=0.0, cached_tokens=7)
    return Decision(Reason.NO_BUDGET, (Candidate(backend, 0.9, prediction, True, {"load": 1.0}),), rule="r")


def test_the_ring_keeps_the_newest_decisions_and_no_prompt_data() -> None:
    ring = RecentDecisions(3)
    secret = RequestFeatures("m", 10, 5, headers=(("x-secret", "v"),), token_ids=(1, 2, 3), prefix_blocks=(9,))
    for i in range(5):
        ring.record(f"req-{i}", secret, _decision(f"b{i}"))
    docs = ring.documents(10)
    assert [d["request_id"] for d in docs] == ["req-4", "req-3", "req-2"]
    assert docs[0]["candidates"][0]["backend"] == "b4" and docs[0]["candidates"][0]["cached_tokens"] == 7
    assert docs[0]["rule"] == "r" and docs[0]["request"]["prompt_tokens"] == 10
    assert "x-secret" not in str(docs) and "token_ids" not in str(docs)
    assert [d["request_id"] for d in ring.documents(1)] == ["req-4"]
    smaller = ring.resized(2)
    assert smaller.size == 2 and [d["request_id"] for d in smaller.documents(5)] == ["req-4", "req-3"]


def test_admin_decisions_lists_the_routed_requests_newest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EG_CONSOLE_UNIT", KEY)
    admin = {"authorization": f"Bearer {KEY}"}
    app = _app(tmp_path, ", recent_decisions: 2")
    with serve_in_thread(app) as base:
        ids = []
        for model in ("m", "m", "m", "nope"):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            resp = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
            if model == "m":
                assert resp.status_code == 200, resp.text
                ids.append(resp.headers["x-request-id"])
        doc = httpx.get(f"{base}/admin/decisions", headers=admin, timeout=10).json()
        assert doc["kept"] == 2
        assert [d["request_id"] for d in doc["data"]] == ids[::-1][:2]  # an unknown model is never routed
        assert doc["data"][0]["candidates"][0]["backend"] == "b" and doc["data"][0]["reason"]
        one = httpx.get(f"{base}/admin/decisions?limit=1", headers=admin, timeout=10).json()
        assert [d["request_id"] for d in one["data"]] == ids[-1:]
        for bad in ("0", "x", "-1"):
            resp = httpx.get(f"{base}/admin/decisions?limit={bad}", headers=admin, timeout=10)
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "limit"
        assert httpx.get(f"{base}/admin/decisions", timeout=10).status_code == 401
        fleet = httpx.get(f"{base}/admin/fleet", headers=admin, timeout=10).json()["b"]
        assert fleet["models"] == ["m"] and fleet["in_flight"] == 0 and "detail" in fleet and "kv_cache_usage" in fleet
