"""The admin key is a FastAPI dependency of every admin route: no admin route answers without it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from gateway.config import load_config
from tests.conftest import write_config
from tests.fakes import ScriptedBackend, factory

FLEET = """
admin: {api_key_env: EG_UNIT_ADMIN}
models:
  - {name: m}
backends:
  - {name: b, engine: vllm, url: "http://127.0.0.1:9", model: m}
"""


def test_every_admin_route_refuses_a_request_without_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EG_UNIT_ADMIN", "s3cret")
    gateway = create_app(
        load_config(write_config(tmp_path / "c.yaml", FLEET)), factory({"b": ScriptedBackend("b", "m")})
    )
    admin = sorted(
        {(method, route.path) for route in gateway.app.routes for method in getattr(route, "methods", None) or ()}  # type: ignore[attr-defined]
    )
    admin = [(m, p.replace("{key_id}", "k1")) for m, p in admin if p.startswith("/admin/") and m != "HEAD"]
    assert len(admin) >= 9

    async def go() -> dict[tuple[str, str], tuple[int, int]]:
        transport = httpx.ASGITransport(app=gateway)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            out = {}
            for method, path in admin:
                bare = await client.request(method, path, content=b"{}")
                no_bearer = await client.request(method, path, content=b"{}", headers={"authorization": "s3cret"})
                out[(method, path)] = (bare.status_code, no_bearer.status_code)
            return out

    answers = asyncio.run(go())
    # 401 until the lockout guard (the same dependency) starts answering 429 for this address.
    assert all(set(codes) <= {401, 429} for codes in answers.values()), answers
    assert (401, 401) in answers.values()
