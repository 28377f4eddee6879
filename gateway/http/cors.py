"""CORS for browser clients, off unless ``server.cors_origins`` names some.

With no origins configured the gateway sends no CORS headers and a preflight gets the usual 405,
so a page elsewhere can read nothing; together with JSON-only POST bodies (a cross-site form cannot
send one without a preflight) and the Host allow-list, a gateway on localhost is out of a web
page's reach unless the operator opens it.
"""

from __future__ import annotations

from starlette.types import Message, Scope, Send

_ALLOW_HEADERS = b"authorization, content-type, x-request-id, x-priority, x-tenant, x-ttft-budget-ms, " + (
    b"x-latency-budget-ms, x-slo-ttft-ms, x-slo-tpot-ms, openai-organization, openai-project"
)
_EXPOSE = (
    b"x-request-id, x-client-request-id, x-enginegate-backend, x-enginegate-route, x-enginegate-overhead-ms, "
    b"x-enginegate-cache, retry-after"
)


class Cors:
    def __init__(self, origins: list[str]) -> None:
        self.any = "*" in origins
        self.origins = frozenset(o.rstrip("/").encode() for o in origins)

    def origin(self, scope: Scope) -> bytes | None:
        """The request's ``Origin`` when it is allowed."""
        for name, value in scope["headers"]:
            if name == b"origin":
                return value if self.any or value in self.origins else None
        return None

    async def preflight(self, origin: bytes, send: Send) -> None:
        headers = [
            (b"access-control-allow-origin", origin),
            (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
            (b"access-control-allow-headers", _ALLOW_HEADERS),
            (b"access-control-max-age", b"600"),
            (b"vary", b"origin"),
            (b"content-length", b"0"),
        ]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    def wrap(self, origin: bytes, send: Send) -> Send:
        """``send`` adding the CORS headers of an allowed origin to the response."""
        extra = [
            (b"access-control-allow-origin", origin),
            (b"access-control-expose-headers", _EXPOSE),
            (b"vary", b"origin"),
        ]

        async def send_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        return send_cors


def is_preflight(scope: Scope) -> bool:
    return scope["method"] == "OPTIONS" and any(n == b"access-control-request-method" for n, _ in scope["headers"])
