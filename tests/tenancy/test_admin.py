"""Admin hardening and the key API against a real gateway process: Bearer only, lockout after repeated
failures (even the right key is refused while locked out), keys created, changed, revoked and their
usage read through /admin, and admin on a port of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.tenancy.guard import AdminGuard
from tests.abuse.probes import Engine
from tests.conftest import GatewayProcess
from tests.polling import wait_until
from tests.tenancy.gateways import config_text

ADMIN_KEY = "admin-secret-for-tests"
HI: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, engine: Engine, cache_dir: Path) -> Iterator[GatewayProcess]:
    config = tmp_path_factory.mktemp("admin") / "gateway.yaml"
    admin = "api_key_env: EG_TEST_ADMIN, max_failures: 3, lockout_s: 30"
    config.write_text(config_text(engine, "required: true, usage_flush_s: 0.2", admin=admin))
    gw = GatewayProcess(config, cache_dir, env={"EG_TEST_ADMIN": ADMIN_KEY})
    yield gw
    gw.stop()


def admin(gw: GatewayProcess, method: str, path: str, key: str | None = ADMIN_KEY, **kw: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.request(method, f"{gw.base_url}{path}", headers=headers, timeout=10, **kw)


def test_the_key_api_creates_shows_updates_revokes_and_reports_usage(gateway: GatewayProcess) -> None:
    made = admin(gateway, "POST", "/admin/keys", json={"name": "svc", "team": "blue", "rpm": 100})
    assert made.status_code == 201
    doc = made.json()
    token, key_id = doc["key"], doc["id"]
    assert "sha256" not in doc
    listed = admin(gateway, "GET", "/admin/keys").json()["data"]
    assert any(k["id"] == key_id for k in listed) and token not in str(listed)
    c = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=token, max_retries=0)
    c.chat.completions.create(model="fast", messages=HI, max_tokens=3)
    usage = admin(gateway, "GET", f"/admin/keys/{key_id}/usage").json()
    assert usage["total"]["requests"] == 1 and usage["by_model"]["fast"]["completion_tokens"] == 3
    bad = admin(gateway, "PATCH", f"/admin/keys/{key_id}", json={"rpm": "many"})
    assert bad.status_code == 400
    assert admin(gateway, "PATCH", f"/admin/keys/{key_id}", json={"rpm": 1}).json()["rpm"] == 1
    assert admin(gateway, "DELETE", f"/admin/keys/{key_id}").json()["revoked_at"] is not None
    with pytest.raises(openai.AuthenticationError):  # this replica forgets the key at once
        c.chat.completions.create(model="fast", messages=HI, max_tokens=3)
    assert admin(gateway, "GET", "/admin/keys/00000000").status_code == 404


def test_the_admin_key_counts_only_as_a_bearer_token(gateway: GatewayProcess) -> None:
    raw = httpx.get(f"{gateway.base_url}/admin/fleet", headers={"authorization": ADMIN_KEY})
    assert raw.status_code == 401
    assert admin(gateway, "GET", "/admin/fleet").status_code == 200


def test_repeated_failures_lock_the_address_out_even_for_the_right_key(gateway: GatewayProcess) -> None:
    statuses = [admin(gateway, "GET", "/admin/fleet", key=f"guess-{i}").status_code for i in range(3)]
    assert statuses == [401, 401, 429]
    locked = admin(gateway, "GET", "/admin/fleet")
    assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 30


def test_the_guard_doubles_the_lockout_while_locked_and_forgets_after_success() -> None:
    guard = AdminGuard(max_failures=2, lockout_s=10)

    def status(key: str, now: float) -> int:
        try:
            guard.check("right", f"Bearer {key}", "10.0.0.1", now)
        except Exception as exc:
            return int(getattr(exc, "status", 0))
        return 200

    assert [status("wrong", 0), status("wrong", 1)] == [401, 429]
    assert status("right", 5) == 429  # locked until 11; now doubled to 20 from 5: until 25
    assert status("right", 24) == 429
    assert status("right", 24 + 40 + 1) == 200  # that try doubled it to 40: until 64
    assert status("wrong", 70) == 401  # a success starts the count again


def test_admin_on_its_own_port_is_not_served_on_the_api_port(tmp_path: Path, engine: Engine, cache_dir: Path) -> None:
    from tests.conftest import free_port

    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(config_text(engine, "required: false", admin=f"api_key_env: EG_TEST_ADMIN, port: {port}"))
    gw = GatewayProcess(config, cache_dir, env={"EG_TEST_ADMIN": ADMIN_KEY})
    try:
        assert admin(gw, "GET", "/admin/fleet").status_code == 404
        on_admin = f"http://127.0.0.1:{port}/admin/fleet"
        ok = wait_until(lambda: httpx.get(on_admin, headers={"authorization": f"Bearer {ADMIN_KEY}"}), timeout=10)
        assert ok.status_code == 200
        # The API port still serves the API, keys or not.
        c = openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key="unused", max_retries=0)
        assert c.chat.completions.create(model="fast", messages=HI, max_tokens=2).choices
    finally:
        gw.stop()
