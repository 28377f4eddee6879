"""What every engine reached over HTTP shares: one pooled client, error mapping, health, load.

Subclasses build the engine's payload and parse its stream; this class opens
streams (mapping connect errors, timeouts and error statuses to
``BackendError`` once), counts requests in flight, and reads health and load
from the engine's own cheap endpoints. Where the engine publishes the context it
was launched with (``context_path``, read by ``read_context``), a healthy
engine is asked once (again after it was unhealthy: it may have been
relaunched) and ``context_length`` holds the answer.
"""

from __future__ import annotations

import abc
import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from backends import engine_http
from backends.base import BackendError, Chunk, EngineClock, ErrorKind, GenerationRequest, Health, Load
from backends.event_batches import EventBatches, json_doc
from backends.httpclient import DEFAULT_IDLE_TIMEOUT_S, HttpClient, Response
from backends.prom_text import LoadMap, read_load
from backends.text import ChatRenderer, sized_work

# Most body bytes held unread from an engine before reading from its socket pauses: flow control, not a
# size limit (bodies and events of any size are read piecewise). Small, so a client that reads slowly
# holds little of the engine's output in the gateway (8 MiB here cost 13 MB per stalled reader).
READ_BUFFER = 256 * 1024
# Largest response head (or chunked trailers) accepted from an engine.
HEAD_LIMIT = 64 * 1024


@dataclass(frozen=True)
class HttpSettings:
    """Where and how to reach one engine deployment."""

    url: str
    served_model: str
    api_key: str | None = None
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 600.0
    """Longest silence between two pieces of a response's body."""
    response_timeout_s: float | None = None
    """Longest wait for the response's head once the request is written; default: ``read_timeout_s``."""
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    """Idle connections are reused only this long: below the engine's keep-alive."""
    ssl_context: ssl.SSLContext | None = None
    """For https engines: CA, verification, client certificate (``httpclient.tls_context``);
    default: the system's CA store."""
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
    context_path: ClassVar[str | None] = None
    """Where the engine publishes its context limit (vLLM ``/v1/models``, TGI ``/info``, llama-server
    ``/props``); None: it publishes none (trtllm-serve, Triton, MII)."""
    closes_streams: ClassVar[bool] = False
    """The engine's server closes its connection after a streamed answer without saying so
    (llama-server): such requests say ``Connection: close``, so no request is ever written on a
    connection the server is closing (which, once written, may not be sent again)."""

    def __init__(self, name: str, model: str, settings: HttpSettings) -> None:
        self.name = name
        self._model = model
        self.settings = settings
        self._http: HttpClient | None = None
        self._chat = ChatRenderer(settings.chat_template)
        self._retries_before = 0
        """Retries counted by clients closed since (``aclose``)."""
        self.context_length: int | None = None
        """The most prompt plus answer tokens one request may have on this engine, as the engine
        published it (``context_path``); None until read, or where it publishes none."""
        self._context_read = False

    def _client(self) -> HttpClient:
        """The pooled client, made on first use (and again after ``aclose``)."""
        client = self._http
        if client is None or client.closed:
            settings = self.settings
            if client is not None:
                self._retries_before += client.retries
            response_timeout_s = settings.response_timeout_s
            client = self._http = HttpClient(
                settings.url,
                max_connections=settings.max_connections,
                connect_timeout_s=settings.connect_timeout_s,
                response_timeout_s=settings.read_timeout_s if response_timeout_s is None else response_timeout_s,
                read_timeout_s=settings.read_timeout_s,
                idle_timeout_s=settings.idle_timeout_s,
                read_limit=READ_BUFFER,
                max_head_bytes=HEAD_LIMIT,
                api_key=settings.api_key,
                ssl_context=settings.ssl_context,
            )
        return client

    @property
    def transport_retries(self) -> int:
        """Requests sent to this engine once more on a new connection because the first write could not
        have reached it (a stale pooled connection); never a request the engine may have run."""
        return self._retries_before + (self._http.retries if self._http is not None else 0)

    def models(self) -> list[str]:
        return [self._model]

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """The engine's stream as neutral chunks (an async generator in every subclass)."""

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def probe(self, path: str) -> tuple[int, bytes]:
        """GET one of the engine's cheap endpoints: (status, body); raises ``OSError`` (``HttpError``,
        ``TimeoutError``) as they come."""
        async with asyncio.timeout(self.settings.connect_timeout_s + 3):
            response = await self._client().request("GET", path)
            try:
                return response.status, await response.read()
            finally:
                response.release()

    async def health(self) -> Health:
        try:
            status, body = await self.probe(self.health_path)
        except OSError as exc:
            self._context_read = False
            return Health(ok=False, detail=f"{type(exc).__name__}: {exc}")
        if status != 200:
            self._context_read = False
            return Health(ok=False, detail=body[:200].decode("utf-8", "replace"))
        if not self._context_read and self.context_path is not None:
            await self.learn_context()
        return Health(ok=True)

    async def learn_context(self) -> int | None:
        """Ask the engine for the context it was launched with (``context_path``): ``context_length``."""
        if self.context_path is None:
            return None
        try:
            status, body = await self.probe(self.context_path)
            doc = orjson.loads(body) if status == 200 else None
        except (OSError, orjson.JSONDecodeError):
            return self.context_length  # asked again at the next health check
        self._context_read = True
        value = self.read_context(doc) if doc is not None else None
        self.context_length = value if isinstance(value, int) and value > 0 else None
        return self.context_length

    def read_context(self, doc: Any) -> int | None:
        """The context limit in the engine's ``context_path`` document (None: not there)."""
        return None

    async def load(self) -> Load | None:
        """The engine's own gauges when it has them; None otherwise: routing then counts what this gateway
        has in flight there (``routing.load``, from the fleet entry's count: the only one kept)."""
        return await self._engine_load() if self.load_map is not None else None

    async def _engine_load(self) -> Load | None:
        if self.load_map is None or self.metrics_path is None:
            return None
        try:
            status, body = await self.probe(self.metrics_path)
        except OSError:
            return None
        if status != 200:
            return None
        try:
            return read_load(body.decode("utf-8", "replace"), self.load_map)
        except ValueError:  # unparsable exposition: no engine gauges this time
            return None

    @asynccontextmanager
    async def open_stream(
        self, request: GenerationRequest, path: str, payload: dict[str, Any]
    ) -> AsyncIterator[Response]:
        """``opened`` as a context: the response is released on leaving."""
        response = await self.opened(request, path, payload)
        try:
            yield response
        finally:
            response.release()

    async def post_json(self, request: GenerationRequest, path: str, payload: dict[str, Any]) -> Any:
        """POST ``payload`` to one of the engine's small JSON routes (a tokenizer's) and the parsed answer;
        errors as ``open_stream`` maps them."""
        async with self.open_stream(request, path, payload) as response:
            body = await self.read_body(response, request.clock)
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: {path} answered {body[:200]!r}, not JSON") from exc

    def opened(self, request: GenerationRequest, path: str, payload: dict[str, Any]) -> Awaitable[Response]:
        """POST (with the request's id in ``X-Request-Id``) and the response once its status is 2xx; the
        caller releases it (``engine_http.open_response``). The hot path's adapters call this with their
        own ``try``/``finally``: a generator-based context manager costs an object and two frames per
        request. A plain function that returns the compiled coroutine: no frame of its own."""
        return engine_http.open_response(self._client(), self.name, request, path, payload, self.closes_streams)

    def read_body(self, response: Response, clock: EngineClock | None = None) -> Awaitable[bytes]:
        """The response's whole body; the wait goes on ``clock``, a broken read is a ``BackendError``."""
        return engine_http.read_body(self.name, response, clock)

    def transport_error(self, exc: Exception) -> BackendError:
        """A failure while reading a stream that had started."""
        return engine_http.transport_error(self.name, exc)

    async def render_prompt(self, request: GenerationRequest) -> str:
        """``prompt_text`` sized to the request: a long history renders in a thread, off the event loop."""
        return await sized_work(request, self.prompt_text)

    def prompt_text(self, request: GenerationRequest) -> str:
        """The text an engine that takes raw text gets: chat rendered with the model's template, with the
        request's tools (the gateway leaves them out when ``tool_choice`` is "none": no call may come)."""
        if request.messages is None:
            return request.prompt or ""
        tools = request.tools if request.tool_choice != "none" else ()
        return self._chat.render(
            request.messages, tools=list(tools) if tools else None, continue_final=request.continue_final
        )

    async def json_events(
        self, request: GenerationRequest, response: Response, trust_status: bool = True
    ) -> AsyncIterator[dict[str, Any]]:
        """Each SSE event as a JSON object until ``[DONE]``; an error event raises as the engine's error
        (``trust_status``: see ``http_errors.from_event``)."""
        async for batch in self.json_event_batches(request, response, trust_status):
            for doc in batch:
                yield doc

    def json_event_batches(
        self, request: GenerationRequest, response: Response, trust_status: bool = True
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Like ``json_events``, grouped by the network read that completed them: events that arrived
        together can be forwarded together (one write to the client instead of one per event)."""
        return EventBatches(self, response, request.clock, trust_status)

    def json_event(self, data: str) -> Any:
        return json_doc(self.name, data)
