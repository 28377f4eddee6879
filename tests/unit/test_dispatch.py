"""Dispatch reports every attempt as it happens, commits where the client's first byte would go,
and keeps each phase's deadline: the fleet's in-flight and prefill-backlog figures count requests
from the moment they are sent and return to zero however attempts end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from backends.base import Backend, BackendError, Chunk, ErrorKind, GenerationRequest
from gateway.pipeline import dispatch
from gateway.pipeline.dispatch import Deadlines, Target
from tests.fakes import CONNECT_ERROR, UPSTREAM_ERROR, ScriptedBackend

PROMPT = 120
DEADLINES = Deadlines(first_token_s=1.0, answer_s=5.0)


@dataclass
class Slot:
    """A dispatch target: a backend under a name (the fleet's entry in the gateway)."""

    name: str
    backend: Backend


@dataclass
class Recorder:
    events: list[tuple[str, str, int]] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    backlog: dict[str, int] = field(default_factory=dict)
    failures: list[tuple[str, ErrorKind]] = field(default_factory=list)
    queues: dict[str, float] = field(default_factory=dict)
    """Backends that are queueing, with the wait a request joining their queue would have."""

    def sending(self, target: Target, prompt_tokens: int) -> None:
        self.events.append(("sending", target.name, prompt_tokens))
        self.in_flight[target.name] = self.in_flight.get(target.name, 0) + 1
        self.backlog[target.name] = self.backlog.get(target.name, 0) + prompt_tokens

    def first_token(self, target: Target, prompt_tokens: int) -> None:
        self.events.append(("first_token", target.name, prompt_tokens))
        self.backlog[target.name] -= prompt_tokens

    def failed(self, target: Target, error: BackendError) -> None:
        self.failures.append((target.name, error.kind))

    def queued(self, target: Target) -> float | None:
        return self.queues.get(target.name)

    def end(self, target: Target, prompt_tokens: int = 0) -> None:
        self.events.append(("end", target.name, prompt_tokens))
        self.in_flight[target.name] -= 1
        self.backlog[target.name] -= prompt_tokens


def run(
    backends: dict[str, Backend],
    tracker: Recorder,
    hedge_after: float | None = None,
    whole: bool = False,
    deadlines: Deadlines = DEADLINES,
) -> tuple[str, str]:
    """(backend that answered, the text the client got)."""

    async def go() -> tuple[str, str]:
        request = GenerationRequest("r1", "m", prompt="hi")
        targets = [Slot(name, b) for name, b in backends.items()]
        committed = await dispatch.start(
            targets, dispatch.Generate(request), deadlines, tracker, PROMPT, whole, hedge_after
        )
        text = "".join([c.text for c in committed.first] + [c.text async for c in committed.rest])
        await committed.aclose()
        tracker.end(committed.target)  # what the request's lifecycle does when the answer ends
        return committed.backend, text

    return asyncio.run(go())


def test_a_failed_attempt_ends_with_its_prompt_and_the_next_one_is_counted() -> None:
    a, b = ScriptedBackend("a", "m"), ScriptedBackend("b", "m")
    a.fail_with = CONNECT_ERROR
    tracker = Recorder()
    assert run({"a": a, "b": b}, tracker)[0] == "b"
    assert tracker.events == [
        ("sending", "a", PROMPT), ("end", "a", PROMPT),
        ("sending", "b", PROMPT), ("first_token", "b", PROMPT), ("end", "b", 0),
    ]  # fmt: skip
    assert tracker.failures == [("a", ErrorKind.CONNECT)]
    assert tracker.in_flight == {"a": 0, "b": 0} and tracker.backlog == {"a": 0, "b": 0}


def test_a_hedge_loser_is_ended_too() -> None:
    slow, fast = ScriptedBackend("slow", "m", first_delay=0.3), ScriptedBackend("fast", "m")
    tracker = Recorder()
    assert run({"slow": slow, "fast": fast}, tracker, hedge_after=0.05)[0] == "fast"
    assert tracker.in_flight == {"slow": 0, "fast": 0} and tracker.backlog == {"slow": 0, "fast": 0}


def test_every_attempt_failing_leaves_nothing_counted() -> None:
    a, b = ScriptedBackend("a", "m"), ScriptedBackend("b", "m")
    a.fail_with = b.fail_with = CONNECT_ERROR
    tracker = Recorder()
    with pytest.raises(BackendError) as caught:
        run({"a": a, "b": b}, tracker)
    assert [name for name, _ in caught.value.failures] == ["a", "b"]
    assert tracker.in_flight == {"a": 0, "b": 0} and tracker.backlog == {"a": 0, "b": 0}


def test_a_whole_answer_that_fails_mid_generation_is_answered_by_the_next_backend() -> None:
    """Not streamed, nothing reached the client: the commit point is the answer's end (issue 11.6)."""
    a = ScriptedBackend("a", "m", words=["par", "tial", " text"], fail_with=UPSTREAM_ERROR, fail_after=2)
    b = ScriptedBackend("b", "m", words=["whole", " answer"])
    tracker = Recorder()
    assert run({"a": a, "b": b}, tracker, whole=True) == ("b", "whole answer")
    assert tracker.failures == [("a", ErrorKind.UPSTREAM)]
    assert a.closed_streams == 1 and tracker.in_flight == {"a": 0, "b": 0}


def test_a_stream_that_fails_after_its_first_token_is_committed_and_raises_to_its_consumer() -> None:
    a = ScriptedBackend("a", "m", words=["par", "tial"], fail_with=UPSTREAM_ERROR, fail_after=1)
    b = ScriptedBackend("b", "m")
    with pytest.raises(BackendError):
        run({"a": a, "b": b}, Recorder())
    assert b.calls == 0


class BuggyBackend(ScriptedBackend):
    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        raise KeyError("parser bug")
        yield Chunk()


def test_an_adapter_bug_is_the_gateways_fault_not_the_engines() -> None:
    tracker = Recorder()
    assert run({"bug": BuggyBackend("bug", "m"), "ok": ScriptedBackend("ok", "m")}, tracker)[0] == "ok"
    assert tracker.failures == [("bug", ErrorKind.INTERNAL)]
    assert not BackendError(ErrorKind.INTERNAL, "x").engine_fault


class WholeAnswerBackend(ScriptedBackend):
    """Answers at once after ``first_delay`` (MII REST): the first chunk is the whole answer."""

    def answers_whole(self, request: GenerationRequest, whole: bool | None = None) -> bool:
        return True


def test_an_engine_that_answers_whole_gets_the_answer_deadline_not_the_first_token_one() -> None:
    slow = WholeAnswerBackend("mii", "m", words=["long", " answer"], first_delay=0.3)
    tracker = Recorder()
    deadlines = Deadlines(first_token_s=0.1, answer_s=2.0)
    assert run({"mii": slow}, tracker, deadlines=deadlines) == ("mii", "long answer")
    assert tracker.failures == []


def test_a_whole_answer_past_its_deadline_times_out_and_fails_over() -> None:
    slow = WholeAnswerBackend("mii", "m", first_delay=1.0)
    tracker = Recorder()
    deadlines = Deadlines(first_token_s=0.05, answer_s=0.2)
    assert run({"mii": slow, "b": ScriptedBackend("b", "m")}, tracker, deadlines=deadlines)[0] == "b"
    assert tracker.failures == [("mii", ErrorKind.TIMEOUT)]


def test_a_first_token_that_is_late_fails_over_even_when_the_answer_is_collected_whole() -> None:
    late = ScriptedBackend("late", "m", first_delay=1.0)
    tracker = Recorder()
    deadlines = Deadlines(first_token_s=0.1, answer_s=5.0)
    assert run({"late": late, "b": ScriptedBackend("b", "m")}, tracker, whole=True, deadlines=deadlines)[0] == "b"
    assert tracker.failures == [("late", ErrorKind.TIMEOUT)]


def test_a_whole_answer_that_has_its_first_token_in_time_is_not_hedged() -> None:
    """Hedging is against a late first token; a long answer collected whole is not late."""
    long = ScriptedBackend("long", "m", words=["a"] * 3)
    other = ScriptedBackend("other", "m")

    class Slow(ScriptedBackend):
        async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
            yield Chunk(text="first")
            await asyncio.sleep(0.3)
            async for chunk in long.generate(request):
                yield chunk

    tracker = Recorder()
    assert run({"slow": Slow("slow", "m"), "other": other}, tracker, hedge_after=0.05, whole=True)[0] == "slow"
    assert other.calls == 0


def test_a_request_stuck_in_a_queueing_engine_gives_up_there_as_overloaded_and_fails_over() -> None:
    """Shed after the admission limit, with Retry-After, never a timeout a minute later; its breaker
    is not fed (an overload is not a fault) (issue 12.4)."""
    queued = ScriptedBackend("queued", "m", first_delay=5.0)
    tracker = Recorder(queues={"queued": 7.0})
    deadlines = Deadlines(first_token_s=10.0, answer_s=20.0, queue_s=0.1)
    assert run({"queued": queued, "b": ScriptedBackend("b", "m")}, tracker, deadlines=deadlines)[0] == "b"
    assert tracker.failures == [("queued", ErrorKind.OVERLOADED)]
    with pytest.raises(BackendError) as caught:
        run(
            {"queued": ScriptedBackend("queued", "m", first_delay=5.0)},
            Recorder(queues={"queued": 7.0}),
            deadlines=deadlines,
        )
    assert caught.value.kind is ErrorKind.OVERLOADED and caught.value.retry_after == 7.0
    assert not caught.value.engine_fault


def test_a_slow_first_token_on_an_engine_without_a_queue_waits_for_the_first_token_deadline() -> None:
    slow = ScriptedBackend("slow", "m", first_delay=0.3)
    tracker = Recorder()
    deadlines = Deadlines(first_token_s=5.0, answer_s=20.0, queue_s=0.05)
    assert run({"slow": slow}, tracker, deadlines=deadlines) == ("slow", "fine answer")
    assert tracker.failures == []
