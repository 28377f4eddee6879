"""The operator's console at ``/console``: one page of HTML, CSS and JavaScript shipped in this package
(``static/``), no build step and nothing fetched from elsewhere, that reads the admin API with the
admin key.

It is there only while an admin key is configured (``admin.api_key_env`` names a variable holding
one), and only on the admin port when ``admin.port`` is set; otherwise ``/console`` is an unknown
route (404), as on a gateway without it. The page itself holds no data: a browser cannot send
``Authorization`` on a navigation, so it opens with a sign-in form, keeps the key in the tab's
``sessionStorage`` (never in a URL or a cookie) and sends it as ``Authorization: Bearer`` on every
admin call, which the admin API checks (lockout included) as for any client. A strict Content
Security Policy lets the page run only its own script and talk only to its own origin.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.doors.admin import AdminAuth
from gateway.http.errors import ApiError, clip

_FILES = {
    "": ("index.html", "text/html; charset=utf-8"),
    "console.js": ("console.js", "text/javascript; charset=utf-8"),
    "console.css": ("console.css", "text/css; charset=utf-8"),
    "favicon.svg": ("favicon.svg", "image/svg+xml"),
}
"""What the console serves: ``/console`` and ``/console/<name>``, nothing else from the folder."""

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
"""The page's own script, style and icon, calls to its own origin only; no inline code, no framing,
and no form that submits anywhere (the sign-in form is read by the script, so a key can never leave
in a query string even with the script gone)."""

HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "cache-control": "no-store",
}


def _load() -> dict[str, tuple[bytes, str]]:
    """The files, read once when the app is built (a few kilobytes; never on a request)."""
    folder = resources.files(__name__).joinpath("static")
    return {path: (folder.joinpath(name).read_bytes(), media) for path, (name, media) in _FILES.items()}


def routes(auth: AdminAuth) -> list[Route]:
    """``/console`` and its files, kept out of the OpenAPI document (they are not API)."""
    files = _load()

    async def page(request: Request) -> Response:
        name = request.path_params.get("name", "")
        found = files.get(name)
        if found is None or not auth.key_set() or not auth.on_admin_port(request):
            raise ApiError(404, f"Unknown route: {clip(request.method)} {clip(request.url.path)}", code="unknown_url")
        body, media = found
        return Response(body, media_type=media, headers=HEADERS)

    return [
        Route("/console", page, methods=["GET"], include_in_schema=False),
        Route("/console/{name}", page, methods=["GET"], include_in_schema=False),
    ]
