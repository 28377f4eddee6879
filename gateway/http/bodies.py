"""Which request bodies the connection layer lets through to the app (``gateway.http.protocol``
refuses the others with 415 before any ASGI task exists): JSON, no body, or YAML where a route takes
a config file as it is."""

from __future__ import annotations

_YAML_ROUTES = frozenset((b"/admin/config/diff",))
"""Routes whose body may be YAML: a config's what-if diff takes the file as it is."""
_YAML_TYPES = frozenset((b"application/yaml", b"application/x-yaml", b"text/yaml", b"text/x-yaml"))


def yaml_post(url: bytes, ctype: bytes | None) -> bool:
    """A YAML body (a config sent as the file it is) to a route that takes one."""
    if url.partition(b"?")[0] not in _YAML_ROUTES or ctype is None:
        return False
    return ctype.partition(b";")[0].strip().lower() in _YAML_TYPES


def json_post(ctype: bytes | None, headers: list[tuple[bytes, bytes]]) -> bool:
    """A POST is JSON (``application/json`` with any parameters) or has no body at all."""
    if ctype is not None:
        return ctype.partition(b";")[0].strip().lower() == b"application/json"
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return False
    return True
