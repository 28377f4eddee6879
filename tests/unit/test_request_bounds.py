"""Cheap limits before expensive work: oversized bodies and numeric headers refused at once, with a 400."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.app import create_app
from gateway.config import load_config
from gateway.doors.openai_api import MAX_STOP_CHARS, ChatBody, CompletionBody, parse_body
from gateway.http.errors import ApiError
from routing.features import InvalidHeader, features
from tests.conftest import write_config
from tests.fakes import ScriptedBackend, factory, serve_in_thread

MSG = {"role": "user", "content": "hi"}


def refused(model: type[ChatBody] | type[CompletionBody], data: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_body(model, data, max_messages=1024)
    assert info.value.status == 400
    return info.value


def test_a_hundred_thousand_messages_are_refused_before_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Validating them all took ~270 ms: the bound is checked first, and validation never runs."""
    validated: list[object] = []

    def validate(cls: type[ChatBody], /, data: Any, **kw: Any) -> ChatBody:
        validated.append(data)
        raise AssertionError("validated an oversized body")

    monkeypatch.setattr(ChatBody, "model_validate", classmethod(validate))
    data = orjson.loads(orjson.dumps({"model": "m", "messages": [MSG] * 100_000}))
    err = refused(ChatBody, data)
    assert (err.param, err.code) == ("messages", "invalid_value")
    assert validated == []


@pytest.mark.parametrize(
    ("model", "data", "param"),
    [
        (ChatBody, {"model": "m", "messages": [MSG], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        (ChatBody, {"model": "m", "messages": [MSG], "stop": "x" * (MAX_STOP_CHARS + 1)}, "stop"),
        (CompletionBody, {"model": "m", "prompt": "p", "stop": ["ok", "x" * 100_000]}, "stop[1]"),
        (ChatBody, {"model": "m", "messages": [MSG], "logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        (ChatBody, {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": ""}] * 5000}]},
         "messages"),
        (CompletionBody, {"model": "m", "prompt": ["p"] * 100_000}, "prompt"),
    ],
)  # fmt: skip
def test_oversized_lists_and_stops_are_refused_naming_the_parameter(
    model: type[ChatBody] | type[CompletionBody], data: dict[str, Any], param: str
) -> None:
    assert refused(model, data).param == param


def test_bodies_within_the_bounds_pass() -> None:
    body = parse_body(
        ChatBody,
        {"model": "m", "messages": [MSG] * 1024, "stop": ["a", "x" * MAX_STOP_CHARS, "c", "d"], "logit_bias": {"1": 5}},
        max_messages=1024,
    )
    assert isinstance(body, ChatBody) and len(body.messages) == 1024


def feats(headers: dict[str, str]) -> Any:
    return features("m", ["hi"], None, False, headers)


@pytest.mark.parametrize("value", ["9" * 5000, "1001", "-1001", "high", "²", "1.5", ""])
def test_bad_priorities_are_invalid_headers(value: str) -> None:
    with pytest.raises(InvalidHeader) as info:
        feats({"x-priority": value})
    assert info.value.name == "x-priority"
    assert len(str(info.value)) < 200  # a huge value is not echoed back whole


@pytest.mark.parametrize(("value", "priority"), [("7", 7), ("-1000", -1000), (" +1000 ", 1000)])
def test_priorities_in_range_are_read(value: str, priority: int) -> None:
    assert feats({"x-priority": value}).priority == priority
    assert feats({}).priority == 0


@pytest.mark.parametrize("value", ["1" * 5000, "1e300", "nan", "inf", "0", "-5", "86400001"])
@pytest.mark.parametrize("name", ["x-latency-budget-ms", "x-ttft-budget-ms", "x-slo-ttft-ms", "x-slo-tpot-ms"])
def test_bad_budgets_are_invalid_headers(name: str, value: str) -> None:
    with pytest.raises(InvalidHeader) as info:
        feats({name: value})
    assert info.value.name == name


def test_the_server_answers_a_huge_priority_and_a_huge_body_with_openai_400s(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        """
models: [{name: m}]
backends: [{name: a, engine: vllm, model: m, url: "http://127.0.0.1:9"}]
""",
    )
    app = create_app(load_config(config), factory({"a": ScriptedBackend("a", "m")}))
    with serve_in_thread(app) as base:
        url = f"{base}/v1/chat/completions"
        r = httpx.post(url, json={"model": "m", "messages": [MSG]}, headers={"x-priority": "9" * 5000}, timeout=10)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "x-priority" and r.json()["error"]["code"] == "invalid_header"
        r = httpx.post(url, json={"model": "m", "messages": [MSG] * 100_000}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        assert httpx.post(url, json={"model": "m", "messages": [MSG]}, timeout=10).status_code == 200
