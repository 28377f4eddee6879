"""What the response cache keys and keeps: pure functions, no I/O.

A request is cacheable when its answer is deterministic (``temperature`` 0, or a fixed ``seed``) and
it offers no tools (unless ``cache.cache_tools``). Its key is the SHA-256 of everything in the
gateway's neutral ``GenerationRequest`` that changes the answer (the model, messages or prompt, every
sampling parameter, tools, response format, ``n``...; not the request id, how the answer travels (the
stream flag, whether the engine is asked for it whole) or OpenAI's ``user``), the model's version and
the caller's scope. The entry is the answer's chunks, the same neutral form every front door renders
(a hit through another door renders in that door's shapes), kept only when every choice finished
normally.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

import orjson

from backends.base import Chunk, GenerationRequest, TokenLogprob, ToolCallDelta, TopLogprob, Usage
from gateway.config import CacheConfig, ModelConfig

KEPT_FINISHES = frozenset({"stop", "length", "tool_calls"})
"""Answers that ended one of these ways are stored: not an error, a cut stream or ``content_filter``."""

_NOT_THE_ANSWER = frozenset({"request_id", "stream", "whole", "clock", "user"})
_FIELDS = tuple(f.name for f in dataclasses.fields(GenerationRequest) if f.name not in _NOT_THE_ANSWER)
_KEY_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def bypass(gen: GenerationRequest, config: CacheConfig) -> str | None:
    """Why the request is not served from the cache (``sampled``, ``tools``, ``model``), or None."""
    if gen.temperature != 0.0 and gen.seed is None:
        return "sampled"
    if gen.tools and not config.cache_tools:
        return "tools"
    if config.models and not any(fnmatchcase(gen.model, pattern) for pattern in config.models):
        return "model"
    return None


def model_version(model: ModelConfig, version: str) -> str:
    """A model's version in the keys: its whole entry (files, template, parser...) and ``cache.version``."""
    entry = orjson.dumps(model.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(entry + b"\0" + version.encode()).hexdigest()[:16]


def scope_of(scope: str, key_id: str | None, team: str | None) -> str:
    """Who may read the answer: a key, a team (a key without a team: that key), or everyone."""
    if key_id is None:
        return "anonymous"
    if scope == "global":
        return "global"
    if scope == "team" and team:
        return f"team:{team}"
    return f"key:{key_id}"


def key_of(gen: GenerationRequest, scope: str, version: str) -> str:
    """The SHA-256 of the normalised request, its model's version and its scope."""
    request = {name: getattr(gen, name) for name in _FIELDS}
    return hashlib.sha256(orjson.dumps([scope, version, request], option=_KEY_OPTIONS)).hexdigest()


def finished(chunks: Sequence[Chunk], n: int) -> bool:
    """Every one of the ``n`` choices ended, each in a way worth serving again."""
    ends = {c.index: c.finish_reason for c in chunks if c.finish_reason is not None}
    return len(ends) == n and all(reason in KEPT_FINISHES for reason in ends.values())


def encode(chunks: Sequence[Chunk]) -> bytes:
    return orjson.dumps(chunks)


def decode(blob: bytes) -> list[Chunk]:
    """The stored chunks; those replayed together go out in one write (``more``)."""
    rows: list[dict[str, Any]] = orjson.loads(blob)
    last = len(rows) - 1
    return [_chunk(row, i < last) for i, row in enumerate(rows)]


def _chunk(row: dict[str, Any], more: bool) -> Chunk:
    usage = row["usage"]
    return Chunk(
        text=row["text"],
        finish_reason=row["finish_reason"],
        usage=Usage(**usage) if usage is not None else None,
        more=more,
        index=row["index"],
        tool_calls=tuple(ToolCallDelta(**t) for t in row["tool_calls"]),
        logprobs=tuple(_logprob(p) for p in row["logprobs"]),
        stop_sequence=row["stop_sequence"],
        pieces=tuple(row.get("pieces") or ()),  # entries stored before pieces existed have none
    )


def _logprob(row: dict[str, Any]) -> TokenLogprob:
    top = tuple(TopLogprob(t["token"], t["logprob"], _bytes(t["bytes"])) for t in row["top"])
    return TokenLogprob(row["token"], row["logprob"], _bytes(row["bytes"]), top)


def _bytes(value: list[int] | None) -> tuple[int, ...] | None:
    return tuple(value) if value is not None else None
