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


class InvalidHeader(ValueError):
    def __init__(self, name: str, raw: str) -> None:
        super().__init__(f"Invalid value for header '{name}': {raw!r} is not a positive number of milliseconds.")
        self.name = name


def estimate_tokens(texts: Iterable[str]) -> int:
    return sum(len(t) for t in texts) // CHARS_PER_TOKEN + 1


def _header_ms(headers: Mapping[str, str], *names: str) -> float | None:
    for name in names:
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            raise InvalidHeader(name, raw) from None
        if not 0 < value < float("inf"):
            raise InvalidHeader(name, raw)
        return value
    return None


def features(
    model: str,
    texts: Iterable[str],
    max_tokens: int | None,
    stream: bool,
    headers: Mapping[str, str],
    prompt_tokens: int | None = None,
) -> RequestFeatures:
    """``prompt_tokens``: the exact count when the model's tokenizer is known; else estimated from the text."""
    texts = list(texts)
    prefix = "".join(texts)[:PREFIX_CHARS]
    priority = headers.get("x-priority", "0")
    return RequestFeatures(
        model=model,
        prompt_tokens=prompt_tokens if prompt_tokens is not None else estimate_tokens(texts),
        max_tokens=max_tokens,
        stream=stream,
        latency_budget_ms=_header_ms(headers, "x-latency-budget-ms"),
        ttft_budget_ms=_header_ms(headers, "x-ttft-budget-ms", "x-slo-ttft-ms"),
        tpot_budget_ms=_header_ms(headers, "x-slo-tpot-ms"),
        priority=int(priority) if priority.lstrip("-").isdigit() else 0,
        tenant=headers.get("x-tenant"),
        prefix_hash=zlib.crc32(prefix.encode()),
        headers=tuple((h, headers[h]) for h in RULE_HEADERS if h in headers),
    )
