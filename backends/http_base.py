"""What every engine reached over HTTP shares: one pooled client, error mapping, health, load.

Subclasses build the engine's payload and parse its stream; this class opens
streams (mapping connect errors, timeouts and error statuses to
``BackendError`` once), counts requests in flight, and reads health and load
from the engine's own cheap endpoints.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from backends import http_errors
from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Health, Load
from backends.prom_text import LoadMap, read_load
from backends.sse import iter_events
from backends.text import ChatRenderer


@dataclass(frozen=True)
class HttpSettings:
    """Where and how to reach one engine deployment."""

    url: str
    served_model: str
    api_key: str | None = None
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 600.0
    max_connections: int = 256
    chat_template: str | None = None
    """For engines that take raw text (Triton, TGI native, MII REST): how chat is rendered."""
    default_max_tokens: int = 256
    """For engines that require a token limit when the client gave none."""


class HttpBackend(abc.ABC):
    engine = "http"
    health_path = "/health"
    metrics_path: str | None = "/metrics"
    load_map: LoadMap | None = None

    def __init__(
        self, name: str, model: str, settings: HttpSettings, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.name = name
        self._model = model
        self.settings = settings
        headers = {"authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self._client = httpx.AsyncClient(
            base_url=settings.url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
            limits=httpx.Limits(max_connections=settings.max_connections, max_keepalive_connections=64),
            transport=transport,
        )
        self._chat = ChatRenderer(settings.chat_template)
        self.in_flight = 0

    def models(self) -> list[str]:
        return [self._model]

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """The engine's stream as neutral chunks (an async generator in every subclass)."""

    async def aclose(self) -> None:
        await self._client.aclose()

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        return self._chat.render(messages)

    async def health(self) -> Health:
        try:
            resp = await self._client.get(self.health_path, timeout=self.settings.connect_timeout_s + 3)
        except httpx.HTTPError as exc:
            return Health(ok=False, detail=f"{type(exc).__name__}: {exc}")
        return Health(ok=resp.status_code == 200, detail="" if resp.status_code == 200 else resp.text[:200])

    async def load(self) -> Load | None:
        """The engine's own gauges when it has them, else what this gateway has in flight there."""
        load = await self._engine_load() if self.load_map is not None else None
        return load if load is not None else Load(running=self.in_flight, waiting=0)

    async def _engine_load(self) -> Load | None:
        if self.load_map is None or self.metrics_path is None:
            return None
        try:
            resp = await self._client.get(self.metrics_path, timeout=self.settings.connect_timeout_s + 3)
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        try:
            return read_load(resp.text, self.load_map)
        except ValueError:  # unparsable exposition: no engine gauges this time
            return None

    @asynccontextmanager
    async def open_stream(self, path: str, payload: dict[str, Any]) -> AsyncIterator[httpx.Response]:
        """POST and yield the streaming response once its status is 2xx; close it on exit (cancelling upstream)."""
        self.in_flight += 1
        try:
            request = self._client.build_request(
                "POST", path, content=orjson.dumps(payload), headers={"content-type": "application/json"}
            )
            try:
                response = await self._client.send(request, stream=True)
            except httpx.ConnectError as exc:
                raise BackendError(ErrorKind.CONNECT, f"{self.name}: cannot connect: {exc}") from exc
            except httpx.TimeoutException as exc:
                raise BackendError(ErrorKind.TIMEOUT, f"{self.name}: timed out: {exc}") from exc
            except httpx.HTTPError as exc:
                raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: {type(exc).__name__}: {exc}") from exc
            try:
                if response.status_code >= 400:
                    body = await self._read(response)
                    raise http_errors.from_response(self.name, response.status_code, body, response.headers)
                yield response
            finally:
                await response.aclose()
        finally:
            self.in_flight -= 1

    async def _read(self, response: httpx.Response) -> bytes:
        try:
            return await response.aread()
        except httpx.HTTPError as exc:
            raise self.transport_error(exc) from exc

    def transport_error(self, exc: httpx.HTTPError) -> BackendError:
        """A failure while reading a stream that had started."""
        if isinstance(exc, httpx.TimeoutException):
            return BackendError(ErrorKind.TIMEOUT, f"{self.name}: timed out reading: {exc}")
        return BackendError(ErrorKind.PROTOCOL, f"{self.name}: stream broke: {type(exc).__name__}: {exc}")

    async def lines(self, response: httpx.Response) -> AsyncIterator[str]:
        try:
            async for line in response.aiter_lines():
                yield line
        except httpx.HTTPError as exc:
            raise self.transport_error(exc) from exc

    def prompt_text(self, request: GenerationRequest) -> str:
        """The text an engine that takes raw text gets: chat rendered with the model's template."""
        return self.render_chat(request.messages) if request.messages is not None else request.prompt or ""

    async def json_events(self, response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
        """Each SSE event as a JSON object; an error event raises as the engine's error."""
        async for event in iter_events(self.lines(response)):
            doc = self.json_event(event.data)
            if not isinstance(doc, dict):
                raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: unexpected event {event.data[:200]!r}")
            if "error" in doc or event.field == "error":
                raise http_errors.from_event(self.name, doc)
            yield doc

    def json_event(self, data: str) -> Any:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: not JSON in stream: {data[:200]!r}") from exc
