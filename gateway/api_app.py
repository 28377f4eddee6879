"""The FastAPI application behind ``Gateway``: every route declared with its pydantic request and
response models, so ``GET /openapi.json`` (OpenAPI 3.1) describes the gateway's whole API.

The handlers keep their own reading and validation of bodies (OpenAI error JSON for every bad input,
the admin routes' own messages): FastAPI routes the requests and documents them, it does not parse
their bodies. Generation requests (``POST`` to a front door) never reach this app at all: ``Gateway``
answers them on the raw-ASGI hot path; their entries here document them and answer other methods
with 405. ``/docs`` (Swagger UI) is on only with ``server.docs``, from files installed with the
``docs`` extra, never from a CDN.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from gateway.doors import api_models as m
from gateway.doors.admin import ExplainBody
from gateway.doors.anthropic_api import Conversation, MessagesBody
from gateway.doors.embeddings import EmbeddingsBody
from gateway.doors.openai_api import ChatBody, CompletionBody
from gateway.doors.responses_api import ResponsesBody

Endpoint = Callable[[Request], Any]
_ADMIN_SECURITY: list[dict[str, list[str]]] = [{"adminKey": []}]


@dataclass(frozen=True, slots=True)
class Doc:
    """How one operation appears in the OpenAPI document."""

    summary: str
    tag: str
    response: type[BaseModel] | None
    """None: a text answer (``/metrics``)."""
    body: type[BaseModel] | None = None
    stream: str | None = None
    """What ``stream: true`` sends instead, as server-sent events."""
    status: int = 200
    error: type[BaseModel] = m.ErrorBody


_STREAM_CHAT = "`chat.completion.chunk` events, then `data: [DONE]`"
DOCS: dict[tuple[str, str], Doc] = {
    ("POST", "/v1/chat/completions"): Doc("Chat completion", "openai", m.ChatCompletion, ChatBody, _STREAM_CHAT),
    ("POST", "/v1/completions"): Doc(
        "Text completion", "openai", m.TextCompletion, CompletionBody, "`text_completion` chunks, then `data: [DONE]`"
    ),
    ("POST", "/v1/responses"): Doc(
        "Response (stateless)",
        "openai",
        m.ResponseObject,
        ResponsesBody,
        "typed events: `response.created` ... `response.completed` (or `error` and `response.failed`)",
    ),
    ("POST", "/v1/messages"): Doc(
        "Anthropic message",
        "anthropic",
        m.AnthropicMessage,
        MessagesBody,
        "`message_start`, `content_block_*`, `message_delta`, `message_stop` (or `error`)",
        error=m.AnthropicError,
    ),
    ("POST", "/v1/messages/count_tokens"): Doc(
        "Count a message's input tokens", "anthropic", m.TokenCount, Conversation, error=m.AnthropicError
    ),
    ("POST", "/v1/embeddings"): Doc("Embeddings", "openai", m.EmbeddingList, EmbeddingsBody),
    ("GET", "/v1/models"): Doc("List models", "openai", m.ModelList),
    ("GET", "/v1/models/{model}"): Doc("Show a model", "openai", m.ModelCard),
    ("GET", "/healthz"): Doc("Alive", "health", m.Health),
    ("GET", "/readyz"): Doc("Ready: a backend is healthy and the gateway is not draining", "health", m.Ready),
    ("GET", "/metrics"): Doc("Prometheus metrics", "health", None),
    ("POST", "/admin/reload"): Doc("Reload the config file", "admin", m.ReloadResult),
    ("POST", "/admin/config/diff"): Doc("What a config would change", "admin", m.ConfigDiff, m.ConfigDiffBody),
    ("POST", "/admin/route/explain"): Doc("Explain a routing decision", "admin", m.Explanation, ExplainBody),
    ("GET", "/admin/fleet"): Doc("Fleet state", "admin", m.BackendState),
    ("GET", "/admin/splits"): Doc("Weighted splits: arms, counts and the canary guard", "admin", m.SplitState),
    ("GET", "/admin/shadow"): Doc("Shadow traffic's comparisons, summed up", "admin", m.ShadowSummary),
    ("GET", "/admin/decisions"): Doc("The last routing decisions", "admin", m.DecisionList),
    ("POST", "/admin/keys"): Doc("Create an API key", "admin", m.KeyRecord, m.KeySpec, status=201),
    ("GET", "/admin/keys"): Doc("List API keys", "admin", m.KeyList),
    ("GET", "/admin/keys/{key_id}"): Doc("Show an API key", "admin", m.KeyRecord),
    ("PATCH", "/admin/keys/{key_id}"): Doc("Update an API key", "admin", m.KeyRecord, m.KeySpec),
    ("DELETE", "/admin/keys/{key_id}"): Doc("Revoke an API key", "admin", m.KeyRecord),
    ("GET", "/admin/keys/{key_id}/usage"): Doc("An API key's usage", "admin", m.KeyUsage),
}
_FLEET_MAP = {"/admin/fleet", "/admin/splits"}
"""Routes whose answer is a map of names to the response model."""


def _documented(endpoint: Endpoint, path_params: Collection[str]) -> Endpoint:
    """``endpoint`` as FastAPI sees it: it takes the request (and declares the path's parameters,
    for the document); it still reads everything from the request itself."""

    async def call(request: Request, **_: str) -> Any:
        return await endpoint(request)

    params = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)]
    params += [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, annotation=str) for p in path_params]
    call.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    call.__name__ = getattr(endpoint, "__name__", "endpoint")
    call.__doc__ = endpoint.__doc__
    return call


def _responses(doc: Doc, path: str) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {"default": {"model": doc.error, "description": "An error"}}
    if doc.stream is not None:
        out[doc.status] = {
            "content": {"text/event-stream": {"schema": _sse_event(doc.stream)}},
            "description": f"The answer; with `stream: true`, {doc.stream}",
        }
    if doc.response is None:  # a text answer; its errors are still JSON (the model is listed by other routes)
        out[doc.status] = {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Text"}
        error = {"schema": {"$ref": f"#/components/schemas/{doc.error.__name__}"}}
        out["default"] = {"description": "An error", "content": {"application/json": error}}
    return out


def _sse_event(what: str) -> dict[str, Any]:
    """One server-sent event of a stream (``event:`` is absent in OpenAI's chat streams)."""
    return {
        "type": "object",
        "description": what,
        "properties": {"event": {"type": "string"}, "data": {"type": "string", "description": "JSON, or [DONE]"}},
        "required": ["data"],
    }


def _hot_path(request: Request) -> Any:
    raise AssertionError("Gateway answers POSTs to the front doors before this app sees them")


def build(
    routes: list[Route],
    generation: Collection[str],
    *,
    exception_handlers: Mapping[Any, Callable[..., Any]],
    lifespan: Callable[[Any], Any],
    docs: bool,
    admin_auth: Callable[[Request], Awaitable[None]],
) -> FastAPI:
    """The app for ``routes`` (Starlette routes as ``gateway.app`` and ``gateway.doors.admin`` define them)."""
    app = FastAPI(
        title="enginegate",
        version="0.1.0",
        summary="One OpenAI- and Anthropic-compatible front door in front of several inference engines.",
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
        exception_handlers=dict(exception_handlers),
        lifespan=lifespan,
    )
    bodies: list[type[BaseModel]] = []
    heads: list[BaseRoute] = []
    for route in routes:
        endpoint = route.endpoint
        methods = {"POST"} if route.path in generation else (route.methods or {"GET"}) - {"HEAD"}
        params = list(route.param_convertors)
        for method in sorted(methods):
            path = route.path_format
            doc = DOCS.get((method, path)) or Doc(endpoint.__doc__ or path, "other", m.Document)
            extra: dict[str, Any] = {}
            if doc.body is not None:
                bodies.append(doc.body)
                schema = {"$ref": f"#/components/schemas/{doc.body.__name__}"}
                extra["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
            admin = route.path.startswith("/admin/")
            if admin:
                extra["security"] = _ADMIN_SECURITY
            response: Any = doc.response
            if path in _FLEET_MAP and response is not None:
                response = dict[str, response]
            app.add_api_route(
                route.path,
                _documented(_hot_path if route.path in generation else endpoint, params),
                methods=[method],
                response_model=response,
                status_code=doc.status,
                summary=doc.summary,
                tags=[doc.tag],
                responses=_responses(doc, path),
                openapi_extra=extra or None,
                response_class=PlainTextResponse if doc.response is None else JSONResponse,
                operation_id=f"{method.lower()}_{path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
                dependencies=[Depends(admin_auth)] if admin else None,  # the admin key, before the handler
            )
        if "GET" in methods:  # HEAD as before (a Starlette route adds it to GET), not in the document
            heads.append(Route(route.path, endpoint, methods=["HEAD"], include_in_schema=False))
    app.router.routes.extend(heads)
    _openapi_with_bodies(app, bodies)
    if docs:
        _mount_docs(app)
    return app


def _openapi_with_bodies(app: FastAPI, bodies: list[type[BaseModel]]) -> None:
    """FastAPI's document, plus the request bodies' schemas (the handlers parse those themselves)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes, openapi_version="3.1.0"
        )
        unique = list(dict.fromkeys(bodies))
        _, defs = models_json_schema([(b, "validation") for b in unique], ref_template="#/components/schemas/{model}")
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        clash = sorted(set(schemas) & set(defs.get("$defs", {})))
        if clash:  # one name for two models would describe one of them wrongly
            raise RuntimeError(f"OpenAPI schema names used twice: {', '.join(clash)}")
        schemas.update(defs.get("$defs", {}))
        doc["components"]["securitySchemes"] = {
            "adminKey": {"type": "http", "scheme": "bearer", "description": "The key in `admin.api_key_env`"},
            "apiKey": {"type": "http", "scheme": "bearer", "description": "An API key (with `auth:` configured)"},
        }
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _mount_docs(app: FastAPI) -> None:
    try:
        import fastapi_offline
    except ImportError as exc:
        from gateway.config import ConfigError

        raise ConfigError(["server.docs: the docs need the `docs` extra (pip install 'enginegate[docs]')"]) from exc
    static = Path(fastapi_offline.__file__).parent / "static"

    async def swagger(request: Request) -> Response:
        html: HTMLResponse = get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="enginegate API",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="/docs/assets/favicon.png",
        )
        return html

    app.router.routes.append(Mount("/docs/assets", StaticFiles(directory=static), name="docs-assets"))
    app.router.routes.append(Route("/docs", swagger, methods=["GET"], include_in_schema=False))
