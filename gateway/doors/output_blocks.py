"""An answer's chunks as an ordered list of blocks (text, or one tool call each), opened, grown and
closed as the chunks arrive: the structure the Responses API (output items) and Anthropic's Messages
API (content blocks) both stream, so each front door only renders the three steps in its own events.

A block opens when its first piece arrives. A text block closes when another block opens; tool
calls close only at the end (in order), because an engine may interleave the argument fragments of
parallel calls, and a call announced done must hold all of its arguments.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from backends.base import Chunk


class Step(enum.Enum):
    OPEN = "open"
    GROW = "grow"
    CLOSE = "close"


@dataclass(slots=True)
class Block:
    """One text block or one tool call of the answer; ``position`` is its place in the answer."""

    position: int
    call: bool
    call_id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)
    """Text, or the call's argument fragments (JSON text)."""

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass(frozen=True, slots=True)
class Event:
    step: Step
    block: Block
    delta: str = ""


class Blocks:
    """Tracks one answer (one choice: these front doors take ``n`` 1 only)."""

    __slots__ = ("_calls", "_text", "blocks", "finish_reason", "request_id", "stop_sequence")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.blocks: list[Block] = []
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None
        """The client's stop string that ended the answer, when the pipeline knows which one did."""
        self._text: Block | None = None
        """The text block being written, if any."""
        self._calls: dict[int, Block] = {}
        """Tool calls by the engine's call index (open until the end)."""

    def _start(self, call: bool, events: list[Event]) -> Block:
        if self._text is not None:
            events.append(Event(Step.CLOSE, self._text))
            self._text = None
        block = Block(len(self.blocks), call)
        self.blocks.append(block)
        if not call:
            self._text = block
        return block

    def feed(self, chunk: Chunk) -> list[Event]:
        events: list[Event] = []
        if chunk.text:
            block = self._text
            if block is None:
                block = self._start(False, events)
                events.append(Event(Step.OPEN, block))
            block.parts.append(chunk.text)
            events.append(Event(Step.GROW, block, chunk.text))
        for piece in chunk.tool_calls:
            block = self._calls.get(piece.index)
            if block is None:
                block = self._calls[piece.index] = self._start(True, events)
                block.call_id = piece.id or f"call_{self.request_id}_{piece.index}"
                block.name = piece.name or ""
                events.append(Event(Step.OPEN, block))
            elif piece.name and not block.name:
                block.name = piece.name
            if piece.arguments:
                block.parts.append(piece.arguments)
                events.append(Event(Step.GROW, block, piece.arguments))
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
            self.stop_sequence = chunk.stop_sequence
        return events

    def finish(self) -> list[Event]:
        """Close what is still open (the stream ended), in the answer's order."""
        closing = [self._text] if self._text is not None else []
        closing += self._calls.values()
        self._text = None
        self._calls = {}
        return [Event(Step.CLOSE, b) for b in sorted(closing, key=lambda b: b.position)]

    def collect(self, chunks: list[Chunk]) -> list[Block]:
        """A whole answer's blocks."""
        for chunk in chunks:
            self.feed(chunk)
        self.finish()
        return self.blocks
