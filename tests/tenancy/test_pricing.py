"""Costs at the models' list prices, cached prompt tokens credited, and the budget periods."""

from __future__ import annotations

import calendar

from backends.base import Usage
from gateway.tenancy.pricing import Price, period_of, usd


def test_cost_is_prompt_and_completion_at_their_prices_in_nano_dollars() -> None:
    price = Price(input=3.0, output=15.0)  # dollars per million tokens
    # A dollar per million tokens is a thousand nano-dollars a token.
    assert price.nanos(1000, 100) == 1000 * 3 * 1000 + 100 * 15 * 1000
    assert usd(price.of(Usage(1_000_000, 0))) == 3.0


def test_cached_prompt_tokens_cost_the_cached_price_default_half() -> None:
    assert Price(input=2.0).of(Usage(1000, 0, cached_tokens=600)) == (400 * 2 + 600 * 1) * 1000
    assert Price(input=2.0, cached=0.2).of(Usage(1000, 0, cached_tokens=600)) == (800 + 120) * 1000
    # An engine that reports more cached tokens than the prompt is credited at most the prompt.
    assert Price(input=2.0).of(Usage(10, 0, cached_tokens=50)) == 10 * 1000


def test_budget_periods_are_utc_days_and_months() -> None:
    t = calendar.timegm((2026, 2, 28, 23, 59, 0, 0, 0, 0))
    assert period_of("day", t)[0] == "2026-02-28"
    month, ttl, first = period_of("month", t)
    assert (month, first) == ("2026-02", "2026-02-01") and ttl == 29 * 86400
