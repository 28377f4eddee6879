"""Requests for the fleet simulator: a trace's arrivals and token counts, budgets from a mix.

Traces (``traces``) carry no latency budgets, so each request draws a budget class (interactive chat,
agent step, batch job) from a ``BudgetMix`` with a seeded generator, which keeps every run of the same
inputs identical.

Requests may carry prompt blocks (``SimRequest.blocks``): the simulated engines keep them in a
prefix cache and skip the cached ones at prefill. Mooncake's trace has them; ``chat_sessions``
makes a multi-turn chat workload with shared system prompts on a trace's arrivals.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from routing.sim.traces import TraceRow

SHARE_TOLERANCE = 1e-6
"""How far a mix's shares may sum from 1 (rounding in hand-written mixes)."""


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
