"""Streams that go wrong: messages out of order, a proxy in the wrong mode, clients that leave, a bug in
the picker; and the gRPC health services. Each ends cleanly, and the picker serves the next stream."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.epp.server import SERVICE
from tests.epp.harness import (
    Picker,
    chat,
    chunk,
    destination,
    refused,
    request_body,
    request_headers,
    response_body,
    response_headers,
    rest,
    running,
)
from tests.polling import eventually


async def still_picks(picker: Picker) -> None:
    answers = await picker.exchange([request_headers(), *request_body(chat())])
    assert destination(answers[0])[0]
    assert all(e.in_flight == 0 for e in picker.epp.state.fleet.entries.values())


@pytest.mark.parametrize(
    ("sequence", "wrong"),
    [
        ([chunk(b"{}", end=True)], "request_body is out of order: request headers expected"),
        ([ext.ProcessingRequest()], "a message with no request is out of order"),
        ([response_headers()], "response_headers is out of order"),
        ([request_headers(), request_headers()], "request_headers is out of order: request body expected"),
        ([request_headers(), response_body(b"x", end=True)], "response_body is out of order"),
    ],
)
def test_a_message_out_of_order_ends_the_stream_with_invalid_argument(
    tmp_path: Path, sequence: list[Any], wrong: str
) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await picker.exchange(sequence)
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert wrong in str(caught.value.details())
            await still_picks(picker)

    asyncio.run(main())


def test_the_stream_ends_with_the_answer_and_a_late_message_changes_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            call = picker.stub.Process()
            for message in [request_headers(), *request_body(chat()), response_headers()]:
                await call.write(message)
            await call.write(response_body(b"{}", end=True))
            with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
                await call.write(response_body(b"more", end=True))  # the picker has ended the stream
            answers = await rest(call)
            assert [a.WhichOneof("response") for a in answers] == [
                "request_headers", "request_body", "response_headers", "response_body"
            ]  # fmt: skip
            assert await call.code() is grpc.StatusCode.OK
            await still_picks(picker)

    asyncio.run(main())


def test_request_trailers_end_the_body_and_are_answered_after_it(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            body = chat()
            trailers = ext.ProcessingRequest(request_trailers=ext.HttpTrailers())
            answers = await picker.exchange([request_headers(), chunk(body[:100]), chunk(body[100:]), trailers])
            assert [a.WhichOneof("response") for a in answers] == [
                "request_headers",
                "request_body",
                "request_trailers",
            ]
            handed_back = answers[1].request_body.response.body_mutation.streamed_response
            assert (handed_back.body, handed_back.end_of_stream) == (body, False)  # the trailers end the request

    asyncio.run(main())


def test_a_proxy_that_buffers_the_body_is_told_the_mode_it_needs(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            buffered = request_headers(mode=processing_mode_pb2.ProcessingMode.BUFFERED)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await picker.exchange([buffered])  # in buffered mode Envoy waits for this answer first
            assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "FULL_DUPLEX_STREAMED" in str(caught.value.details())

    asyncio.run(main())


def test_a_request_without_body_is_refused_with_a_400(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            answers = await picker.exchange([request_headers(end=True)])
            assert refused(answers[0])[:2][0] == 400

    asyncio.run(main())


def test_a_client_gone_while_its_body_arrives_leaves_nothing_behind(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            call = picker.stub.Process()
            await call.write(request_headers())
            await call.write(chunk(chat()[:50]))
            call.cancel()
            assert call.cancelled()
            await still_picks(picker)

    asyncio.run(main())


def test_a_client_gone_mid_answer_is_no_longer_in_flight(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            call = picker.stub.Process()
            for message in [request_headers(), *request_body(chat(stream=True))]:
                await call.write(message)
            pick = await call.read()
            await call.read()  # the body handed back
            first = picker.entry("h100" if destination(pick)[0].startswith("10.0.0.1") else "a10g")
            await call.write(response_headers())
            await call.write(response_body(b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n', False))
            await call.read(), await call.read()
            assert first.in_flight == 1
            call.cancel()
            await eventually(lambda: first.in_flight == 0, message="the gone client's request is still in flight")
            assert first.observed.samples == 0  # a cut answer teaches no latency
            await still_picks(picker)

    asyncio.run(main())


def test_a_bug_in_the_picker_answers_500_and_the_next_stream_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            real = picker.epp.picker.pick

            async def broken(*args: Any) -> Any:
                raise RuntimeError("a bug")

            monkeypatch.setattr(picker.epp.picker, "pick", broken)
            status, error, _ = refused((await picker.exchange([request_headers(), *request_body(chat())]))[0])
            assert (status, error["code"]) == (500, "internal_error")
            monkeypatch.setattr(picker.epp.picker, "pick", real)
            await still_picks(picker)

    asyncio.run(main())


def test_health_services_report_liveness_readiness_and_the_processor(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as picker:
            stub = health_pb2_grpc.HealthStub(picker.channel)
            for service in ("liveness", "readiness", SERVICE, ""):
                answer = await stub.Check(health_pb2.HealthCheckRequest(service=service))
                assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Check(health_pb2.HealthCheckRequest(service="something-else"))
            assert caught.value.code() is grpc.StatusCode.NOT_FOUND

    asyncio.run(main())
