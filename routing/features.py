"""Request features for routing, computed from the validated request without I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from routing import prefix
from routing.types import RequestFeatures

# Without the model's tokenizer at hand: about four characters per token for English text.
CHARS_PER_TOKEN = prefix.CHARS_PER_TOKEN
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
    needs: frozenset[str] = frozenset(),
    extras: frozenset[str] = frozenset(),
    roles: Sequence[str] | None = None,
    top_logprobs: int = 0,
    block_bytes: int = prefix.BLOCK_BYTES,
    token_ids: Sequence[int] = (),
) -> RequestFeatures:
    """``prompt_tokens``: the exact count when the model's tokenizer is known; else estimated from the text.
    ``roles``: the chat messages' roles (None for a completion prompt), which mark the conversation's
    preamble and opening (``routing.prefix.opening``). ``block_bytes``: the prefix blocks' size
    (``routing.prefix.block_tokens`` x ``routing.prefix.CHARS_PER_TOKEN``)."""
    texts = list(texts)
    tokens = prompt_tokens if prompt_tokens is not None else estimate_tokens(texts)
    data = prefix.rendered(texts)
    preamble, opening = prefix.opening(texts, roles)
    return RequestFeatures(
        model=model,
        prompt_tokens=tokens,
        max_tokens=max_tokens,
        stream=stream,
        latency_budget_ms=_header_ms(headers, "x-latency-budget-ms"),
        ttft_budget_ms=_header_ms(headers, "x-ttft-budget-ms", "x-slo-ttft-ms"),
        tpot_budget_ms=_header_ms(headers, "x-slo-tpot-ms"),
        priority=_priority(headers),
        tenant=headers.get("x-tenant"),
        prefix_hash=prefix.opening_key(data, opening),
        prefix_blocks=prefix.chain(data, block_bytes),
        block_tokens=tokens * block_bytes / max(1, len(data)),
        preamble_blocks=preamble // block_bytes,
        headers=tuple((h, headers[h]) for h in RULE_HEADERS if h in headers),
        gate=gate,
        needs=needs,
        extras=extras,
        top_logprobs=top_logprobs,
        token_ids=token_ids,
    )
