"""Admin endpoints (``/admin/...``): reload (answering with what it applied), a config's what-if diff
(gateway/doors/admin_diff.py), explain a routing decision against the live fleet, fleet state, the last
routing decisions, weighted splits' arms, shadow traffic's comparisons, and API keys (create, list,
show, update, revoke, usage) when the gateway has them.

They need ``Authorization: Bearer <key>`` with the key from the environment variable named by
``admin.api_key_env`` (without that setting they are off), compared in constant time; an address
that fails ``admin.max_failures`` times is locked out (gateway/tenancy/guard.py; the address is the
connection's peer unless ``server.trusted_proxies`` says otherwise, see gateway/peers.py), and every
refusal is logged with it. With
``admin.port`` they answer only on that port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import replace
from typing import Any, Literal

import orjson
from pydantic import Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.base import GenerationRequest
from gateway.doors.admin_diff import ConfigDiff
from gateway.doors.admin_keys import key_routes
from gateway.fleet.entry import Entry
from gateway.http.errors import ApiError, bad_request, clip
from gateway.http.peers import TrustedProxies
from gateway.http.supervisor import SUPERVISOR_ENV
from gateway.pipeline.generation import prompt_texts
from gateway.state import AppState
from gateway.strict import Strict
from gateway.telemetry.shadow_report import summarize
from gateway.tenancy.guard import AdminGuard
from routing import fallback
from routing.explain import to_dict
from routing.features import features as prompt_features
from routing.split import route
from routing.types import FleetSnapshot, RequestFeatures

log = logging.getLogger("enginegate.admin")


class ExplainMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str


class ExplainBody(Strict):
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
    headers: dict[str, str] = Field(default_factory=dict)
    needs: list[str] = Field(default_factory=list)
    """Capabilities the request would use (tools, json_schema, logprobs, images...)."""
    extras: list[str] = Field(default_factory=list)
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
    the handlers below assume it ran. One per app: its lockout guard counts failures across routes.
    ``metrics`` is the same check for ``/metrics`` (its own key and its own lockout count)."""

    def __init__(self, state: AppState) -> None:
        admin = state.config.admin
        self._state = state
        self._guard = AdminGuard(admin.max_failures, admin.lockout_s)
        self._metrics_guard = AdminGuard(admin.max_failures, admin.lockout_s)
        self._proxies = TrustedProxies(state.config.server.trusted_proxies)

    def client(self, request: Request) -> str:
        """The client's address (``server.trusted_proxies`` says whose ``X-Forwarded-For`` counts)."""
        cidrs = self._state.config.server.trusted_proxies
        if self._proxies.cidrs != cidrs:  # a reload changed the list
            self._proxies = TrustedProxies(cidrs)
        return self._proxies.client(request.scope)

    async def __call__(self, request: Request) -> None:
        cfg = self._state.config.admin
        if not self.on_admin_port(request):
            raise ApiError(404, f"Unknown route: {request.method} {clip(request.url.path)}", code="unknown_url")
        key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        self._check(self._guard, key, request, "admin")

    def on_admin_port(self, request: Request) -> bool:
        """Whether the request came in where the admin routes answer (any port without ``admin.port``)."""
        port = self._state.config.admin.port
        server = request.scope.get("server")
        return port is None or (server is not None and server[1] == port)

    def key_set(self) -> bool:
        """Whether an admin key is configured (``admin.api_key_env`` names a variable holding one)."""
        env = self._state.config.admin.api_key_env
        return bool(env and os.environ.get(env))

    async def metrics(self, request: Request) -> None:
        """Refuse a scrape without the metrics key when ``/metrics`` is protected (``metrics:`` in the
        config): the per-team series say who spends what."""
        cfg = self._state.config
        protected = cfg.metrics.protected
        if protected is None:
            protected = cfg.metrics.api_key_env is not None or cfg.auth.required
        if not protected:
            return
        env = cfg.metrics.api_key_env or cfg.admin.api_key_env
        key = os.environ.get(env) if env else None
        if not key:
            raise ApiError(
                403, "/metrics needs a key: set metrics.api_key_env (or admin.api_key_env).",
                type="permission_error", code="metrics_key_unset",
            )  # fmt: skip
        self._check(self._metrics_guard, key, request, "metrics")

    def _check(self, guard: AdminGuard, key: str | None, request: Request, what: str) -> None:
        address = self.client(request)
        try:
            guard.check(key, request.headers.get("authorization"), address)
        except ApiError as exc:
            if exc.status in (401, 429):  # a wrong key, or a locked-out address trying again
                log.warning(
                    "%s authentication refused", what,
                    extra={"client": address, "path": clip(request.url.path), "code": exc.code,
                           "request_id": request.scope.get("enginegate.request_id")},
                )  # fmt: skip
            if exc.status == 401 and what != "admin":
                raise ApiError(401, f"A valid {what} key is required as `Authorization: Bearer <key>`.",
                               type=exc.type, code=exc.code) from None  # fmt: skip
            raise


class _Operations:
    """Reload, explain a routing decision against the live fleet, and the fleet's state."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    async def reload(self, request: Request) -> Response:
        problems, applied = await self.state.reload_applied()
        if problems:
            return _json(
                {"status": "rejected", "problems": problems, "config": str(self.state.runtime.loaded.path)}, 422
            )
        supervisor = os.environ.get(SUPERVISOR_ENV)
        if supervisor is not None and supervisor.isdigit():
            # Under serve --workers: the supervisor passes the reload on to every worker (this one
            # reloads again, finding nothing changed).
            with contextlib.suppress(OSError):
                os.kill(int(supervisor), signal.SIGHUP)
        return _json({"status": "reloaded", "config": str(self.state.runtime.loaded.path), **applied})

    async def explain(self, request: Request) -> Response:
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
        snapshot = self.state.fleet.snapshot()
        if body.messages is not None or body.prompt is not None:
            features = await self._with_prompt(features, body, snapshot)
        rt = self.state.runtime
        features = replace(features, model=rt.aliases.get(features.model, features.model))
        decision = route(features, snapshot, rt.rules, self.state.splits.stopped)
        plan = fallback.planned(features, snapshot, rt.rules, rt.chains.get(features.model, ()))
        return _json({**to_dict(decision, features, rt.rules), "fallbacks": fallback.to_dicts(decision, plan)})

    async def _with_prompt(
        self, features: RequestFeatures, body: ExplainBody, snapshot: FleetSnapshot
    ) -> RequestFeatures:
        """The prompt's own features, as ``/v1/chat/completions`` computes them: its tokens, blocks and
        (where engines publish what they hold) token ids."""
        rt = self.state.runtime
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

    async def fleet(self, request: Request) -> Response:
        entries = self.state.fleet.entries
        doc = {
            b.name: {
                "engine": b.profile.engine,
                "models": sorted(b.profile.models),
                # who counts its answers' tokens: the engine, the gateway's tokenizer, or an estimate
                "token_counts": entries[b.name].capabilities.token_counts if b.name in entries else None,
                "context": b.profile.context,  # the engine's own context, where it published or refused one
                "healthy": b.healthy,
                # why: the last probe's word (an engine's answer, or the error that reaching it gave)
                "detail": entries[b.name].health.detail if b.name in entries else None,
                "running": b.running,
                "waiting": b.waiting,
                "load_fresh": b.load_fresh,
                "kv_cache_usage": b.kv_cache_usage,
                "breaker": b.breaker.value,
                "recovery": b.recovery,
                "observed": {"ttft_ratio": b.observed.ttft_ratio, "tpot_ms": b.observed.tpot_ms,
                             "samples": b.observed.samples},
                **(_held(entries[b.name]) if b.name in entries else {}),
            }
            for b in self.state.fleet.snapshot().backends
        }  # fmt: skip
        return _json(doc)

    async def splits(self, request: Request) -> Response:
        """Each weighted split's arms: weights, counts since the config was loaded, and the guard's state."""
        return _json(self.state.splits.describe())

    async def shadow(self, request: Request) -> Response:
        """Shadow traffic's comparisons in memory, summed up as ``enginegate shadow report`` does."""
        shadows = self.state.shadows
        records = list(shadows.ring)
        groups = await asyncio.to_thread(summarize, records)  # thousands of records: off the event loop
        return _json({"pairs": len(records), "in_flight": len(shadows.tasks), "groups": groups})

    async def decisions(self, request: Request) -> Response:
        """The newest routing decisions (``?limit=``, default all kept), newest first."""
        raw = request.query_params.get("limit", "")
        if raw and not (raw.isdigit() and int(raw) >= 1):
            raise bad_request("limit must be a whole number of 1 or more.", "limit")
        recent = self.state.decisions
        data = recent.documents(int(raw) if raw else recent.size) if recent is not None else []
        return _json({"object": "list", "data": data, "kept": recent.size if recent is not None else 0})


def _held(entry: Entry) -> dict[str, Any]:
    """What the gateway has in flight on a backend and expects it to hold in its prefix cache."""
    prefix = entry.prefix
    return {
        "in_flight": entry.in_flight,
        "prefill_backlog_tokens": entry.prefill_backlog,
        "cached_tokens": round(prefix.tokens) if prefix is not None else 0,
        "cache_capacity_tokens": round(prefix.capacity) if prefix is not None else None,
        "exact_blocks": len(entry.exact) if entry.exact is not None and entry.exact.synced else None,
    }


def routes(state: AppState) -> list[Route]:
    """The admin routes; each needs ``AdminAuth`` as its dependency (the app adds it to every one)."""
    ops = _Operations(state)
    return [
        *key_routes(state),
        Route("/admin/reload", ops.reload, methods=["POST"]),
        Route("/admin/config/diff", ConfigDiff(state), methods=["POST"]),
        Route("/admin/route/explain", ops.explain, methods=["POST"]),
        Route("/admin/fleet", ops.fleet, methods=["GET"]),
        Route("/admin/splits", ops.splits, methods=["GET"]),
        Route("/admin/shadow", ops.shadow, methods=["GET"]),
        Route("/admin/decisions", ops.decisions, methods=["GET"]),
    ]
