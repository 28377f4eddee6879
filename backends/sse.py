"""Server-sent events as engines actually write them.

Tolerates what real engines send: ``data:`` with or without the space (TGI
writes none), comment pings (``:``), a non-standard ``error:`` field (older
llama-server), a missing blank line before the connection closes, and ``\\r\\n``.
Works on raw byte chunks as they arrive, so a burst of events costs one read,
not one await per line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    data: str
    field: str = "data"
    """``data`` normally; ``error`` when the engine used a non-standard ``error:`` field."""


class EventParser:
    """Feed bytes, get the events they complete."""

    def __init__(self) -> None:
        self._partial = b""
        self._data: list[str] = []
        self._field = "data"

    def feed(self, chunk: bytes) -> Iterator[Event]:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            event = self._line(raw.rstrip(b"\r").decode("utf-8", "replace"))
            if event is not None:
                yield event

    def close(self) -> Iterator[Event]:
        """The stream ended: what is left, even without its blank line."""
        if self._partial:
            event = self._line(self._partial.rstrip(b"\r").decode("utf-8", "replace"))
            self._partial = b""
            if event is not None:
                yield event
        if self._data:
            yield Event("\n".join(self._data), self._field)
            self._data = []

    def _line(self, line: str) -> Event | None:
        if not line:
            event = Event("\n".join(self._data), self._field) if self._data else None
            self._data, self._field = [], "data"
            return event
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if not sep or name not in ("data", "error"):
            return None
        if name == "error":
            self._field = "error"
        self._data.append(value[1:] if value.startswith(" ") else value)
        return None
