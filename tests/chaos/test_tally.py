"""The chaos suite's own checks can fail: each one fed the evidence of the failure it exists to catch."""

from __future__ import annotations

import json
from pathlib import Path

from tests.chaos.clients import Result, stream_outcome
from tests.chaos.fleet import Upstream
from tests.chaos.schedule import Spec, plan
from tests.chaos.tally import RECOVERY_BOUND_S, Recovery, analyse

FINISH = json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
TOKEN = json.dumps({"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]})
ERROR = json.dumps({"error": {"message": "engine failed", "type": "api_error", "param": None, "code": "upstream"}})


def test_stream_outcomes() -> None:
    assert stream_outcome([TOKEN, FINISH, "[DONE]"])[0] == "completed"
    assert stream_outcome([TOKEN, ERROR, "[DONE]"])[0] == "error"
    assert stream_outcome([TOKEN, FINISH])[0] == "truncated"  # no [DONE]
    assert stream_outcome([TOKEN, ERROR])[0] == "truncated"  # an error event must be followed by [DONE]
    assert stream_outcome([TOKEN, "[DONE]"])[0] == "truncated"  # neither a finish nor an error
    assert stream_outcome([ERROR, TOKEN, FINISH, "[DONE]"])[0] == "unclean"  # the stream went on after an error
    assert stream_outcome([TOKEN, json.dumps({"error": "bare text"}), "[DONE]"])[0] == "unclean"  # not OpenAI's


def _spec(rid: str, leave: float | None = None) -> Spec:
    return Spec(rid, 0.0, True, True, False, 8, leave)


def _up(key: str, start: float, end: float | None, fault: str | None = None) -> Upstream:
    return Upstream("tgi", 1, 1, key, key, fault, start, end)


def test_analysis_catches_duplicate_generations_lingering_streams_and_slow_recovery(tmp_path: Path) -> None:
    log = tmp_path / "gw.log"
    log.write_text(
        "\n".join(
            json.dumps({"level": "info", "msg": "request", "request_id": rid, "attempts": 1, "outcome": "ok"})
            for rid in ("a", "b", "c")
        )
    )
    done = Result(_spec("a"), outcome="completed")
    left = Result(_spec("b", leave=1), outcome="left", left_at=10.0)
    hung = Result(_spec("c"), outcome="hung")
    upstream = [
        _up("a", 1.0, 1.1, fault="drop"),  # the engine ran it and the connection closed ...
        _up("a", 1.2, 1.3),  # ... and the same request was sent again within one attempt
        _up("b", 9.0, None),  # still generating for a client that left
        _up("c", 5.0, 5.1, fault="refuse"),  # never reached the engine: not a generation
    ]
    slow = Recovery("tgi", 1.0, back_at=100.0, recovered_at=130.0)
    fig = analyse([done, left, hung], upstream, log, [slow], {"tgi": 1}, ["sighup:tgi=unseen"])
    rows = {figure: value for figure, value, _ in fig.rows}
    assert rows["hung (client deadline passed)"] == "1"
    assert rows["requests with more upstream generations than attempts"] == "1"
    assert rows["upstream open > 3s after its client left"] == "1"
    assert rows["upstream streams open after the run"] == "1"
    assert rows[f"breaker recoveries within {RECOVERY_BOUND_S:g}s of the engine's return"] == "0/1"
    assert rows["reloads applied"] == "0/1"
    assert len(fig.misses) == 7  # the six above, and 1 completed of the 2 that stayed (below 60%)
    assert "a  client: completed" in "\n".join(fig.misses)  # evidence names the request


def test_plan_is_a_function_of_the_seed() -> None:
    backends = ["a", "b", "c", "d", "e", "f"]
    assert plan(3, backends) == plan(3, backends)
    assert plan(3, backends) != plan(4, backends)
    kinds = [e.kind for e in plan(3, backends).events]
    assert {"kill", "unhealthy", "slow", "queue", "burst", "reload"} <= set(kinds)
