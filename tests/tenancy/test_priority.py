"""A key's priority class caps its requests' priority (which admission control and routing read), and
rules match keys and teams."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends.base import Usage
from gateway.tenancy.gate import Tenancy, reserved_prompt
from gateway.tenancy.keys import KeyRecord
from gateway.tenancy.settings import AuthConfig, RedisConfig
from routing.policy import matches, priority_factor
from routing.rules import Rule
from routing.types import RequestFeatures


class _Exchange:
    request_id = "r1"

    def __init__(self) -> None:
        self.headers: list[tuple[str, str]] = []

    def header(self, name: str, value: str) -> None:
        self.headers.append((name, value))


class _Life:
    def __init__(self) -> None:
        self.ex = _Exchange()
        self.key_id: str | None = None
        self.on_end: Any = None


def admitted(priority_class: str, asked: int | None) -> tuple[RequestFeatures, _Life]:
    async def go() -> tuple[RequestFeatures, _Life]:
        tenancy = Tenancy(AuthConfig(required=True), RedisConfig(), Path("."), {}, 60.0, CollectorRegistry())
        record = KeyRecord(id="0000abcd", sha256="0" * 64, team="red", priority=priority_class)
        life = _Life()
        feats = RequestFeatures(model="m", prompt_tokens=10, max_tokens=5, priority=asked or 0)
        out = await tenancy.admit(record, feats, life, asked is not None, 100, 1000)
        life.on_end(Usage(8, 5), True)
        return out, life

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("klass", "asked", "expected"),
    [("low", None, -100), ("low", 500, -100), ("high", -500, -500), ("high", None, 100), ("default", 7, 0)],
)
def test_the_key_class_caps_the_priority_a_request_asks_for(klass: str, asked: int | None, expected: int) -> None:
    feats, life = admitted(klass, asked)
    assert feats.priority == expected
    assert (feats.key, feats.team, life.key_id) == ("0000abcd", "red", "0000abcd")


def test_lower_classes_may_queue_less_so_they_are_shed_first() -> None:
    low, _ = admitted("low", None)
    high, _ = admitted("high", None)
    assert priority_factor(low.priority) < priority_factor(0) < priority_factor(high.priority)


def test_rules_match_keys_and_teams() -> None:
    f = RequestFeatures(model="m", prompt_tokens=1, max_tokens=None, key="0000abcd", team="red")
    anonymous = RequestFeatures(model="m", prompt_tokens=1, max_tokens=None)
    assert matches(Rule("t", teams=("red",)), f) and not matches(Rule("t", teams=("blue",)), f)
    assert matches(Rule("k", keys=("0000abcd",)), f) and not matches(Rule("k", keys=("ffff0000",)), f)
    assert not matches(Rule("t", teams=("red",)), anonymous)
    assert matches(Rule("any"), anonymous)


def test_estimated_prompts_are_reserved_with_room_for_the_template() -> None:
    assert reserved_prompt(1, 1) == 10
    assert reserved_prompt(100, 3) == 224


def test_route_explain_shows_a_team_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    config = tmp_path / "fleet.yaml"
    config.write_text(
        "models: [{name: m, params_b: 8}]\n"
        "backends: [{name: a, engine: vllm, url: 'http://a:1', model: m, gpu: H100},"
        " {name: b, engine: vllm, url: 'http://b:1', model: m, gpu: H100}]\n"
        "routing: {rules: [{name: red-on-b, match: {teams: [red]}, require: [b]}]}\n"
    )
    assert main(["route", "explain", "--config", str(config), "--model", "m", "--team", "red"]) == 0
    red = capsys.readouterr().out
    assert main(["route", "explain", "--config", str(config), "--model", "m", "--team", "blue"]) == 0
    blue = capsys.readouterr().out
    assert "rule red-on-b" in red and "rule red-on-b" not in blue
