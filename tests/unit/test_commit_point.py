"""The commit point does not depend on how the engine's bytes arrive (issue 11.5): tokens followed by
an error event give the client the tokens and then the error, whether they came in one read or many."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from backends.base import BackendError, GenerationRequest
from backends.http_base import HttpSettings
from backends.vllm import VLLMBackend


def _sse(doc: object) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


TOKENS = [
    _sse({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": w}}]})
    for w in ("Deep", " learning")
]
ERROR = _sse({"error": {"message": "engine crashed", "type": "InternalServerError", "code": 500}})
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def _engine(pieces: list[bytes]) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(HEAD)
        for piece in pieces:
            writer.write(_chunk(piece))
            await writer.drain()
            await asyncio.sleep(0.01)  # separate reads on the other side (or one, when it is one piece)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def _outcome(pieces: list[bytes]) -> tuple[str, str]:
    async def go() -> tuple[str, str]:
        server, url = await _engine(pieces)
        backend = VLLMBackend("v", "m", HttpSettings(url=url, served_model="m"))
        text = []
        error = ""
        try:
            async for chunk in backend.generate(
                GenerationRequest("r", "m", messages=[{"role": "user", "content": "x"}])
            ):
                text.append(chunk.text)
        except BackendError as exc:
            error = exc.kind.value
        finally:
            await backend.aclose()
            server.close()
        return "".join(text), error

    return asyncio.run(go())


@pytest.mark.parametrize(
    "pieces",
    [
        [TOKENS[0], TOKENS[1], ERROR],
        [TOKENS[0] + TOKENS[1] + ERROR],
        [TOKENS[0], TOKENS[1] + ERROR],
    ],
    ids=["three reads", "one read", "error with the last token"],
)
def test_tokens_then_an_error_event_give_the_tokens_then_the_error_however_they_arrive(pieces: list[bytes]) -> None:
    text, error = _outcome(pieces)
    assert text == "Deep learning"
    assert error != ""
