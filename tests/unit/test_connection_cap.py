"""The connection cap fits the open-file limit with a descriptor for each request's engine connection:
counting only clients, 750 streams took all 1,024 descriptors and /healthz was reset (an outside audit)."""

from __future__ import annotations

import resource

import pytest

from gateway.http.limits import FD_SPARE, HEALTH_ROOM, connection_cap


def test_each_connection_is_counted_with_its_engine_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (1024, 1024))
    cap = connection_cap(1000)
    assert 2 * cap + HEALTH_ROOM + FD_SPARE <= 1024
    assert cap == (1024 - HEALTH_ROOM - FD_SPARE) // 2


def test_a_limit_that_holds_them_all_keeps_the_configured_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (1 << 20, 1 << 20))
    assert connection_cap(1000) == 1000
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (resource.RLIM_INFINITY, 0))
    assert connection_cap(1000) == 1000
