"""Admin endpoints (``/admin/...``): reload, explain a routing decision against the live fleet, fleet state.

They need ``Authorization: Bearer <key>`` with the key from the environment
variable named by ``admin.api_key_env``; without that setting they are off.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import signal
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import ApiError, bad_request
from gateway.state import AppState
from gateway.supervisor import SUPERVISOR_ENV
from routing.explain import to_dict
from routing.policy import choose
from routing.types import RequestFeatures


class ExplainBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str
    prompt_tokens: int = Field(default=100, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    ttft_budget_ms: float | None = Field(default=None, gt=0)
    latency_budget_ms: float | None = Field(default=None, gt=0)
    tpot_budget_ms: float | None = Field(default=None, gt=0)
    tenant: str | None = None
    headers: dict[str, str] = {}


def _json(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def routes(state: AppState) -> list[Route]:
    def authorize(request: Request) -> None:
        env = state.config.admin.api_key_env
        key = os.environ.get(env) if env else None
        if not key:
            raise ApiError(403, "Admin endpoints are off: set admin.api_key_env.", type="permission_error")
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), key.encode()):
            raise ApiError(401, "A valid admin key is required.", type="authentication_error", code="invalid_api_key")

    async def reload(request: Request) -> Response:
        authorize(request)
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
        authorize(request)
        try:
            body = ExplainBody.model_validate(orjson.loads(await request.body()))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            raise bad_request(f"Invalid explain request: {exc}") from None
        features = RequestFeatures(
            model=body.model,
            prompt_tokens=body.prompt_tokens,
            max_tokens=body.max_tokens,
            ttft_budget_ms=body.ttft_budget_ms,
            latency_budget_ms=body.latency_budget_ms,
            tpot_budget_ms=body.tpot_budget_ms,
            tenant=body.tenant,
            headers=tuple((k.lower(), v) for k, v in body.headers.items()),
        )
        return _json(to_dict(choose(features, state.fleet.snapshot(), state.runtime.rules), features))

    async def fleet(request: Request) -> Response:
        authorize(request)
        doc = {
            b.name: {
                "engine": b.profile.engine,
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

    return [
        Route("/admin/reload", reload, methods=["POST"]),
        Route("/admin/route/explain", explain, methods=["POST"]),
        Route("/admin/fleet", fleet, methods=["GET"]),
    ]
