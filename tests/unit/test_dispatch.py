"""Dispatch tells the fleet about every attempt, so routing's in-flight and prefill-backlog figures
count requests from the moment they are sent, and return to zero however attempts end."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from backends.base import BackendError, GenerationRequest
from gateway import dispatch
from routing.types import Candidate, Decision, Prediction, Reason
from tests.fakes import CONNECT_ERROR, ScriptedBackend

PROMPT = 120


@dataclass
class Recorder:
    events: list[tuple[str, str, int]] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    backlog: dict[str, int] = field(default_factory=dict)

    def sending(self, name: str, prompt_tokens: int) -> None:
        self.events.append(("sending", name, prompt_tokens))
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        self.backlog[name] = self.backlog.get(name, 0) + prompt_tokens

    def first_token(self, name: str, prompt_tokens: int) -> None:
        self.events.append(("first_token", name, prompt_tokens))
        self.backlog[name] -= prompt_tokens

    def end(self, name: str, prompt_tokens: int = 0) -> None:
        self.events.append(("end", name, prompt_tokens))
        self.in_flight[name] -= 1
        self.backlog[name] -= prompt_tokens


def decision(*names: str) -> Decision:
    p = Prediction(1.0, 1.0, 1.0, 0.0)
    return Decision(Reason.NO_BUDGET, tuple(Candidate(n, 1.0, p, True) for n in names))


def run(backends: dict[str, ScriptedBackend], tracker: Recorder, hedge_after: float | None = None) -> str:
    async def go() -> str:
        request = GenerationRequest("r1", "m", prompt="hi")
        committed = await dispatch.start(decision(*backends), backends, request, 1.0, tracker, PROMPT, hedge_after)
        async for _ in committed.chunks():
            pass
        await committed.aclose()
        tracker.end(committed.backend)  # what the request's accounting does when the answer ends
        return committed.backend

    return asyncio.run(go())


def test_a_failed_attempt_ends_with_its_prompt_and_the_next_one_is_counted() -> None:
    a, b = ScriptedBackend("a", "m"), ScriptedBackend("b", "m")
    a.fail_with = CONNECT_ERROR
    tracker = Recorder()
    assert run({"a": a, "b": b}, tracker) == "b"
    assert tracker.events == [
        ("sending", "a", PROMPT), ("end", "a", PROMPT),
        ("sending", "b", PROMPT), ("first_token", "b", PROMPT), ("end", "b", 0),
    ]  # fmt: skip
    assert tracker.in_flight == {"a": 0, "b": 0} and tracker.backlog == {"a": 0, "b": 0}


def test_a_hedge_loser_is_ended_too() -> None:
    slow, fast = ScriptedBackend("slow", "m", first_delay=0.3), ScriptedBackend("fast", "m")
    tracker = Recorder()
    assert run({"slow": slow, "fast": fast}, tracker, hedge_after=0.05) == "fast"
    assert tracker.in_flight == {"slow": 0, "fast": 0} and tracker.backlog == {"slow": 0, "fast": 0}


def test_every_attempt_failing_leaves_nothing_counted() -> None:
    a, b = ScriptedBackend("a", "m"), ScriptedBackend("b", "m")
    a.fail_with = b.fail_with = CONNECT_ERROR
    tracker = Recorder()
    with pytest.raises(BackendError):
        run({"a": a, "b": b}, tracker)
    assert tracker.in_flight == {"a": 0, "b": 0} and tracker.backlog == {"a": 0, "b": 0}
