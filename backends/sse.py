"""Server-sent events as engines actually write them.

Tolerates what real engines send: ``data:`` with or without the space (TGI
writes none), comment pings (``:``), a non-standard ``error:`` field (older
llama-server), a missing blank line before the connection closes, and ``\\r\\n``.
Works on raw byte chunks as they arrive, so a burst of events costs one read,
not one await per line.
"""

from __future__ import annotations


class Event:
    """One event's data (its ``data:`` lines joined) and field. A plain class with its own equality
    rather than a ``@value`` record: one is made per streamed event, and a dataclass's generated
    ``__init__`` stays interpreted in the compiled module."""

    __slots__ = ("data", "field")

    def __init__(self, data: str, field: str = "data") -> None:
        self.data = data
        self.field = field
        """``data`` normally; ``error`` when the engine used a non-standard ``error:`` field."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Event) and self.data == other.data and self.field == other.field

    def __hash__(self) -> int:
        return hash((self.data, self.field))

    def __repr__(self) -> str:
        return f"Event({self.data!r}, {self.field!r})"


def lone_data(line: bytes) -> bool:
    """``line`` (without its ``\\n``), followed by a blank line, is an event of one ``data: `` line: what
    most engines write for every event, read without the parser (``EventBatches._scan``)."""
    return line.startswith(b"data: ") and not line.endswith(b"\r")


class EventParser:
    """Feed bytes, get the events they complete."""

    def __init__(self) -> None:
        self._partial = b""
        self._data: list[bytes] = []
        self._field = "data"

    def feed(self, chunk: bytes) -> list[Event]:
        # Called for every read of every stream: bytes are only decoded once per event, and the
        # usual line (``data: ...``) takes the first branch.
        lines = (self._partial + chunk if self._partial else chunk).split(b"\n")
        self._partial = lines.pop()
        events: list[Event] = []
        for raw in lines:
            if raw[-1:] == b"\r":
                raw = raw[:-1]
            if raw[:5] == b"data:":
                self._data.append(raw[6:] if raw[5:6] == b" " else raw[5:])
            elif not raw:
                if self._data:
                    events.append(self._event())
                self._field = "data"
            elif raw[:6] == b"error:":
                self._field = "error"
                self._data.append(raw[7:] if raw[6:7] == b" " else raw[6:])
            # anything else: a comment (``:``) or a field this reader does not use
        return events

    def idle(self) -> bool:
        """Between events: no part of a line or an event is held, the next line starts afresh."""
        return not self._partial and not self._data and self._field == "data"

    def close(self) -> list[Event]:
        """The stream ended: what is left, even without its blank line."""
        events = self.feed(b"\n") if self._partial else []
        if self._data:
            events.append(self._event())
        return events

    def _event(self) -> Event:
        event = Event(b"\n".join(self._data).decode("utf-8", "replace"), self._field)
        self._data = []
        return event
