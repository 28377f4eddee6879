"""Requests for the fleet simulator: arrival times and token counts from a trace, budgets from a mix.

Traces give when requests arrived and how many tokens went in and out; they carry no latency
budgets, so each request draws a budget class (interactive chat, agent step, batch job) from a
``BudgetMix`` with a seeded generator, which keeps every run of the same inputs identical.

Trace formats, chosen by extension and header:

- Azure LLM inference trace CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with wall-clock
  timestamps such as ``2023-11-16 18:17:03.9799600`` (seven fractional digits).
- Generic CSV: ``arrival_s,prompt_tokens,output_tokens`` (or ``timestamp`` in seconds instead of
  ``arrival_s``).
- JSONL (``.jsonl``/``.ndjson``): one object per line with the generic CSV's keys.
"""

from __future__ import annotations

import csv
import json
import math
import random
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate
from pathlib import Path

SHARE_TOLERANCE = 1e-6
"""How far a mix's shares may sum from 1 (rounding in hand-written mixes)."""

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


@dataclass(frozen=True, slots=True)
class SimRequest:
    """A request as the simulator replays it."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    klass: str
    ttft_budget_ms: float | None
    latency_budget_ms: float | None


@dataclass(frozen=True, slots=True)
class BudgetClass:
    """A kind of traffic: its share of requests and the budgets its requests state (None: no budget)."""

    name: str
    share: float
    ttft_budget_ms: float | None
    latency_budget_ms: float | None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("budget class needs a name")
        if not (math.isfinite(self.share) and 0 <= self.share <= 1):
            raise ValueError(f"budget class {self.name!r}: share {self.share} is not in [0, 1]")
        for label, budget in (("ttft", self.ttft_budget_ms), ("e2e", self.latency_budget_ms)):
            if budget is not None and not (math.isfinite(budget) and budget > 0):
                raise ValueError(f"budget class {self.name!r}: {label} budget {budget} must be a positive number")


@dataclass(frozen=True, slots=True)
class BudgetMix:
    """Budget classes whose shares sum to 1."""

    classes: tuple[BudgetClass, ...]

    def __post_init__(self) -> None:
        if not self.classes:
            raise ValueError("budget mix needs at least one class")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"budget mix repeats a class name: {', '.join(names)}")
        total = math.fsum(c.share for c in self.classes)
        if abs(total - 1) > SHARE_TOLERANCE:
            raise ValueError(f"budget mix shares sum to {total:.6g}, not 1")

    def draw(self, rng: random.Random) -> BudgetClass:
        """One class, chosen with probability equal to its share (one ``rng.random()`` call)."""
        bounds = list(accumulate(c.share for c in self.classes))
        # Clamp against rounding: a draw just below 1 must still land in the last class with a share.
        index = min(bisect_right(bounds, rng.random() * bounds[-1]), len(self.classes) - 1)
        while self.classes[index].share == 0:
            index -= 1
        return self.classes[index]


DEFAULT_MIX = BudgetMix(
    (
        BudgetClass("interactive", 0.60, ttft_budget_ms=500, latency_budget_ms=None),
        BudgetClass("agent", 0.25, ttft_budget_ms=2000, latency_budget_ms=20000),
        BudgetClass("batch", 0.15, ttft_budget_ms=None, latency_budget_ms=120000),
    )
)
"""Chat users want the first token within half a second; agent steps want the whole answer within
20 s; batch jobs only a two-minute completion."""


def parse_mix(text: str) -> BudgetMix:
    """Read a mix from a CLI string: ``name:share[:ttft=MS][:e2e=MS]`` classes separated by commas.

    Example: ``"interactive:0.6:ttft=500,agent:0.25:ttft=2000:e2e=20000,batch:0.15:e2e=120000"``.
    """
    classes: list[BudgetClass] = []
    for n, item in enumerate(text.split(","), 1):
        parts = [p.strip() for p in item.split(":")]
        if len(parts) < 2 or not parts[0]:
            raise ValueError(f"budget class {n} ({item.strip()!r}): expected name:share[:ttft=MS][:e2e=MS]")
        name, share_text, options = parts[0], parts[1], parts[2:]
        try:
            share = float(share_text)
        except ValueError:
            raise ValueError(f"budget class {name!r}: share {share_text!r} is not a number") from None
        budgets: dict[str, float] = {}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or key not in ("ttft", "e2e"):
                raise ValueError(f"budget class {name!r}: unknown option {option!r} (use ttft=MS or e2e=MS)")
            if key in budgets:
                raise ValueError(f"budget class {name!r}: {key} given twice")
            try:
                budgets[key] = float(value)
            except ValueError:
                raise ValueError(f"budget class {name!r}: {key} value {value!r} is not a number") from None
        classes.append(BudgetClass(name, share, budgets.get("ttft"), budgets.get("e2e")))
    return BudgetMix(tuple(classes))


def load_trace(path: str | Path) -> list[TraceRow]:
    """Rows of a trace file in arrival order, arrivals in seconds after the earliest request.

    Output token counts of 0 become 1 (every request yields at least one token). Raises ValueError
    naming ``FILE:LINE`` for rows that cannot be read.
    """
    path = Path(path)
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


def build_workload(
    rows: Iterable[TraceRow],
    *,
    rate_scale: float = 1.0,
    duration_s: float | None = None,
    mix: BudgetMix = DEFAULT_MIX,
    seed: int = 0,
) -> list[SimRequest]:
    """Requests to replay: arrivals divided by ``rate_scale`` (2.0 doubles the request rate), cut at
    ``duration_s`` of simulated time, each with a budget class drawn from ``mix`` (same seed, same draws).
    """
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise ValueError(f"rate_scale must be a positive number, got {rate_scale}")
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    rng = random.Random(seed)
    requests: list[SimRequest] = []
    for row in sorted(rows, key=lambda r: r.arrival_s):
        arrival = row.arrival_s / rate_scale
        if duration_s is not None and arrival >= duration_s:
            break
        klass = mix.draw(rng)
        requests.append(
            SimRequest(
                id=len(requests),
                arrival_s=arrival,
                prompt_tokens=row.prompt_tokens,
                output_tokens=row.output_tokens,
                klass=klass.name,
                ttft_budget_ms=klass.ttft_budget_ms,
                latency_budget_ms=klass.latency_budget_ms,
            )
        )
    return requests


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
