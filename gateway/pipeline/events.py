"""A streamed answer's events as its chunks come, in the front door's shapes: from an engine
(``serve._stream``) or from the response cache (``cached.replay``)."""

from __future__ import annotations

from collections.abc import Callable

from backends.base import Chunk, Usage
from gateway.http.errors import ApiError
from gateway.pipeline.surfaces import Answer, UsageTotal


class Events:
    """The events of chunks that arrived together go out in one write. ``keep``: the chunks are kept
    too (``kept``), for the response cache."""

    __slots__ = ("_answer", "_held", "_total", "kept", "text_events", "usage")

    def __init__(self, answer: Answer, keep: bool = False) -> None:
        self._answer = answer
        self._held = answer.opening()
        self._total = UsageTotal()
        self.usage: Usage | None = None
        self.kept: list[Chunk] | None = [] if keep else None
        self.text_events: Callable[[list[str]], bytes] | None = None if keep else answer.text_events()
        """Where the surface writes deltas of text alone of choice 0 from their texts (``texts``)."""

    def add(self, chunk: Chunk) -> bytes | None:
        """The bytes to write now, if any."""
        if self.kept is not None:
            self.kept.append(chunk)
        if chunk.usage is not None:
            self._total.add(chunk)
            self.usage = self._total.usage
        data = self._answer.chunk(chunk)
        if data is not None:
            self._held.append(data)
        if self._held and not chunk.more:
            out = b"".join(self._held)
            self._held = []
            return out
        return None

    def texts(self, texts: list[str]) -> bytes:
        """The bytes to write now for deltas of text alone of choice 0 (``text_events`` is set): what
        ``add`` writes for the chunk of them, without the chunk."""
        writer = self.text_events
        if writer is None:
            raise RuntimeError("the surface writes no text events")
        data = writer(texts)
        held = self._held
        if held:
            held.append(data)
            data = b"".join(held)
            self._held = []
        return data

    def closing(self) -> bytes:
        return b"".join(self._held) + self._answer.closing(self.usage)

    def failed(self, error: ApiError) -> bytes:
        """What arrived before the failure, then why."""
        return b"".join(self._held) + self._answer.failure(error)
