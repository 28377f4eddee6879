"""Server-sent events as engines actually write them.

Tolerates what real engines send: ``data:`` with or without the space (TGI
writes none), comment pings (``:``), a non-standard ``error:`` field (older
llama-server), a missing blank line before the connection closes, and ``\\r\\n``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    data: str
    field: str = "data"
    """``data`` normally; ``error`` when the engine used a non-standard ``error:`` field."""


async def iter_events(lines: AsyncIterator[str]) -> AsyncIterator[Event]:
    data: list[str] = []
    field = "data"
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield Event("\n".join(data), field)
            data, field = [], "data"
            continue
        if line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if not sep:
            continue
        if value.startswith(" "):
            value = value[1:]
        if name in ("data", "error"):
            if name == "error":
                field = "error"
            data.append(value)
    if data:
        yield Event("\n".join(data), field)
