"""A scripted engine that declares tool calling: it answers a request that has tools with a
``get_weather`` call for Paris (streamed as OpenAI does: id and name, then argument fragments),
any other with text, so the front doors' shapes are tested against known chunk streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import ClassVar

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Health, Load, ToolCallDelta, Usage
from backends.capabilities import JSON_SCHEMA, TOOL_CHOICE_REQUIRED, TOOLS, Capabilities

WEATHER = {  # a Responses API function tool
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = [
    Chunk(tool_calls=(ToolCallDelta(0, id="call_1", name="get_weather"),)),
    Chunk(tool_calls=(ToolCallDelta(0, arguments='{"city": '),)),
    Chunk(tool_calls=(ToolCallDelta(0, arguments='"Paris"}'),)),
    Chunk(finish_reason="tool_calls", usage=Usage(12, 9)),
]
TEXT = [Chunk(text="Hello"), Chunk(text=" there"), Chunk(finish_reason="stop", usage=Usage(5, 2))]


@dataclass
class Scripted:
    """A ``get_weather`` call when the request offers tools (and does not say ``none``), else ``text``;
    ``fail_after``: an engine failure at that chunk."""

    name: str
    model: str
    text: list[Chunk] = field(default_factory=lambda: list(TEXT))
    fail_after: int | None = None
    seen: list[GenerationRequest] = field(default_factory=list)
    capabilities: ClassVar[Capabilities] = Capabilities(
        frozenset({TOOLS, TOOL_CHOICE_REQUIRED, JSON_SCHEMA}), extras=frozenset({"top_k"})
    )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.seen.append(request)
        for i, chunk in enumerate(CALL if request.tools and request.tool_choice != "none" else self.text):
            if i == self.fail_after:
                raise BackendError(ErrorKind.UPSTREAM, "engine died")
            await asyncio.sleep(0)
            yield chunk

    async def health(self) -> Health:
        return Health(ok=True)

    async def load(self) -> Load | None:
        return Load(running=0, waiting=0)

    def models(self) -> list[str]:
        return [self.model]

    async def aclose(self) -> None:
        pass
