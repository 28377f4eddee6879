"""Tool calls parsed out of a model's streamed text, for engines that take raw text.

A model that was shown tools (rendered into its prompt by its chat template) answers a call in its
own text format. A parser consumes the answer's text deltas and splits them into content to send
now and ``ToolCallDelta``s as OpenAI streams them: per call a first piece with index, id and name,
then the arguments (a JSON string of the object). Formats:

- ``hermes``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, any number of calls,
  content before them kept; a call counts at its closing brace and only more calls may follow it,
  as the engines that constrain calls (llama-server, vLLM for strict tools) let a model write them
  (Hermes, Qwen2.5, the demo model).
- ``llama3_json``: the whole answer one ``{"name": ..., "parameters": {...}}`` (or several joined by
  ``;``), optionally after ``<|python_tag|>`` (Llama 3.1+).
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``, or the newer
  ``[TOOL_CALLS]name[ARGS]{...}``.

Text that may be the start of a tag is held back until it is known, tag text is never sent as
content, and call text that does not parse falls back to content (without tags). Pure: no I/O; work per ``feed``
is linear in the new text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Protocol

from backends.base import Chunk, ToolCallDelta, one_by_one
from backends.tool_parsers import HermesParser, Llama3JsonParser, MistralParser

PARSERS = ("hermes", "llama3_json", "mistral")


class ToolCallParser(Protocol):
    """One answer's text in, content and tool-call pieces out."""

    called: bool
    """A tool call was made (the answer's finish reason becomes ``tool_calls``)."""

    over: bool
    """The answer has ended: what the model writes from here on is dropped (an engine may stop)."""

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """The content that may be sent now and the tool-call pieces completed by ``text``."""
        ...

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """At the end of the answer: whatever was held back, as content or calls."""
        ...


def parser_for(name: str, seed: int | None = None) -> ToolCallParser:
    """A fresh parser for one answer; ``seed`` makes its call ids deterministic (tests, ``n`` choices)."""
    if name == "hermes":
        return HermesParser(seed)
    if name == "llama3_json":
        return Llama3JsonParser(seed)
    if name == "mistral":
        return MistralParser(seed)
    raise ValueError(f"unknown tool-call parser {name!r} (known: {', '.join(PARSERS)})")


def answer_end(name: str) -> Callable[[str], bool]:
    """For an engine that can stop generating: fed the answer's text as it comes, True once the
    answer in tool-call format ``name`` has ended (``ToolCallParser.over``); the gateway's own
    parser drops the same text, so stopping there changes nothing but the wasted tokens."""
    parser = parser_for(name)

    def ended(text: str) -> bool:
        parser.feed(text)
        return parser.over

    return ended


async def with_tool_calls(
    chunks: AsyncIterator[Chunk], parser: str, *, seed: int | None = None
) -> AsyncIterator[Chunk]:
    """A backend's chunk stream with the model's tool calls parsed out of its text (parser ``parser``,
    one per choice ``index``; ``seed`` + index seeds its call ids). Each tool-call piece is a chunk of
    its own, as OpenAI streams them; a choice that made a call ends with ``finish_reason``
    ``"tool_calls"``, its usage kept."""
    parsers: dict[int, ToolCallParser] = {}
    try:
        async for arrived in chunks:
            for chunk in one_by_one(arrived):  # the parser reads each delta as the engine sent it
                p = parsers.get(chunk.index)
                if p is None:
                    p = parsers[chunk.index] = parser_for(parser, None if seed is None else seed + chunk.index)
                text, calls = p.feed(chunk.text) if chunk.text else ("", [])
                finish = chunk.finish_reason
                if finish is not None:
                    tail, more_calls = p.finish()
                    text += tail
                    calls += more_calls
                    if p.called:
                        finish = "tool_calls"
                out: list[Chunk] = []
                if text or chunk.logprobs:
                    out.append(replace(chunk, text=text, finish_reason=None, usage=None, tool_calls=()))
                out += [Chunk(index=chunk.index, tool_calls=(d,)) for d in calls]
                if finish is not None or chunk.usage is not None:
                    stop = chunk.stop_sequence if finish == "stop" else None
                    if out:
                        out[-1] = replace(out[-1], finish_reason=finish, usage=chunk.usage, stop_sequence=stop)
                    else:
                        out.append(
                            Chunk(index=chunk.index, finish_reason=finish, usage=chunk.usage, stop_sequence=stop)
                        )
                if not out:
                    if chunk.more:
                        continue
                    out.append(Chunk(index=chunk.index))  # carries "nothing more at once" to the writer
                for piece in out[:-1]:
                    yield replace(piece, more=True)
                yield replace(out[-1], more=chunk.more)
    finally:  # closing this closes the backend's stream at once (its engine stops), not at collection
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
