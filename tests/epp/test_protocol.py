"""The endpoint-picker protocol as a proxy drives it: Envoy's message sequences over a real stream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from gateway.epp import wire
from tests.epp.harness import (
    A10G,
    H100,
    chat,
    chunk,
    destination,
    refused,
    request_body,
    request_headers,
    rest,
    running,
)

TIGHT = [("x-ttft-budget-ms", "150")]
RELAXED = [("x-latency-budget-ms", "60000")]


def test_the_pick_is_in_the_header_and_the_metadata_alike_with_its_fallbacks(tmp_path: Path) -> None:
    """A tight first-token budget goes to the H100 first, a relaxed one to the cheap A10G first; the
    other endpoint follows as the fallback, in both places, the same string."""

    async def main() -> None:
        async with running(tmp_path) as picker:
            tight = await picker.exchange([request_headers(headers=TIGHT), *request_body(chat())])
            relaxed = await picker.exchange([request_headers(headers=RELAXED), *request_body(chat())])
            assert destination(tight[0]) == (f"{H100},{A10G}", f"{H100},{A10G}")
            assert destination(relaxed[0]) == (f"{A10G},{H100}", f"{A10G},{H100}")
            assert tight[0].request_headers.response.clear_route_cache
            # A client's own x-gateway-destination-endpoint is replaced, never appended to.
            [header] = tight[0].request_headers.response.header_mutation.set_headers
            assert header.append_action == header.OVERWRITE_IF_EXISTS_OR_ADD

    asyncio.run(main())


def test_a_body_split_over_many_chunks_is_reassembled_and_handed_back_whole(tmp_path: Path) -> None:
    body = chat("Beautiful is better than ugly. " * 2300)  # ~70 KiB: handed back in two answers

    async def main() -> None:
        async with running(tmp_path) as picker:
            call = picker.stub.Process()
            await call.write(request_headers(headers=TIGHT))
            for message in request_body(body, pieces=97):
                await call.write(message)
            await call.done_writing()
            answers = await rest(call)
            assert destination(answers[0])[0] in (f"{H100},{A10G}", f"{A10G},{H100}")
            pieces = [a.request_body.response.body_mutation.streamed_response for a in answers[1:]]
            assert len(pieces) == -(-len(body) // wire.BODY_CHUNK) > 1
            assert b"".join(p.body for p in pieces) == body
            assert [p.end_of_stream for p in pieces] == [False] * (len(pieces) - 1) + [True]

    asyncio.run(main())


def test_no_ready_endpoint_is_503(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, h100=False, a10g=False) as picker:
            answers = await picker.exchange([request_headers(), *request_body(chat())])
            assert len(answers) == 1
            status, error, headers = refused(answers[0])
            assert (status, error["code"], headers["content-type"]) == (503, "no_backend_available", "application/json")
            assert headers["retry-after"] == "1"

    asyncio.run(main())


def test_a_request_shed_for_load_is_429(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            for backend in picker.backends.values():
                backend.running, backend.waiting = 256, 5000
            await picker.epp.state.fleet.poll_once()
            status, error, headers = refused((await picker.exchange([request_headers(), *request_body(chat())]))[0])
            assert (status, error["code"]) == (429, "overloaded")
            assert int(headers["retry-after"]) >= 1

    asyncio.run(main())


def test_a_budget_no_endpoint_meets_is_429_in_strict_mode(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, mode="strict") as picker:
            answers = await picker.exchange(
                [request_headers(headers=[("x-ttft-budget-ms", "0.001")]), *request_body(chat())]
            )
            status, error, _ = refused(answers[0])
            assert (status, error["code"]) == (429, "budget_unmeetable")

    asyncio.run(main())


def test_the_subset_hint_is_honoured_and_an_unusable_one_is_503(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, a10g=False) as picker:
            only_cheap = await picker.exchange(
                [request_headers(headers=TIGHT, subset=[A10G, "10.9.9.9:80"]), *request_body(chat())]
            )
            assert refused(only_cheap[0])[0] == 503  # the allowed endpoint is down: none usable
            picker.backends["a10g"].healthy = True
            await picker.epp.state.fleet.poll_once()
            only_cheap = await picker.exchange([request_headers(headers=TIGHT, subset=[A10G]), *request_body(chat())])
            assert destination(only_cheap[0]) == (A10G, A10G)  # the H100 would win, but is not allowed
            as_string = await picker.exchange(
                [request_headers(headers=TIGHT, subset=f"{A10G}, 10.9.9.9:80"), *request_body(chat())]
            )
            assert destination(as_string[0]) == (A10G, A10G)
            for subset in (["10.9.9.9:80"], []):
                answers = await picker.exchange([request_headers(subset=subset), *request_body(chat())])
                status, error, _ = refused(answers[0])
                assert (status, error["code"]) == (503, "no_backend_available")

    asyncio.run(main())


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/chat/completions", b"{not json", 400, "invalid_json"),
        ("/v1/chat/completions", orjson.dumps({"model": "m8b"}), 400, "missing_required_parameter"),
        ("/v1/chat/completions", chat(temperature="hot"), 400, "invalid_type"),
        ("/v1/completions", chat(), 400, "missing_required_parameter"),
        (
            "/v1/chat/completions",
            orjson.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}),
            404,
            "model_not_found",
        ),
        ("/v1/embeddings", orjson.dumps({"model": "m8b", "input": "x"}), 404, "unknown_url"),
    ],
)
def test_a_bad_request_gets_the_gateways_own_error(
    tmp_path: Path, path: str, body: bytes, status: int, code: str
) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            answers = await picker.exchange([request_headers(path), *request_body(body, pieces=3)])
            assert len(answers) == 1
            got, error, _ = refused(answers[0])
            assert (got, error["code"]) == (status, code), error

    asyncio.run(main())


def test_a_body_over_the_limit_is_413_before_it_ends(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            call = picker.stub.Process()
            await call.write(request_headers())
            await call.write(chunk(b"x" * 600_000))
            await call.write(chunk(b"x" * 600_000))  # over the 1,000,000 bytes of limits.max_body_bytes
            answers = await rest(call)
            assert [refused(a)[0] for a in answers] == [413]

    asyncio.run(main())
