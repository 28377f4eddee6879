"""The admin lockout counts the connection's peer: ``X-Forwarded-For`` names the client only when the
peer is a trusted proxy (``server.trusted_proxies``), and then only its right-most untrusted address.
A real gateway process (uvicorn, as deployed), a client on 127.0.0.1 (not trusted) and a "proxy" on
127.0.0.2 (trusted); every refusal is in the log with the address it counted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.abuse.probes import Engine, config_text
from tests.conftest import GatewayProcess
from tests.polling import wait_until

ADMIN_KEY = "admin-secret-for-lockout"
PROXY = "127.0.0.2"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, engine: Engine, cache_dir: Path) -> Iterator[GatewayProcess]:
    config = tmp_path_factory.mktemp("lockout") / "gateway.yaml"
    text = config_text(engine, f"trusted_proxies: ['{PROXY}/32']")
    config.write_text(text + "admin: {api_key_env: EG_TEST_ADMIN, max_failures: 3, lockout_s: 30}\n")
    gw = GatewayProcess(config, cache_dir, env={"EG_TEST_ADMIN": ADMIN_KEY})
    yield gw
    gw.stop()


def fleet(gw: GatewayProcess, key: str, via: str | None = None, forwarded: str | None = None) -> int:
    """GET /admin/fleet with ``key``, from ``via`` (a local source address; default 127.0.0.1)."""
    transport = httpx.HTTPTransport(local_address=via) if via else None
    headers = {"authorization": f"Bearer {key}"} | ({"x-forwarded-for": forwarded} if forwarded else {})
    with httpx.Client(transport=transport, timeout=10) as client:
        return client.get(f"{gw.base_url}/admin/fleet", headers=headers).status_code


def refusals(gw: GatewayProcess) -> list[dict[str, object]]:
    lines = (json.loads(line) for line in gw.log.read_text().splitlines() if line.startswith("{"))
    return [doc for doc in lines if doc.get("msg") == "admin authentication refused"]


def test_a_rotating_forwarded_for_from_an_untrusted_peer_is_still_locked_out(gateway: GatewayProcess) -> None:
    # 20 guesses, each naming another client: the peer (127.0.0.1) is what counts, so the 3rd locks it.
    codes = [fleet(gateway, f"guess-{i}", forwarded=f"198.51.100.{i}") for i in range(20)]
    assert codes[:2] == [401, 401] and set(codes[2:]) == {429}, codes
    assert fleet(gateway, ADMIN_KEY, forwarded="198.51.100.200") == 429  # locked out: even the right key
    wait_until(lambda: len(refusals(gateway)) >= 21)
    logged = refusals(gateway)
    assert {doc["client"] for doc in logged} == {"127.0.0.1"}
    assert [doc["code"] for doc in logged[:3]] == ["invalid_api_key", "invalid_api_key", "admin_locked_out"]


def test_a_trusted_proxys_forwarded_for_names_the_client(gateway: GatewayProcess) -> None:
    victim, other = "203.0.113.7", "203.0.113.8"
    assert [fleet(gateway, "wrong", PROXY, victim) for _ in range(3)] == [401, 401, 429]
    # The proxy's other clients are not locked out with it, nor is the proxy itself.
    assert fleet(gateway, ADMIN_KEY, PROXY, other) == 200
    assert fleet(gateway, ADMIN_KEY, PROXY) == 200
    # What a client writes left of the address the proxy appended is not believed.
    assert fleet(gateway, ADMIN_KEY, PROXY, f"{other}, {victim}") == 429
    # Three wrong keys and one try while locked out, each logged with the address the proxy named.
    wait_until(lambda: sum(doc["client"] == victim for doc in refusals(gateway)) == 4)
    assert not [doc for doc in refusals(gateway) if doc["client"] in (other, PROXY)]
