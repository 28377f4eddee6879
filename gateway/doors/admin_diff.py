"""``POST /admin/config/diff``: what a config would change against the live one, before a reload.

The body is the new config's YAML (``content-type: application/yaml``) or JSON ``{"yaml": "...",
"rates": [requests/s...], "loads": [multiples of the recent rate...]}``. The answer is
``{"diff": [...], "summary": {...}, "moves": {...}, "table": [...]}`` (gateway/whatif), over the
newest routed requests this gateway kept (``gateway.whatif.records.RECENT_REQUESTS``). The
simulation runs in a worker thread, one at a time, within ``DEADLINE_S``: the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.config import ConfigError
from gateway.http.errors import ApiError, bad_request
from gateway.state import AppState
from gateway.whatif.fleets import from_text
from gateway.whatif.replay import DEFAULT_SCALES
from gateway.whatif.report import what_if

MAX_CONFIG_BYTES = 1 << 20
"""A config is a few kilobytes; a megabyte is not one."""
DEADLINE_S = 20.0
"""Wall-clock seconds the simulation may take: rates not reached by then are left out of the table."""
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain")


def _numbers(value: Any, name: str) -> list[float] | None:
    if value is None:
        return None
    ok = isinstance(value, list) and 0 < len(value) <= 8
    if not ok or not all(isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 1e6 for v in value):
        raise bad_request(f"`{name}` must be a list of 1 to 8 positive numbers.", name)
    return [float(v) for v in value]


def _body(raw: bytes, content_type: str) -> tuple[str, list[float] | None, list[float] | None]:
    """(the YAML text, rates, loads) from either form of the body."""
    if content_type.split(";")[0].strip().lower() in YAML_TYPES:
        try:
            return raw.decode("utf-8"), None, None
        except UnicodeDecodeError:
            raise bad_request("The config is not UTF-8 text.") from None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad_request('Send the config as application/yaml, or JSON {"yaml": "..."}.') from None
    if not isinstance(doc, dict) or not isinstance(doc.get("yaml"), str):
        raise bad_request("The JSON body needs `yaml`, the config's text.", "yaml")
    unknown = sorted(set(doc) - {"yaml", "rates", "loads"})
    if unknown:
        raise bad_request(f"Unknown field `{unknown[0]}` (known: yaml, rates, loads).", unknown[0])
    return doc["yaml"], _numbers(doc.get("rates"), "rates"), _numbers(doc.get("loads"), "loads")


class ConfigDiff:
    def __init__(self, state: AppState) -> None:
        self.state = state
        self._running = asyncio.Lock()

    async def __call__(self, request: Request) -> Response:
        raw = await request.body()
        if len(raw) > MAX_CONFIG_BYTES:
            raise ApiError(413, f"A config of at most {MAX_CONFIG_BYTES} bytes.", code="config_too_large")
        text, rates, loads = _body(raw, request.headers.get("content-type", ""))
        live = self.state.runtime.loaded
        try:
            new = from_text(text, "new config", live)
        except ConfigError as exc:
            error = bad_request(f"The new config is invalid: {exc.problems[0]}", code="invalid_config")
            return Response(
                orjson.dumps({**error.body(), "problems": exc.problems}), 400, media_type="application/json"
            )
        if self._running.locked():
            raise ApiError(429, "A config diff is already running: try again when it ends.", code="diff_busy",
                           type="rate_limit_error", retry_after=DEADLINE_S)  # fmt: skip
        recent = list(self.state.recent or ())
        async with self._running:
            doc = await asyncio.to_thread(what_if, live, new, recent, rates, loads or DEFAULT_SCALES, DEADLINE_S)
        doc["replayed"] = len(recent)
        return Response(orjson.dumps(doc), media_type="application/json")
