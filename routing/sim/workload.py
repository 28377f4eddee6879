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
- Mooncake (FAST'25) JSONL: ``timestamp`` (milliseconds), ``input_length``, ``output_length`` and
  ``hash_ids``, the prompt's 512-token blocks (a block's id stands for the whole prefix up to it).

Requests may carry prompt blocks (``SimRequest.blocks``): the simulated engines keep them in a
prefix cache and skip the cached ones at prefill. Mooncake's trace has them; ``chat_sessions``
makes a multi-turn chat workload with shared system prompts on a trace's arrivals.
"""

from __future__ import annotations

import csv
import json
import math
import random
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
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
    blocks: tuple[int, ...] = ()
    """Ids of the prompt's leading blocks of ``block_tokens`` tokens (chained: an id names its prefix)."""
    block_tokens: int = 0
    preamble_blocks: int = 0
    """Leading blocks many requests share (a system prompt)."""
    key: int = 0
    """What names the conversation (its opening), for rendezvous hashing."""


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
    blocks: tuple[int, ...] = ()
    block_tokens: int = 0
    preamble_blocks: int = 0
    key: int = 0


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
                blocks=row.blocks,
                block_tokens=row.block_tokens,
                preamble_blocks=row.preamble_blocks,
                key=row.key if row.blocks else len(requests),
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


@dataclass(frozen=True, slots=True)
class ChatShape:
    """How ``chat_sessions`` turns a trace's arrivals into conversations."""

    systems: int = 8
    """Distinct system prompts (apps), chosen with Zipf-like popularity (the first is the most used)."""
    system_tokens: tuple[int, int] = (400, 2000)
    new_share: float = 0.3
    """Share of arrivals that open a conversation; the others are a waiting conversation's next turn."""
    think_s: tuple[float, float] = (5.0, 300.0)
    """A conversation takes its next turn this long after its last one at the soonest and latest."""
    turn_share: float = 0.25
    """A follow-up message is this share of the traced prompt's tokens (the history makes the rest)."""
    max_context: int = 16000
    block_tokens: int = 64


def chat_sessions(rows: Sequence[TraceRow], shape: ChatShape = ChatShape(), seed: int = 0) -> list[TraceRow]:
    """Multi-turn conversations with shared system prompts on the arrivals of ``rows``.

    Each arrival either opens a conversation (a system prompt, then a first message making up the
    traced prompt length) or is the next turn of a conversation idle for ``think_s`` (its prompt: the
    last prompt, the answer it got, and a new message). Output lengths are the trace's. Blocks are
    ``block_tokens`` long; the engines cache prompts (not answers), so a turn reuses at most the
    previous prompt.
    """
    rng = random.Random(seed ^ 0xC4A7)
    bt = shape.block_tokens
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    low, high = shape.system_tokens
    system_len = [rng.randint(low, high) // bt * bt for _ in range(shape.systems)]
    system_ids = [fresh(n // bt) for n in system_len]
    popularity = [1 / (k + 1) for k in range(shape.systems)]
    # (last arrival, prompt tokens, last output, block ids, system, conversation key)
    open_: list[tuple[float, int, int, list[int], int, int]] = []
    conversations = 0
    out: list[TraceRow] = []
    for row in sorted(rows, key=lambda r: r.arrival_s):
        now = row.arrival_s
        open_ = [c for c in open_ if now - c[0] <= shape.think_s[1]]
        ready = [i for i, c in enumerate(open_) if now - c[0] >= shape.think_s[0]]
        turn = None
        if ready and rng.random() >= shape.new_share:
            i = rng.choice(ready)
            _, tokens, answer, ids, system, key = open_[i]
            grown = tokens + answer + max(16, int(row.prompt_tokens * shape.turn_share))
            if grown <= shape.max_context:
                turn = (grown, ids, system, key)
                open_.pop(i)
        if turn is None:
            system = rng.choices(range(shape.systems), popularity)[0]
            tokens = min(shape.max_context, system_len[system] + max(16, row.prompt_tokens - system_len[system]))
            conversations += 1
            turn = (tokens, list(system_ids[system]), system, conversations)
        tokens, ids, system, key = turn
        ids = ids + fresh(tokens // bt - len(ids))
        out.append(TraceRow(now, tokens, row.output_tokens, tuple(ids), bt, system_len[system] // bt, key))
        open_.append((now, tokens, row.output_tokens, ids, system, key))
    return out


def ideal_reuse(rows: Sequence[TraceRow]) -> float:
    """Share of prompt tokens in blocks an earlier request already had: what one infinite cache
    would reuse (the ceiling for any placement)."""
    seen: set[int] = set()
    hit = total = 0
    for r in rows:
        n = 0
        for block in r.blocks:
            if block not in seen:
                break
            n += 1
        hit += min(n * r.block_tokens, r.prompt_tokens)
        total += r.prompt_tokens
        seen.update(r.blocks)
    return hit / total if total else 0.0
