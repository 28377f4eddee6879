"""A web page cannot use a gateway on localhost: unknown Host names (DNS rebinding) and non-JSON
POST bodies (cross-site forms) are refused, and CORS is off unless origins are configured."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.app import create_app
from gateway.config import load_config
from gateway.http.limits import allowed_hosts, host_name
from tests.abuse.probes import Engine, config_text
from tests.conftest import GatewayProcess

pytestmark = pytest.mark.abuse

CHAT = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def test_rebound_host_names_are_refused(guarded: GatewayProcess) -> None:
    url = f"{guarded.base_url}/v1/models"
    resp = httpx.get(url, headers={"host": f"attacker.example:{guarded.port}"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_host"
    for host in (f"localhost:{guarded.port}", "127.0.0.1", f"[::1]:{guarded.port}", "LOCALHOST"):
        assert httpx.get(url, headers={"host": host}).status_code == 200, host


def test_post_bodies_must_be_json(guarded: GatewayProcess) -> None:
    url = f"{guarded.base_url}/v1/chat/completions"
    body = orjson.dumps(CHAT)
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        resp = httpx.post(url, content=body, headers={"content-type": ctype})
        assert resp.status_code == 415 and resp.json()["error"]["code"] == "unsupported_media", ctype
    assert httpx.post(url, content=body, headers={"content-type": "Application/JSON; charset=utf-8"}).status_code == 200
    resp = httpx.post(url, content=body)  # no content type at all
    assert resp.status_code == 415


def test_no_cors_by_default(guarded: GatewayProcess) -> None:
    preflight = {"origin": "https://page.example", "access-control-request-method": "POST"}
    resp = httpx.options(f"{guarded.base_url}/v1/chat/completions", headers=preflight)
    assert resp.status_code == 405 and "access-control-allow-origin" not in resp.headers
    resp = httpx.get(f"{guarded.base_url}/v1/models", headers={"origin": "https://page.example"})
    assert "access-control-allow-origin" not in resp.headers


def test_cors_for_configured_origins(tmp_path: Path, engine: Engine) -> None:
    config = tmp_path / "cors.yaml"
    config.write_text(config_text(engine, 'cors_origins: ["https://app.example"]'))
    app = create_app(load_config(config))

    async def probe() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            ok = {"origin": "https://app.example", "access-control-request-method": "POST"}
            preflight = await client.options("/v1/chat/completions", headers=ok)
            allowed = await client.get("/healthz", headers={"origin": "https://app.example"})
            other = await client.get("/healthz", headers={"origin": "https://other.example"})
            return preflight, allowed, other

    preflight, allowed, other = asyncio.run(probe())
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert "content-type" in preflight.headers["access-control-allow-headers"]
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    assert "x-request-id" in allowed.headers["access-control-expose-headers"]
    assert "access-control-allow-origin" not in other.headers


def test_host_allow_list_defaults() -> None:
    assert allowed_hosts(None, "0.0.0.0") == (None, ())  # reached by whatever name: operators list them
    assert allowed_hosts(None, "127.0.0.1")[0] == frozenset({b"localhost", b"127.0.0.1", b"[::1]"})
    assert allowed_hosts(["*"], "127.0.0.1") == (None, ())
    assert allowed_hosts(["gw.internal", "*.example.com", "::1"], "0.0.0.0") == (
        frozenset({b"gw.internal", b"[::1]"}),
        (b".example.com",),
    )
    assert [host_name(h) for h in (b"LocalHost:8000", b"[::1]:80", b"example.com")] == [
        b"localhost",
        b"[::1]",
        b"example.com",
    ]
