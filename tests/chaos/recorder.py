"""The chaos suite's outermost layer around a contract fake: it draws faults and records what the engine saw.

``Recorder`` sits in front of a fake's app (already behind ``control.with_faults``) and, per POST (every
POST to a fake is a generation):

- draws a fault from a seeded generator for requests carrying a chaos marker in their body (recovery
  probes carry none, so a probe never fails by injection) and hands it to the generic fault layer
  through ``FakeControl.fail_next``, synchronously, right before the inner app reads it, so concurrent
  requests cannot take each other's fault;
- appends one JSON line when the POST arrives and one when its response ends to a file that survives
  the process being killed: which request (``X-Request-Id`` and the body's marker), which fault, when;
- counts response bodies still open.

It also serves the driver under ``/_chaos/``: ``GET /_chaos/state`` (open streams) and ``POST
/_chaos/knobs`` (``healthy``, ``delay_s``, ``token_delay_s``, and ``burst``: a fault for every POST,
probes included, until cleared), answered even while the fake plays unhealthy.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.contract.control import FakeControl

MARKER = re.compile(rb"chaos-\d+-\d+")
"""The request id the driver writes into each prompt (``chaos-<seed>-<n>``)."""
KNOBS = ("healthy", "delay_s", "token_delay_s")


class Recorder:
    def __init__(
        self,
        app: ASGIApp,
        control: FakeControl,
        records: Path,
        rng: random.Random,
        fault_rate: float,
        faults: Sequence[tuple[str, float]],
    ) -> None:
        self.app, self.control, self.rng, self.fault_rate = app, control, rng, fault_rate
        self.names = [name for name, _ in faults]
        self.weights = [weight for _, weight in faults]
        self.open: dict[int, dict[str, Any]] = {}
        self.posts = 0
        self.burst: str | None = None
        self._out: IO[str] = records.open("a", buffering=1)  # line-buffered: each record reaches the kernel whole

    def _write(self, doc: dict[str, Any]) -> None:
        self._out.write(json.dumps(doc, separators=(",", ":")) + "\n")

    def _draw(self) -> str | None:
        if self.rng.random() >= self.fault_rate:
            return None
        return self.rng.choices(self.names, self.weights)[0]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"].startswith("/_chaos/"):
            await self._serve_control(scope, receive, send)
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        marker = MARKER.search(body)
        header = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        fault = self.burst or (self._draw() if marker else None)
        self.posts += 1
        n = self.posts
        rec = {"n": n, "ev": "start", "t": time.monotonic(), "path": scope["path"], "header": header}
        rec |= {"marker": marker.group().decode() if marker else "", "fault": fault}
        self._write(rec)
        self.open[n] = rec
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        # Taken by with_faults before its first await: no other request can run in between.
        self.control.fail_next = fault
        try:
            await self.app(scope, replay, send)
        finally:
            if self.control.fail_next == fault:
                self.control.fail_next = None  # not taken (a layer that ignores it): never leak onto another
            del self.open[n]
            self._write({"n": n, "ev": "end", "t": time.monotonic()})

    async def _serve_control(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "POST" and scope["path"] == "/_chaos/knobs":
            knobs = json.loads(await _read_body(receive) or b"{}")
            for key in KNOBS:
                if key in knobs:
                    setattr(self.control, key, knobs[key])
            if "burst" in knobs:
                self.burst = knobs["burst"]
        state = {"open": len(self.open), "posts": self.posts, "open_markers": [r["marker"] for r in self.open.values()]}
        state |= {key: getattr(self.control, key) for key in KNOBS} | {"burst": self.burst}
        payload = json.dumps(state).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


async def _read_body(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)
