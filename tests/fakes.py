"""Scripted backends for dispatch tests: they fail where and how a test says.

They are not engine contract fakes (those reproduce an engine's wire format);
they exercise the gateway's own failover and error paths through the Backend
protocol, in a real uvicorn server.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import uvicorn

from backends.base import Backend, BackendError, Chunk, ErrorKind, GenerationRequest, Health, Load, Usage
from gateway.config import BackendConfig, LoadedConfig
from tests.conftest import free_port, wait_ready


@dataclass
class ScriptedBackend:
    """Streams ``words``; raises ``fail_with`` after ``fail_after`` words (0: before any)."""

    name: str
    model: str
    words: list[str] = field(default_factory=lambda: ["fine", " answer"])
    fail_with: BackendError | None = None
    fail_after: int = 0
    healthy: bool = True
    first_delay: float = 0.0
    calls: int = 0
    closed_streams: int = 0
    finished: int = 0
    """Generations that ran to their end (a cancelled one closes its stream without finishing)."""
    closed: bool = False

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.calls += 1
        try:
            await asyncio.sleep(self.first_delay)
            for i, word in enumerate(self.words):
                if self.fail_with is not None and i == self.fail_after:
                    raise self.fail_with
                await asyncio.sleep(0)
                yield Chunk(text=word)
            self.finished += 1
            yield Chunk(finish_reason="stop", usage=Usage(3, len(self.words)))
        finally:
            self.closed_streams += 1

    async def health(self) -> Health:
        return Health(ok=self.healthy)

    async def load(self) -> Load | None:
        return Load(running=0, waiting=0)

    def models(self) -> list[str]:
        return [self.model]

    async def aclose(self) -> None:
        self.closed = True


def factory(backends: dict[str, Backend]) -> Callable[[BackendConfig, LoadedConfig], Backend]:
    return lambda cfg, loaded: backends[cfg.name]


@contextlib.contextmanager
def serve_in_thread(app: object, ready_path: str = "/readyz") -> Iterator[str]:
    """A real uvicorn server on a free port, in a thread of this process (so tests can hold fakes).

    ``ready_path`` must answer 200 once the app serves (engine fakes: their own health route)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, timeout=20, path=ready_path)
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)


CONNECT_ERROR = BackendError(ErrorKind.CONNECT, "connection refused")
UPSTREAM_ERROR = BackendError(ErrorKind.UPSTREAM, "engine crashed")


async def sse_engine(pieces: list[bytes], pace_s: float = 0.0) -> tuple[asyncio.Server, str]:
    """An OpenAI-compatible engine on a free loopback port (the server and its URL) whose every chat
    answer is the stream ``pieces`` (its end included), one write each with a turn of the event loop
    between them (a network may still join them in one read), or ``pace_s`` seconds (a decoding
    engine's pace: each its own read); 200 for its health, 404 for anything else; connections kept
    alive."""
    total = sum(len(p) for p in pieces)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the gateway closed the connection
                break
            fields = dict(line.partition(b":")[::2] for line in head.lower().split(b"\r\n")[1:] if line)
            await reader.readexactly(int(fields.get(b"content-length", b"0")))
            path = head.split(b" ", 2)[1]
            if path != b"/v1/chat/completions":
                status = b"200 OK" if path == b"/health" else b"404 Not Found"
                writer.write(b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}" % status)
                continue
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % total)
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(pace_s)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", free_port())
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
