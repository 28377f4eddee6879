"""OpenAI's answers for keys and limits: 401, 403, 429 (rate limits and quota) and the x-ratelimit headers.

Messages name a key by its id only, never by its secret.
"""

from __future__ import annotations

import math

from gateway.http.errors import ApiError
from gateway.tenancy.limiter import Ask, Verdict


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key")


MISSING = "You didn't provide an API key. Send it as `Authorization: Bearer <key>`."


def invalid(key_id: str | None) -> ApiError:
    shown = f" (key id {key_id})" if key_id else ""
    return unauthorized(f"Incorrect API key provided{shown}.")


def unusable(key_id: str, why: str) -> ApiError:
    return unauthorized(f"The API key {key_id} is {why}.")


def not_allowed(key_id: str, model: str) -> ApiError:
    return ApiError(
        403, f"The API key {key_id} may not use the model `{model}`.", param="model", code="model_not_allowed"
    )


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``250ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


def headers(ask: Ask, verdict: Verdict) -> list[tuple[str, str]]:
    """OpenAI's x-ratelimit headers for the limits the key has (none for limits it has not)."""
    out = []
    if ask.rpm:
        out += [
            ("x-ratelimit-limit-requests", str(ask.rpm)),
            ("x-ratelimit-remaining-requests", str(verdict.remaining_requests)),
            ("x-ratelimit-reset-requests", duration(verdict.reset_requests_s)),
        ]
    if ask.tpm:
        out += [
            ("x-ratelimit-limit-tokens", str(ask.tpm)),
            ("x-ratelimit-remaining-tokens", str(verdict.remaining_tokens)),
            ("x-ratelimit-reset-tokens", duration(verdict.reset_tokens_s)),
        ]
    return out


def refused(ask: Ask, verdict: Verdict, model: str) -> ApiError:
    why = verdict.refused
    retry = max(verdict.retry_after_s, 0.001)
    wait = f"Please try again in {duration(retry)}."
    if why == "quota":  # the budget comes back when the period ends
        return ApiError(
            429,
            f"The API key {ask.key} has spent its budget for {ask.period}; it renews in {duration(ask.period_left_s)}.",
            type="insufficient_quota",
            code="insufficient_quota",
            retry_after=max(1.0, ask.period_left_s),
        )
    if why == "requests":
        text = f"on requests per min (RPM): Limit {ask.rpm}, Requested 1. {wait}"
        return _rate(ask, model, text, "requests", retry)
    if why == "too_large":  # the gateway refuses these before asking (never_fits); kept for a direct caller
        return never_fits(ask.key, ask.tpm, ask.tokens, ask.tokens)
    if why == "tokens":
        text = f"on tokens per min (TPM): Limit {ask.tpm}, Requested {ask.tokens}. {wait}"
        return _rate(ask, model, text, "tokens", retry)
    text = f"on concurrent requests: Limit {ask.concurrency}. {wait}"
    return _rate(ask, model, text, "requests", retry)


def never_fits(key_id: str, tpm: int, prompt: int, reserved: int) -> ApiError:
    """A request that no wait can admit: it reserves more tokens than the key's whole window allows."""
    room = tpm - prompt
    advice = f"set max_tokens to at most {room}" if room >= 1 else "shorten the prompt (it alone reserves that much)"
    param = "max_tokens" if room >= 1 else "messages"
    return ApiError(
        400,
        f"The API key {key_id} allows {tpm} tokens per minute (tpm); this request reserves {reserved}"
        f" (the prompt's {prompt} and the longest answer): {advice}.",
        param=param,
        code="exceeds_key_token_limit",
    )


def over_budget(key_id: str, budget_usd: float, period: str, reserved_nanos: int) -> ApiError:
    """A request whose reservation (the prompt and its longest answer at the model's prices) is more
    than the key's whole budget: no wait would admit it."""
    return ApiError(
        400,
        f"The API key {key_id} has a budget of ${budget_usd:g} per {period}; this request reserves"
        f" ${reserved_nanos / 1e9:.9g} (its prompt and longest answer at the model's prices): set a lower"
        " max_tokens.",
        param="max_tokens",
        code="exceeds_key_budget",
    )


def _rate(ask: Ask, model: str, text: str, kind: str, retry: float) -> ApiError:
    return ApiError(
        429, f"Rate limit reached for {model} with key {ask.key} {text}", type=kind, code="rate_limit_exceeded",
        retry_after=retry,
    )  # fmt: skip


def fair_share(key_id: str, model: str) -> ApiError:
    return ApiError(
        429,
        f"Backends serving {model} are saturated and the key {key_id} holds more than its fair share of them;"
        " other keys' requests go first. Please try again shortly.",
        type="requests",
        code="rate_limit_exceeded",
        retry_after=1.0,
    )


STORE_DOWN = ApiError(
    503,
    "API keys cannot be checked right now; retry the request.",
    type="api_error",
    code="key_store_unavailable",
    retry_after=1.0,
)
BUDGET_DOWN = ApiError(
    503,
    "This API key's budget cannot be checked right now (its store, Redis, is unreachable): no request is"
    " admitted against it until it is back, so the budget is never overspent; retry the request.",
    type="api_error",
    code="budget_store_unavailable",
    retry_after=1.0,
)
LIMITER_DOWN = ApiError(
    503,
    "Rate limits cannot be checked right now; retry the request.",
    type="api_error",
    code="rate_limiter_unavailable",
    retry_after=1.0,
)
