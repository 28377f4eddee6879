"""The API key routes of the admin API (``/admin/keys...``): create, list, show, update, revoke, usage.

Only when the gateway has API keys with a store (``auth:`` in its config); otherwise each answers 404
``keys_off``. Like every admin route, each needs ``AdminAuth`` (``gateway.doors.admin``).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.errors import ApiError, bad_request, clip
from gateway.state import AppState
from gateway.tenancy.gate import Tenancy
from gateway.tenancy.manage import BadKeySpec, create, revoke, summarize, update, validate
from gateway.tenancy.pricing import day_of


def _json(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status, media_type="application/json")


class _Keys:
    def __init__(self, state: AppState) -> None:
        self.state = state

    def tenancy(self, request: Request) -> Tenancy:
        if self.state.tenancy is None or self.state.tenancy.store is None:
            raise ApiError(404, "This gateway has no API keys (auth: in its config).", code="keys_off")
        return self.state.tenancy

    async def body_of(self, request: Request) -> dict[str, Any]:
        try:
            doc = orjson.loads(await request.body() or b"{}")
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"Invalid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise bad_request("The body must be a JSON object.")
        return doc

    def unknown_key(self, key_id: str) -> ApiError:
        return ApiError(404, f"No API key {clip(key_id)}.", code="key_not_found")

    async def create_key(self, request: Request) -> Response:
        t = self.tenancy(request)
        try:
            limits = validate(await self.body_of(request), t.auth.priority_classes)
        except BadKeySpec as exc:
            raise bad_request(str(exc)) from None
        assert t.store is not None
        record, token = await create(t.store, limits)
        # The only time the key is shown: the database keeps its hash.
        return _json({"key": token, **record.public()}, 201)

    async def list_keys(self, request: Request) -> Response:
        t = self.tenancy(request)
        assert t.store is not None
        records = [*t.declared.values(), *await t.store.all()]
        return _json({"object": "list", "data": [r.public() for r in records]})

    async def show_key(self, request: Request) -> Response:
        t = self.tenancy(request)
        key_id = request.path_params["key_id"]
        assert t.store is not None
        record = t.declared.get(key_id) or await t.store.get(key_id)
        if record is None:
            raise self.unknown_key(key_id)
        return _json(record.public())

    async def update_key(self, request: Request) -> Response:
        t = self.tenancy(request)
        key_id = request.path_params["key_id"]
        if key_id in t.declared:
            raise bad_request(f"Key {key_id} is declared in the config file: change it there.")
        assert t.store is not None
        try:
            record = await update(t.store, key_id, await self.body_of(request), t.auth.priority_classes)
        except BadKeySpec as exc:
            raise bad_request(str(exc)) from None
        if record is None:
            raise self.unknown_key(key_id)
        t.forget(key_id)
        return _json(record.public())

    async def revoke_key(self, request: Request) -> Response:
        t = self.tenancy(request)
        key_id = request.path_params["key_id"]
        if key_id in t.declared:
            raise bad_request(f"Key {key_id} is declared in the config file: remove it there.")
        assert t.store is not None
        record = await revoke(t.store, key_id)
        if record is None:
            raise self.unknown_key(key_id)
        t.forget(key_id)
        return _json(record.public())

    async def key_usage(self, request: Request) -> Response:
        t = self.tenancy(request)
        key_id = request.path_params["key_id"]
        assert t.store is not None
        try:
            days = int(request.query_params.get("days", "31"))
        except ValueError:
            raise bad_request("days must be an integer", param="days") from None
        if (t.declared.get(key_id) or await t.store.get(key_id)) is None:
            raise self.unknown_key(key_id)
        await t.flush()  # this replica's latest requests too
        since = day_of(time.time() - max(0, days - 1) * 86400)
        return _json({"id": key_id, "since": since, **summarize(await t.store.usage(key_id, since))})


def key_routes(state: AppState) -> list[Route]:
    keys = _Keys(state)
    return [
        Route("/admin/keys", keys.create_key, methods=["POST"]),
        Route("/admin/keys", keys.list_keys, methods=["GET"]),
        Route("/admin/keys/{key_id}", keys.show_key, methods=["GET"]),
        Route("/admin/keys/{key_id}", keys.update_key, methods=["PATCH"]),
        Route("/admin/keys/{key_id}", keys.revoke_key, methods=["DELETE"]),
        Route("/admin/keys/{key_id}/usage", keys.key_usage, methods=["GET"]),
    ]
