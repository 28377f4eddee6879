"""What the answers teach the fleet: in flight where the proxy says it went, latencies and breakers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from tests.epp.harness import (
    A10G,
    Picker,
    chat,
    destination,
    request_body,
    request_headers,
    response_body,
    response_headers,
    rest,
    running,
    sse,
)

TIGHT = [("x-ttft-budget-ms", "150")]
WORDS = [{"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]} for w in ("a", "b", "c")]
USAGE = {"choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 3, "total_tokens": 1003}}


async def picked(picker: Picker, headers: list[tuple[str, str]] = TIGHT) -> tuple[Any, list[Any]]:
    """A stream whose request was picked (the answers read); the proxy's answer still to come."""
    call = picker.stub.Process()
    for message in [request_headers(headers=headers), *request_body(chat(stream=True))]:
        await call.write(message)
    answers = [await call.read() for _ in range(2)]  # the pick, then the body handed back
    return call, answers


def test_the_served_endpoint_takes_the_request_and_learns_its_first_token_and_pace(tmp_path: Path) -> None:
    """The H100 was picked, the proxy's retry landed on the A10G: the A10G has it in flight, learns
    from its stream (one more sample), and the H100 learns nothing."""

    async def main() -> None:
        async with running(tmp_path) as picker:
            h100, a10g = picker.entry("h100"), picker.entry("a10g")
            call, answers = await picked(picker)
            assert destination(answers[0])[0].startswith("10.0.0.1:8000")
            assert (h100.in_flight, a10g.in_flight) == (1, 0)
            await call.write(response_headers(served=A10G))
            assert (await call.read()).WhichOneof("response") == "response_headers"
            assert (h100.in_flight, a10g.in_flight) == (0, 1)
            stream = sse(*WORDS, USAGE)
            await call.write(response_body(stream[:40], end=False))
            await call.write(response_body(stream[40:], end=True))
            passed = [await call.read() for _ in range(2)]
            assert b"".join(a.response_body.response.body_mutation.streamed_response.body for a in passed) == stream
            assert [a.response_body.response.body_mutation.streamed_response.end_of_stream for a in passed] == [
                False,
                True,
            ]
            await call.done_writing()
            assert await rest(call) == []
            assert (h100.in_flight, a10g.in_flight) == (0, 0)
            assert (h100.observed.samples, a10g.observed.samples) == (0, 1)
            assert a10g.observed.out_tokens == 3 and a10g.observed.tpot_ms is not None

    asyncio.run(main())


def test_an_engine_error_opens_on_the_breaker_and_a_client_error_does_not(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            h100 = picker.entry("h100")
            for status, failures in ((400, 0), (500, 1), (503, 2)):
                call, _ = await picked(picker)
                await call.write(response_headers(status, "application/json", served="10.0.0.1:8000"))
                await call.write(response_body(orjson.dumps({"error": {"message": "no"}}), end=True))
                await call.done_writing()
                assert len(await rest(call)) == 2
                assert (h100.breaker.failures, h100.in_flight) == (failures, 0)

    asyncio.run(main())


def test_a_whole_answer_closes_the_account_and_reports_the_cache(tmp_path: Path) -> None:
    """A non-streamed answer: no first token to learn from (no latency sample), but its end, the
    breaker's success and the engine's report of reused prompt tokens are: the same prompt again,
    expected in the cache, and the engine says it reused none, so the expected cache shrinks."""
    doc = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "abc"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}},
    }

    async def main() -> None:
        async with running(tmp_path) as picker:
            capacities = []
            for _ in range(2):
                call, answers = await picked(picker)
                entry = picker.entry("h100" if destination(answers[0])[0].startswith("10.0.0.1") else "a10g")
                entry.breaker.failures = 2
                await call.write(response_headers(200, "application/json"))  # no served report: the pick served
                await call.write(response_body(orjson.dumps(doc), end=True))
                await call.done_writing()
                assert len(await rest(call)) == 2
                assert (entry.in_flight, entry.breaker.failures, entry.observed.samples) == (0, 0, 0)
                assert entry.prefix is not None
                capacities.append(entry.prefix.capacity)
            assert capacities[1] < capacities[0]

    asyncio.run(main())


def test_the_response_passes_through_unchanged_in_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            call, _ = await picked(picker)
            await call.write(response_headers())
            pieces = [f"data: {i}\n\n".encode() for i in range(20)]
            for i, piece in enumerate(pieces):
                await call.write(response_body(piece, end=i == len(pieces) - 1))
            await call.done_writing()
            answers = await rest(call)
            assert answers[0].WhichOneof("response") == "response_headers"
            assert [a.response_body.response.body_mutation.streamed_response.body for a in answers[1:]] == pieces

    asyncio.run(main())


def test_an_answer_not_shaped_as_openais_passes_through_and_closes_its_account(tmp_path: Path) -> None:
    odd = b'data: {"choices": "not a list"}\n\ndata: [1, 2]\n\ndata: {"choices": [{"delta": 5}]}\n\n'

    async def main() -> None:
        async with running(tmp_path) as picker:
            call, answers = await picked(picker)
            entry = picker.entry("h100" if destination(answers[0])[0].startswith("10.0.0.1") else "a10g")
            await call.write(response_headers())
            await call.write(response_body(odd, end=False))
            await call.write(response_body(sse(*WORDS), end=True))
            await call.done_writing()
            passed = await rest(call)
            bodies = [a.response_body.response.body_mutation.streamed_response.body for a in passed[1:]]
            assert bodies == [odd, sse(*WORDS)]
            assert (entry.in_flight, entry.breaker.failures) == (0, 0)

    asyncio.run(main())
