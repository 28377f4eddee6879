"""Trace files for the fleet simulator: when requests arrived and how many tokens went in and out.

Formats, chosen by extension and header:

- Azure LLM inference trace CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with wall-clock
  timestamps such as ``2023-11-16 18:17:03.9799600`` (seven fractional digits).
- Generic CSV: ``arrival_s,prompt_tokens,output_tokens`` (or ``timestamp`` in seconds instead of
  ``arrival_s``).
- JSONL (``.jsonl``/``.ndjson``): one object per line with the generic CSV's keys.
- Mooncake (FAST'25) JSONL: ``timestamp`` (milliseconds), ``input_length``, ``output_length`` and
  ``hash_ids``, the prompt's 512-token blocks (a block's id stands for the whole prefix up to it).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

_AZURE_COLUMNS = ("timestamp", "contexttokens", "generatedtokens")
_TIME_KEYS = ("arrival_s", "timestamp")
_JSONL_SUFFIXES = (".jsonl", ".ndjson")
_Raw = tuple[tuple[int, float], int, int]
"""A row as read: (whole seconds, fraction), prompt tokens, output tokens."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One traced request: seconds after the trace's first request, and its token counts."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()
    """Ids of the prompt's leading blocks of ``block_tokens`` tokens (chained: an id names its prefix)."""
    block_tokens: int = 0
    preamble_blocks: int = 0
    """Leading blocks many requests share (a system prompt)."""
    key: int = 0
    """What names the conversation (its opening), for rendezvous hashing."""


def load_trace(path: str | Path) -> list[TraceRow]:
    """Rows of a trace file in arrival order, arrivals in seconds after the earliest request.

    Output token counts of 0 become 1 (every request yields at least one token). Raises ValueError
    naming ``FILE:LINE`` for rows that cannot be read.
    """
    path = Path(path)
    if _is_mooncake(path):
        return load_mooncake(path)
    with path.open(encoding="utf-8-sig", newline="") as f:
        raw = list(_jsonl_rows(path, f) if _is_jsonl(path) else _csv_rows(path, f))
    if not raw:
        raise ValueError(f"{path}: no requests")
    # Merged traces are not always sorted; a stable sort keeps the file order of simultaneous arrivals.
    raw.sort(key=lambda r: r[0])
    (start, start_fraction), _, _ = raw[0]
    return [TraceRow((s - start) + (f - start_fraction), p, o) for (s, f), p, o in raw]


def mean_rate(rows: Sequence[TraceRow]) -> float:
    """Requests per second between the first and last arrival."""
    if len(rows) < 2:
        raise ValueError("mean rate needs at least two requests")
    span = max(r.arrival_s for r in rows) - min(r.arrival_s for r in rows)
    if span <= 0:
        raise ValueError("mean rate needs requests at more than one instant")
    return (len(rows) - 1) / span


def parse_timestamp(text: str) -> tuple[int, float]:
    """Whole seconds and their fraction, from a number of seconds or a wall-clock
    ``YYYY-MM-DD HH:MM:SS[.fraction]`` (no zone; whole seconds then count from 0001-01-01).

    The fraction may have any number of digits (the Azure traces have seven, which
    ``datetime.strptime``'s ``%f`` rejects). Kept apart from the whole seconds because a float
    of ~6e10 seconds since year 1 resolves only ~10 µs.
    """
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError(f"timestamp {text!r} is not finite")
        whole = math.floor(value)
        return whole, value - whole
    head, _, fraction = text.partition(".")
    if fraction and not fraction.isdigit():
        raise ValueError(f"timestamp {text!r}: bad fractional seconds")
    try:
        moment = datetime.fromisoformat(head)
    except ValueError:
        raise ValueError(f"timestamp {text!r} is neither seconds nor YYYY-MM-DD HH:MM:SS[.fff]") from None
    if moment.tzinfo is not None or moment.microsecond:
        raise ValueError(f"timestamp {text!r}: expected YYYY-MM-DD HH:MM:SS[.fff] without a time zone")
    seconds = moment.toordinal() * 86400 + moment.hour * 3600 + moment.minute * 60 + moment.second
    return seconds, float("0." + fraction) if fraction else 0.0


def _count(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a token count")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        value = value.strip()
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{what} {value!r} is not an integer") from None
    if not isinstance(value, int):
        raise ValueError(f"{what} {value!r} is not an integer")
    if value < 0:
        raise ValueError(f"{what} {value} is negative")
    return value


def _row(time_value: object, prompt: object, output: object) -> _Raw:
    if isinstance(time_value, bool) or not isinstance(time_value, (str, int, float)):
        raise ValueError(f"timestamp {time_value!r} is not a time")
    arrival = parse_timestamp(str(time_value))
    return arrival, _count(prompt, "prompt tokens"), max(1, _count(output, "output tokens"))


def _is_jsonl(path: Path) -> bool:
    suffix = path.suffix.lower()
    if suffix in _JSONL_SUFFIXES or suffix == ".csv":
        return suffix != ".csv"
    # Other extensions: JSONL starts with an object, a CSV with its header.
    with path.open(encoding="utf-8-sig") as f:
        return next((line for line in f if line.strip()), "").lstrip().startswith("{")


def _columns(path: Path, header: list[str]) -> tuple[int, int, int]:
    names = [h.strip().lower() for h in header]
    if all(c in names for c in _AZURE_COLUMNS):
        return tuple(names.index(c) for c in _AZURE_COLUMNS)  # type: ignore[return-value]
    time_key = next((k for k in _TIME_KEYS if k in names), None)
    if time_key is None or "prompt_tokens" not in names or "output_tokens" not in names:
        raise ValueError(
            f"{path}:1: header {','.join(header)!r} is neither TIMESTAMP,ContextTokens,GeneratedTokens "
            "nor arrival_s (or timestamp),prompt_tokens,output_tokens"
        )
    return names.index(time_key), names.index("prompt_tokens"), names.index("output_tokens")


def _csv_rows(path: Path, lines: Iterable[str]) -> Iterator[_Raw]:
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        return
    t_col, p_col, o_col = _columns(path, header)
    width = max(t_col, p_col, o_col) + 1
    for record in reader:
        if not record or all(not field.strip() for field in record):
            continue
        try:
            if len(record) < width:
                raise ValueError(f"expected {len(header)} fields, got {len(record)}")
            yield _row(record[t_col], record[p_col], record[o_col])
        except ValueError as e:
            raise ValueError(f"{path}:{reader.line_num}: {e}") from None


def _jsonl_rows(path: Path, lines: Iterable[str]) -> Iterator[_Raw]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("expected a JSON object")
            time_key = next((k for k in _TIME_KEYS if k in obj), None)
            missing = [k for k in ("prompt_tokens", "output_tokens") if k not in obj]
            if time_key is None or missing:
                raise ValueError("needs arrival_s (or timestamp), prompt_tokens and output_tokens")
            yield _row(obj[time_key], obj["prompt_tokens"], obj["output_tokens"])
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"{path}:{number}: {e}") from None


MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in Mooncake's traces."""


def _is_mooncake(path: Path) -> bool:
    if not _is_jsonl(path):
        return False
    with path.open(encoding="utf-8-sig") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        obj = json.loads(first)
    except ValueError:
        return False
    return isinstance(obj, dict) and "hash_ids" in obj and "input_length" in obj


def load_mooncake(path: str | Path) -> list[TraceRow]:
    """Mooncake's JSONL: ``timestamp`` in milliseconds, ``input_length``, ``output_length`` and
    ``hash_ids`` (the prompt's 512-token blocks). The first block is taken as the shared preamble
    and names the request's group for rendezvous hashing (Mooncake's ids carry no roles)."""
    path = Path(path)
    rows: list[TraceRow] = []
    with path.open(encoding="utf-8-sig") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                ids = obj["hash_ids"]
                if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                    raise ValueError("hash_ids must be a list of integers")
                stamp = obj["timestamp"]
                if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
                    raise ValueError(f"timestamp {stamp!r} is not a number of milliseconds")
                prompt = _count(obj["input_length"], "input_length")
                output = max(1, _count(obj["output_length"], "output_length"))
            except KeyError as e:
                raise ValueError(f"{path}:{number}: missing {e.args[0]}") from None
            except ValueError as e:
                raise ValueError(f"{path}:{number}: {e}") from None
            full = tuple(ids[: prompt // MOONCAKE_BLOCK_TOKENS])  # a partial last block is never cached
            rows.append(
                TraceRow(
                    stamp / 1000, prompt, output, full, MOONCAKE_BLOCK_TOKENS, min(1, len(full)), ids[0] if ids else 0
                )
            )
    if not rows:
        raise ValueError(f"{path}: no requests")
    rows.sort(key=lambda r: r.arrival_s)
    start = rows[0].arrival_s
    return [replace(r, arrival_s=r.arrival_s - start) for r in rows]
