"""OpenAI's wire form over recorded engine payloads (``tests/data/openai_wire/``, sources in its README).

Each stream file holds an engine's SSE body as the engine (or its contract fake) sent it, and what
``parse_chunk`` must make of it, folded per choice: the text, the last finish reason and stop reason,
every tool-call piece, every token's logprobs, and the last usage. ``payloads.json`` holds requests
and the body ``to_payload`` must send for them, under one engine's capabilities.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backends import trtllm, vllm
from backends.base import GenerationRequest
from backends.capabilities import PLAIN, Capabilities
from backends.openai_wire import parse_chunk, to_payload

DATA = Path(__file__).resolve().parents[1] / "data" / "openai_wire"
STREAMS = sorted(p for p in DATA.glob("*.json") if p.name != "payloads.json")
PAYLOADS: list[dict[str, Any]] = json.loads((DATA / "payloads.json").read_text())
CAPABILITIES: dict[str, Capabilities] = {
    "vllm": vllm.CAPABILITIES,
    "trtllm_serve": trtllm.SERVE_CAPABILITIES,
    "plain": PLAIN,
}


def sse_events(body: str) -> list[dict[str, Any]]:
    """The JSON documents of an SSE body (``data:`` with or without a space, as TGI writes it)."""
    docs = []
    for line in body.splitlines():
        if line.startswith("data:"):
            data = line.removeprefix("data:").strip()
            if data != "[DONE]":
                docs.append(json.loads(data))
    return docs


def folded(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``parse_chunk`` reads from a whole stream, per choice (the shape the data files hold)."""
    choices: dict[str, dict[str, Any]] = {}
    usage = None
    for doc in docs:
        parsed = parse_chunk(doc)
        if parsed.usage is not None:
            usage = [parsed.usage.prompt_tokens, parsed.usage.completion_tokens, parsed.usage.cached_tokens]
        for c in parsed.choices:
            empty: dict[str, Any] = {"text": "", "finish": None, "stop_reason": None, "tool_calls": [], "logprobs": []}
            state = choices.setdefault(str(c.index), empty)
            state["text"] += c.text
            state["finish"] = c.finish or state["finish"]
            if c.stop_reason is not None:
                state["stop_reason"] = c.stop_reason
            state["tool_calls"] += [[t.index, t.id, t.name, t.arguments] for t in c.tool_calls]
            state["logprobs"] += [[t.token, t.logprob, [[a.token, a.logprob] for a in t.top]] for t in c.logprobs]
    return {"choices": choices, "usage": usage}


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: p.stem)
def test_recorded_stream_parses_to_the_expected_pieces(path: Path) -> None:
    row = json.loads(path.read_text())
    assert row["source"], "every recording says where it comes from"
    docs = sse_events(row["sse"])
    assert docs, "the recording holds events"
    assert folded(docs) == row["expected"]


def _request(fields: dict[str, Any]) -> GenerationRequest:
    fields = dict(fields)
    for key in ("stop", "tools"):
        if key in fields:
            fields[key] = tuple(fields[key])
    if "logit_bias" in fields:  # JSON keys are strings; the request holds token ids
        fields["logit_bias"] = {int(k): v for k, v in fields["logit_bias"].items()}
    return GenerationRequest(request_id="r", model="m", **fields)


@pytest.mark.parametrize("row", PAYLOADS, ids=lambda r: r["name"])
def test_request_becomes_the_recorded_engine_body(row: dict[str, Any]) -> None:
    assert row["source"]
    caps = CAPABILITIES[row["capabilities"]]
    payload = to_payload(_request(row["request"]), row["served_model"], caps, row["ask_usage"])
    assert payload == row["expected"]


def test_the_tables_are_there() -> None:
    """An empty or misplaced data folder would otherwise pass by testing nothing."""
    assert len(STREAMS) >= 10 and len(PAYLOADS) >= 8
    assert {CAPABILITIES.get(r["capabilities"]) is not None for r in PAYLOADS} == {True}


def test_finish_reasons_in_engine_spellings_become_openai_ones() -> None:
    """The engines' own finish spellings, one row each (a table too small for a file)."""
    table = {"eos_token": "stop", "stop_sequence": "stop", "abort": "stop", "eos": "stop", "limit": "length"}
    for raw, want in table.items():
        doc = {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": raw}]}
        assert parse_chunk(doc).finish == want
    assert parse_chunk({"choices": [{"index": 0, "text": "x", "finish_reason": "tool_calls"}]}).finish == "tool_calls"
