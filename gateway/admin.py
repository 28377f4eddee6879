"""Admin endpoints (``/admin/...``): reload, explain a routing decision against the live fleet, fleet state,
and API keys (create, list, show, update, revoke, usage) when the gateway has them.

They need ``Authorization: Bearer <key>`` with the key from the environment variable named by
``admin.api_key_env`` (without that setting they are off), compared in constant time; an address
that fails ``admin.max_failures`` times is locked out (gateway/tenancy/guard.py). With
``admin.port`` they answer only on that port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import replace
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.base import GenerationRequest
from gateway.errors import ApiError, bad_request
from gateway.openai_api import prompt_texts
from gateway.state import AppState
from gateway.supervisor import SUPERVISOR_ENV
from gateway.tenancy.gate import Tenancy
from gateway.tenancy.guard import AdminGuard
from gateway.tenancy.manage import BadKeySpec, create, revoke, summarize, update, validate
from gateway.tenancy.pricing import day_of
from routing.explain import to_dict
from routing.features import features as prompt_features
from routing.policy import choose
from routing.types import FleetSnapshot, RequestFeatures


class ExplainMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str


class ExplainBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str
    prompt_tokens: int = Field(default=100, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    ttft_budget_ms: float | None = Field(default=None, gt=0)
    latency_budget_ms: float | None = Field(default=None, gt=0)
    tpot_budget_ms: float | None = Field(default=None, gt=0)
    tenant: str | None = None
    key: str | None = None
    """An API key's id, for rules that match keys."""
    team: str | None = None
    headers: dict[str, str] = {}
    needs: list[str] = []
    """Capabilities the request would use (tools, json_schema, logprobs, images...)."""
    extras: list[str] = []
    """Request fields outside OpenAI's spec it would carry (top_k, min_p...)."""
    messages: list[ExplainMessage] | None = None
    """A chat, as a request would send it: its prompt tokens (counted with the model's tokenizer
    where the gateway has it) and the cached tokens each backend is expected to hold for it."""
    prompt: str | None = None
    """A completion prompt, likewise."""


def _json(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


class AdminAuth:
    """The admin key check, as a FastAPI dependency of every admin route (``gateway.api_app`` attaches it):
    the handlers below assume it ran. One per app: its lockout guard counts failures across routes."""

    def __init__(self, state: AppState) -> None:
        admin = state.config.admin
        self._state = state
        self._guard = AdminGuard(admin.max_failures, admin.lockout_s)

    async def __call__(self, request: Request) -> None:
        state, guard = self._state, self._guard
        cfg = state.config.admin
        server = request.scope.get("server")
        if cfg.port is not None and (server is None or server[1] != cfg.port):
            raise ApiError(404, f"Unknown route: {request.method} {request.url.path}", code="unknown_url")
        key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        client = request.client.host if request.client is not None else "unknown"
        guard.check(key, request.headers.get("authorization"), client)


def routes(state: AppState) -> list[Route]:
    """The admin routes; each needs ``AdminAuth`` as its dependency (the app adds it to every one)."""

    async def reload(request: Request) -> Response:
        problems = await state.reload()
        if problems:
            return _json({"status": "rejected", "problems": problems, "config": str(state.runtime.loaded.path)}, 422)
        supervisor = os.environ.get(SUPERVISOR_ENV)
        if supervisor is not None and supervisor.isdigit():
            # Under serve --workers: the supervisor passes the reload on to every worker (this one
            # reloads again, finding nothing changed).
            with contextlib.suppress(OSError):
                os.kill(int(supervisor), signal.SIGHUP)
        return _json({"status": "reloaded", "config": str(state.runtime.loaded.path)})

    async def explain(request: Request) -> Response:
        try:
            body = ExplainBody.model_validate(orjson.loads(await request.body()))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            raise bad_request(f"Invalid explain request: {exc}") from None
        if body.messages is not None and body.prompt is not None:
            raise bad_request("Give messages or prompt, not both.", "messages")
        features = RequestFeatures(
            model=body.model,
            prompt_tokens=body.prompt_tokens,
            max_tokens=body.max_tokens,
            ttft_budget_ms=body.ttft_budget_ms,
            latency_budget_ms=body.latency_budget_ms,
            tpot_budget_ms=body.tpot_budget_ms,
            tenant=body.tenant,
            key=body.key,
            team=body.team,
            headers=tuple((k.lower(), v) for k, v in body.headers.items()),
            needs=frozenset(body.needs),
            extras=frozenset(body.extras),
        )
        snapshot = state.fleet.snapshot()
        if body.messages is not None or body.prompt is not None:
            features = await _with_prompt(features, body, snapshot)
        return _json(to_dict(choose(features, snapshot, state.runtime.rules), features))

    async def _with_prompt(features: RequestFeatures, body: ExplainBody, snapshot: FleetSnapshot) -> RequestFeatures:
        """The prompt's own features, as ``/v1/chat/completions`` computes them: its tokens, blocks and
        (where engines publish what they hold) token ids."""
        rt = state.runtime
        messages = [m.model_dump() for m in body.messages] if body.messages is not None else None
        gen = GenerationRequest("explain", body.model, messages=messages, prompt=body.prompt)
        exact, token_ids = await rt.measure(gen, snapshot)
        own = prompt_features(
            body.model, prompt_texts(gen), body.max_tokens, False, {}, exact,
            roles=[m["role"] for m in messages] if messages is not None else None, block_bytes=rt.block_bytes,
            token_ids=token_ids,
        )  # fmt: skip
        return replace(
            features, prompt_tokens=own.prompt_tokens, prefix_hash=own.prefix_hash, prefix_blocks=own.prefix_blocks,
            block_tokens=own.block_tokens, preamble_blocks=own.preamble_blocks, token_ids=own.token_ids,
        )  # fmt: skip

    async def fleet(request: Request) -> Response:
        doc = {
            b.name: {
                "engine": b.profile.engine,
                "context": b.profile.context,  # the engine's own context, where it published or refused one
                "healthy": b.healthy,
                "running": b.running,
                "waiting": b.waiting,
                "load_fresh": b.load_fresh,
                "breaker": b.breaker.value,
                "recovery": b.recovery,
                "observed": {"ttft_ratio": b.observed.ttft_ratio, "tpot_ms": b.observed.tpot_ms,
                             "samples": b.observed.samples},
            }
            for b in state.fleet.snapshot().backends
        }  # fmt: skip
        return _json(doc)

    def tenancy(request: Request) -> Tenancy:
        if state.tenancy is None or state.tenancy.store is None:
            raise ApiError(404, "This gateway has no API keys (auth: in its config).", code="keys_off")
        return state.tenancy

    async def body_of(request: Request) -> dict[str, Any]:
        try:
            doc = orjson.loads(await request.body() or b"{}")
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"Invalid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise bad_request("The body must be a JSON object.")
        return doc

    def unknown_key(key_id: str) -> ApiError:
        return ApiError(404, f"No API key {key_id}.", code="key_not_found")

    async def create_key(request: Request) -> Response:
        t = tenancy(request)
        try:
            limits = validate(await body_of(request), t.auth.priority_classes)
        except BadKeySpec as exc:
            raise bad_request(str(exc)) from None
        assert t.store is not None
        record, token = await create(t.store, limits)
        # The only time the key is shown: the database keeps its hash.
        return _json({"key": token, **record.public()}, 201)

    async def list_keys(request: Request) -> Response:
        t = tenancy(request)
        assert t.store is not None
        records = [*t.declared.values(), *await t.store.all()]
        return _json({"object": "list", "data": [r.public() for r in records]})

    async def show_key(request: Request) -> Response:
        t = tenancy(request)
        key_id = request.path_params["key_id"]
        assert t.store is not None
        record = t.declared.get(key_id) or await t.store.get(key_id)
        if record is None:
            raise unknown_key(key_id)
        return _json(record.public())

    async def update_key(request: Request) -> Response:
        t = tenancy(request)
        key_id = request.path_params["key_id"]
        if key_id in t.declared:
            raise bad_request(f"Key {key_id} is declared in the config file: change it there.")
        assert t.store is not None
        try:
            record = await update(t.store, key_id, await body_of(request), t.auth.priority_classes)
        except BadKeySpec as exc:
            raise bad_request(str(exc)) from None
        if record is None:
            raise unknown_key(key_id)
        t.forget(key_id)
        return _json(record.public())

    async def revoke_key(request: Request) -> Response:
        t = tenancy(request)
        key_id = request.path_params["key_id"]
        if key_id in t.declared:
            raise bad_request(f"Key {key_id} is declared in the config file: remove it there.")
        assert t.store is not None
        record = await revoke(t.store, key_id)
        if record is None:
            raise unknown_key(key_id)
        t.forget(key_id)
        return _json(record.public())

    async def key_usage(request: Request) -> Response:
        t = tenancy(request)
        key_id = request.path_params["key_id"]
        assert t.store is not None
        try:
            days = int(request.query_params.get("days", "31"))
        except ValueError:
            raise bad_request("days must be an integer", param="days") from None
        if (t.declared.get(key_id) or await t.store.get(key_id)) is None:
            raise unknown_key(key_id)
        await t.flush()  # this replica's latest requests too
        since = day_of(time.time() - max(0, days - 1) * 86400)
        return _json({"id": key_id, "since": since, **summarize(await t.store.usage(key_id, since))})

    return [
        Route("/admin/keys", create_key, methods=["POST"]),
        Route("/admin/keys", list_keys, methods=["GET"]),
        Route("/admin/keys/{key_id}", show_key, methods=["GET"]),
        Route("/admin/keys/{key_id}", update_key, methods=["PATCH"]),
        Route("/admin/keys/{key_id}", revoke_key, methods=["DELETE"]),
        Route("/admin/keys/{key_id}/usage", key_usage, methods=["GET"]),
        Route("/admin/reload", reload, methods=["POST"]),
        Route("/admin/route/explain", explain, methods=["POST"]),
        Route("/admin/fleet", fleet, methods=["GET"]),
    ]
