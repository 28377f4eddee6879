"""``create_app(config)``: builds the fleet, routes and error handling; keeps everything on the app."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import api_app, console
from gateway.config import LoadedConfig
from gateway.doors import anthropic_tokens, embeddings
from gateway.doors.admin import AdminAuth
from gateway.doors.admin import routes as admin_routes
from gateway.doors.anthropic_api import MESSAGES
from gateway.doors.openai_surface import CHAT, COMPLETIONS
from gateway.doors.responses_api import RESPONSES
from gateway.fleet.engines import BackendFactory, build_backend
from gateway.http.cors import Cors, is_preflight
from gateway.http.drain import attach
from gateway.http.errors import ApiError, clip, model_not_found
from gateway.http.exchange import ClientGone, Exchange
from gateway.http.limits import tune_gc
from gateway.http.protocol import RECEIVED
from gateway.lifespan import lifespan_of
from gateway.pipeline.generation import Generating
from gateway.pipeline.serve import serve
from gateway.pipeline.surfaces import Door
from gateway.state import AppState
from routing.types import Breaker, FleetSnapshot

log = logging.getLogger("enginegate.app")

_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
"""A client's ``x-request-id`` is kept (as ``client_request_id``) only when it is this plain and short."""
_SINGLE = (b"authorization", b"x-api-key")
"""Headers a request may carry once: with two, which one is the key would depend on the route."""


def request_id() -> str:
    """A new id, the gateway's own for every request: unique, whatever a client sends."""
    return f"{random.getrandbits(128):032x}"  # unique, not secret: no system call per request


def front(scope: Scope) -> tuple[str | None, bytes | None]:
    """One pass over the headers: the client's own request id (None when absent or not plain), and
    the name of a header that must come once but came twice (None when none did)."""
    client_id = None
    seen: set[bytes] = set()
    for key, value in scope["headers"]:
        if key == b"x-request-id":
            rid = value.decode("latin-1")
            client_id = rid if _CLIENT_ID.match(rid) else None
        elif key in _SINGLE:
            if key in seen:
                return client_id, key
            seen.add(key)
    return client_id, None


def _twice(name: bytes) -> ApiError:
    header = name.decode("latin-1")
    return ApiError(400, f"The {header} header appears more than once; send it once.", param=header,
                    code="duplicate_header")  # fmt: skip


class Gateway:
    """The ASGI app: generation requests go straight to their handler (the hot path skips the
    framework's routing and middleware); everything else goes to Starlette. Every response carries
    the request's id in ``x-request-id``."""

    def __init__(self, state: AppState, app: Starlette) -> None:
        self.state = state
        self.app = app
        origins = state.config.server.cors_origins
        self.cors = Cors(origins) if origins else None
        self.surfaces = GENERATION
        """Generation routes (path to front door), answered on the hot path."""
        self.live: set[asyncio.Task[Any]] = set()
        """Generation requests in flight: a graceful shutdown ends those still running (``end_requests``)."""
        self.loop: asyncio.AbstractEventLoop | None = None  # kept: each look-up of it is a getpid system call

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            self.loop = asyncio.get_running_loop() if scope["type"] == "lifespan" else self.loop
            await self.app(scope, receive, send)
            return
        if self.cors is not None:  # off by default: one test per request
            origin = self.cors.origin(scope)
            if origin is not None:
                if is_preflight(scope):
                    await self.cors.preflight(origin, send)
                    return
                send = self.cors.wrap(origin, send)
        rid = request_id()
        client_id, twice = front(scope)
        surface = self.surfaces.get(scope["path"]) if scope["method"] == "POST" else None
        if twice is not None:  # refused before any route reads a key: one rule for every route
            door = surface.error_body if surface is not None else None
            ex = Exchange(receive, send, rid, door, client_id)
            await ex.error(_twice(twice))
            return
        if surface is not None:
            await self._generation(scope, receive, send, rid, surface, client_id=client_id)
            return
        if scope["path"] == embeddings.PATH and scope["method"] == "POST":
            await self._generation(scope, receive, send, rid, embeddings.EMBEDDINGS, client_id)
            return
        scope["enginegate.request_id"] = rid
        scope["enginegate.client_request_id"] = client_id
        ids = [(b"x-request-id", rid.encode())]  # the generation routes' Exchange sends its own
        if client_id is not None:
            ids.append((b"x-client-request-id", client_id.encode()))
        route = _route_label(scope["path"])
        metrics = self.state.metrics

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *ids]
                status = message["status"]
                if route is not None or status >= 400:  # probes and scrapes count only when they fail
                    metrics.other_request(route or "other", status)
            await send(message)

        await self.app(scope, receive, send_with_id)

    async def _generation(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        rid: str,
        door: Door,
        client_id: str | None = None,
    ) -> None:
        ex = Exchange(receive, send, rid, door.error_body, client_id, self.loop)  # errors in the door's shape
        task = ex.task
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if "x-api-key" in headers and "authorization" not in headers:  # Anthropic's clients send their key so
            headers["authorization"] = "Bearer " + headers["x-api-key"]
        self.live.add(task)
        try:
            await serve(ex, headers, self.state, door, scope.get(RECEIVED), scope["path"])
        except ApiError as exc:
            if not ex.started:
                await ex.error(exc)
        except ClientGone:
            pass  # left while sending the body: nothing was started, nobody to answer
        except asyncio.CancelledError:
            if not (ex.left or self.state.draining):
                raise
            task.uncancel()  # our own cancellation, done: the client left, or shutdown ended it; work stopped
            if not ex.left:
                await _shutdown_notice(ex)
        except Exception:
            log.exception("unhandled error", extra={"request_id": rid})  # the request's life recorded it
            if not ex.started:
                await ex.error(ApiError(500, _INTERNAL, type="api_error", code="internal_error"))
        finally:
            ex.close()
            self.live.discard(task)

    def end_requests(self) -> int:
        """Shutdown's grace is over: cancel the generation requests still running; each ends with an
        error (an SSE error event and ``[DONE]`` once streaming) and its engine work is stopped."""
        for task in self.live:
            task.cancel()
        self.state.shadows.cancel()  # mirrored requests are nobody's answer: they go at once
        return len(self.live)


async def _shutdown_notice(ex: Exchange) -> None:
    """Tell the client its request was cut by a shutdown; bounded, a client that reads nothing gets nothing."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_NOTICE_S):
            await ex.abort(_SHUTTING_DOWN)


GENERATION: dict[str, Door] = {
    "/v1/chat/completions": Generating(CHAT),
    "/v1/completions": Generating(COMPLETIONS),
    "/v1/responses": Generating(RESPONSES),
    "/v1/messages": Generating(MESSAGES),
}
"""The generation routes and their front doors: requests to them take the hot path."""
_NOTICE_S = 1.0
_SHUTTING_DOWN = ApiError(
    503, "The gateway is shutting down; retry the request.", type="api_error", code="shutting_down", retry_after=1.0
)


def _route_label(path: str) -> str | None:
    """The metrics route of an API response other than generation (None: health, metrics, unknown)."""
    if path.startswith("/v1/models"):
        return "models"
    if path.startswith("/admin/"):
        return "admin"
    return None


_INTERNAL = "The gateway hit an internal error; the request id identifies it in the logs."


def json_response(doc: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers)


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return Response(exc.json(), status_code=exc.status, media_type="application/json", headers=exc.headers())


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (unknown route, wrong method) as OpenAI error JSON."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err = ApiError(404, f"Unknown route: {clip(request.method)} {clip(request.url.path)}", code="unknown_url")
    elif exc.status_code == 405:
        err = ApiError(
            405, f"Method {clip(request.method)} is not allowed on {clip(request.url.path)}.", code="method_not_allowed"
        )
    else:
        err = ApiError(exc.status_code, str(exc.detail), type="invalid_request_error")
    return await api_error(request, err)


async def internal_error(request: Request, exc: Exception) -> Response:
    """A bug: logged with its traceback, answered as OpenAI error JSON without one."""
    log.exception("unhandled error", exc_info=exc, extra={"request_id": request.scope.get("enginegate.request_id")})
    return await api_error(request, ApiError(500, _INTERNAL, type="api_error", code="internal_error"))


def unready(snapshot: FleetSnapshot) -> str | None:
    """Why no request could be served now (every backend unhealthy or behind an open circuit breaker),
    or None when some backend can take one. A half-open breaker takes requests: it counts as ready."""
    backends = snapshot.backends
    if any(b.healthy and b.breaker is not Breaker.OPEN for b in backends):
        return None
    down = sum(not b.healthy for b in backends)
    tripped = len(backends) - down
    parts = [f"{down} unhealthy"] if down else []
    if tripped:
        parts.append(f"{tripped} with an open circuit breaker")
    return f"no backend can take a request: {' and '.join(parts) or 'none configured'} (of {len(backends)})"


def _routes(state: AppState, auth: AdminAuth) -> list[Route]:
    async def generation_method(request: Request) -> Response:
        """Only reached with a method other than POST (``Gateway`` answers POSTs itself)."""
        raise HTTPException(405)

    def model_doc(name: str) -> dict[str, object]:
        doc: dict[str, object] = {"id": name, "object": "model", "created": state.started, "owned_by": "enginegate"}
        served = state.runtime.aliases.get(name)
        if served is not None:  # an alias: listed as a model clients may ask for, naming the one that answers
            doc["root"] = served
        return doc

    async def visible(request: Request) -> frozenset[str]:
        """The models this request may see: all, or those its API key allows (401 without a valid key
        when keys are required)."""
        rt = state.runtime
        names = rt.model_names.union(rt.aliases)  # a frozenset: `| keys()` gives a set, which mypy calls frozenset
        if state.tenancy is None:
            return names
        key = await state.tenancy.authenticate(request.headers.get("authorization"))
        return names if key is None else frozenset(n for n in names if key.allows(rt.aliases.get(n, n)))

    async def list_models(request: Request) -> Response:
        names = sorted(await visible(request))
        return json_response({"object": "list", "data": [model_doc(m) for m in names]})

    async def get_model(request: Request) -> Response:
        name = request.path_params["model"]
        if name not in await visible(request):
            raise model_not_found(name)
        return json_response(model_doc(name))

    async def healthz(request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(request: Request) -> Response:
        snapshot = state.fleet.snapshot()
        why = "the gateway is shutting down" if state.draining else unready(snapshot)
        doc: dict[str, object] = {
            "status": "ready" if why is None else "draining" if state.draining else "not_ready",
            "backends": {b.name: b.healthy for b in snapshot.backends},
        }
        if why is not None:
            doc["reason"] = why
        return json_response(doc, 200 if why is None else 503)

    async def metrics(request: Request) -> Response:
        await auth.metrics(request)
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return [
        Route("/v1/chat/completions", generation_method),
        Route("/v1/completions", generation_method),
        Route("/v1/responses", generation_method),
        Route("/v1/messages", generation_method),
        Route(embeddings.PATH, generation_method),
        Route(anthropic_tokens.PATH, anthropic_tokens.count_tokens, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *admin_routes(state),
    ]


def from_environment() -> ASGIApp:
    """The app of one worker process (``serve --workers``): config and logging from the environment."""
    from gateway.config import default_config, load_config
    from gateway.telemetry.logs import configure

    configure(os.environ.get("ENGINEGATE_LOG_LEVEL", "info"), os.environ.get("ENGINEGATE_LOG_FORMAT", "json"))
    return create_app(load_config(default_config()))


def worker_app() -> ASGIApp:
    """The app factory of each ``serve --workers`` process."""
    app = from_environment()
    tune_gc()
    return attach(app)


def create_app(loaded: LoadedConfig, backend_factory: BackendFactory = build_backend) -> ASGIApp:
    """The gateway for one config: everything it holds lives on this app (no global state)."""
    state = AppState(loaded, backend_factory)
    auth = AdminAuth(state)
    app = api_app.build(  # FastAPI: routes and the OpenAPI document; generation skips it (Gateway)
        _routes(state, auth),
        [*GENERATION, embeddings.PATH],
        exception_handlers={
            ApiError: api_error,
            HTTPException: http_error,
            Exception: internal_error,
        },
        lifespan=lifespan_of(state),
        docs=state.config.server.docs,
        admin_auth=auth,
    )
    app.router.routes.extend(console.routes(auth))  # the operator's page: not API, not in the document
    app.state.enginegate = state
    return Gateway(state, app)
