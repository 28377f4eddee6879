"""Request features for routing, computed from the validated request without I/O."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping

from routing.types import RequestFeatures

# Without the model's tokenizer at hand: about four characters per token for English text.
CHARS_PER_TOKEN = 4
# Requests whose first characters agree are likely to share an engine's prefix cache.
PREFIX_CHARS = 256
# Headers rules may match on: the gateway's own and the client's tenant marker; never credentials.
RULE_HEADERS = ("x-tenant", "x-priority", "x-enginegate-pool", "x-enginegate-class")


# Numeric headers are short: longer values are refused before any parsing (an int of 5,000 digits
# raised from int() and answered 500). Budgets are positive milliseconds up to a day; priorities are
# integers in [MIN_PRIORITY, MAX_PRIORITY], higher first.
MAX_NUMBER_CHARS = 32
MAX_BUDGET_MS = 86_400_000.0
MIN_PRIORITY, MAX_PRIORITY = -1000, 1000


class InvalidHeader(ValueError):
    def __init__(self, name: str, raw: str, expected: str) -> None:
        shown = raw if len(raw) <= MAX_NUMBER_CHARS else raw[:MAX_NUMBER_CHARS] + "..."
        super().__init__(f"Invalid value for header '{name}': {shown!r} is not {expected}.")
        self.name = name


def estimate_tokens(texts: Iterable[str]) -> int:
    return sum(len(t) for t in texts) // CHARS_PER_TOKEN + 1


def _prefix(texts: list[str]) -> str:
    """The first characters of the prompt, without joining a whole long history to find them."""
    parts, size = [], 0
    for t in texts:
        parts.append(t[: PREFIX_CHARS - size])
        size += len(parts[-1])
        if size >= PREFIX_CHARS:
            break
    return "".join(parts)


def _header_ms(headers: Mapping[str, str], *names: str) -> float | None:
    for name in names:
        raw = headers.get(name)
        if raw is None:
            continue
        expected = f"a positive number of milliseconds up to {MAX_BUDGET_MS:.0f}"
        try:
            value = float(raw) if len(raw) <= MAX_NUMBER_CHARS else -1.0
        except ValueError:
            raise InvalidHeader(name, raw, expected) from None
        if not 0 < value <= MAX_BUDGET_MS:
            raise InvalidHeader(name, raw, expected)
        return value
    return None


def _priority(headers: Mapping[str, str]) -> int:
    raw = headers.get("x-priority")
    if raw is None:
        return 0
    text = raw.strip()
    digits = text[1:] if text[:1] in ("-", "+") else text
    # isascii: str.isdigit also accepts digits int() refuses ("²"); the length check comes before int().
    if len(text) > MAX_NUMBER_CHARS or not (digits.isascii() and digits.isdigit()):
        raise InvalidHeader("x-priority", raw, f"an integer from {MIN_PRIORITY} to {MAX_PRIORITY}")
    value = int(text)
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidHeader("x-priority", raw, f"an integer from {MIN_PRIORITY} to {MAX_PRIORITY}")
    return value


def features(
    model: str,
    texts: Iterable[str],
    max_tokens: int | None,
    stream: bool,
    headers: Mapping[str, str],
    prompt_tokens: int | None = None,
    gate: float = 0.0,
) -> RequestFeatures:
    """``prompt_tokens``: the exact count when the model's tokenizer is known; else estimated from the text."""
    texts = list(texts)
    prefix = _prefix(texts)
    return RequestFeatures(
        model=model,
        prompt_tokens=prompt_tokens if prompt_tokens is not None else estimate_tokens(texts),
        max_tokens=max_tokens,
        stream=stream,
        latency_budget_ms=_header_ms(headers, "x-latency-budget-ms"),
        ttft_budget_ms=_header_ms(headers, "x-ttft-budget-ms", "x-slo-ttft-ms"),
        tpot_budget_ms=_header_ms(headers, "x-slo-tpot-ms"),
        priority=_priority(headers),
        tenant=headers.get("x-tenant"),
        prefix_hash=zlib.crc32(prefix.encode()),
        headers=tuple((h, headers[h]) for h in RULE_HEADERS if h in headers),
        gate=gate,
    )
