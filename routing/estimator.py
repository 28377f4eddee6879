"""Latency predictions from physics, corrected by what traffic has shown.

Prefill is compute-bound: 2 x parameters x prompt tokens / usable FLOP/s.
Decode is memory-bound: every step reads the weights once for the whole batch
plus each running sequence's KV cache: (weights + batch x KV) / usable bandwidth.
Queueing: when every slot is busy, the requests ahead share the slots.
Prefix caching: prompt tokens expected in the backend's cache are not prefilled again (they still
take KV cache), so the same prompt predicts a shorter first token where its prefix is held.
Observed TTFT (as a ratio to the prediction) and time per output token replace
the priors per backend through exponentially weighted averages.
"""

from __future__ import annotations

from routing.catalog import PREFILL_CHUNK_TOKENS
from routing.decisions import Prediction
from routing.types import BackendProfile, BackendState, ModelSpec, Observed

ALPHA = 0.2
"""Weight of a new observation in the running averages."""
MIN_SAMPLES = 3
"""Observations before a backend's measured time per token replaces the physics prior."""
TYPICAL_OUTPUT_TOKENS = 256
"""For the service time of requests queued ahead, whose lengths are unknown."""


def prefill_ms(model: ModelSpec, state: BackendState, prompt_tokens: int) -> float:
    tokens = prompt_tokens if prompt_tokens > 1 else 1
    return model.prefill_flop_per_token * tokens / state.profile.prefill_flops * 1000


def decode_step_ms(model: ModelSpec, state: BackendState, context_tokens: int) -> float:
    read = model.weight_bytes + (state.running + 1) * model.kv_bytes_per_token * context_tokens
    return read / state.profile.decode_bandwidth * 1000


def predict(
    model: ModelSpec, state: BackendState, prompt_tokens: int, max_tokens: int, cached_tokens: int = 0
) -> Prediction:
    """``cached_tokens``: the prompt's tokens expected in the backend's prefix cache (at least its last
    token is always computed, as engines do)."""
    # Conditionals rather than min() and max(): this runs for every candidate of every request.
    p, observed, running = state.profile, state.observed, state.running
    last = prompt_tokens - 1
    cached = cached_tokens if cached_tokens <= last else last
    if cached < 0:
        cached = 0
    fresh = prompt_tokens - cached
    out = max_tokens if max_tokens > 1 else 1
    step = decode_step_ms(model, state, prompt_tokens + out // 2)
    tpot = step
    if observed.tpot_ms is not None and observed.samples >= MIN_SAMPLES:
        batch = running + 1 if running + 1 <= p.max_concurrency else p.max_concurrency
        tpot = observed.tpot_ms * (running + 1) / (batch if batch > 1 else 1)
    room = slots(model, state, prompt_tokens + out)
    ahead = state.waiting + running + 1 - room
    queue = 0.0
    if ahead > 0:
        service = prefill_ms(model, state, fresh) + typical_output(observed) * tpot
        queue = ahead * service / room
    # The prompt is prefilled after the prompts sent before it, a chunk per engine iteration, and every
    # iteration also decodes one token for each running sequence.
    prefill_tokens = state.prefill_backlog_tokens + fresh
    iterations = -(-prefill_tokens // PREFILL_CHUNK_TOKENS)
    prefill = prefill_ms(model, state, prefill_tokens) + (iterations * step if running else 0.0)
    prior = p.efficiency.overhead_ms + queue + prefill
    ttft = prior * observed.ttft_ratio
    # Positional (ttft, tpot, e2e, queue, prior_ttft, slots, cached_tokens), as Candidate's.
    return Prediction(ttft, tpot, ttft + tpot * (out - 1), queue, prior, room, cached)


def kv_capacity_tokens(model: ModelSpec, profile: BackendProfile) -> float:
    """Tokens of KV cache the backend's memory holds beside the weights: what its prefix cache can keep."""
    room = profile.usable_bytes - model.weight_bytes
    return max(0.0, room / model.kv_bytes_per_token)


def slots(model: ModelSpec, state: BackendState, tokens_per_sequence: int) -> int:
    """Sequences the backend runs at once: its concurrency limit, or fewer when the KV cache fills first."""
    p = state.profile
    kv_room = p.usable_bytes - model.weight_bytes
    by_memory = int(kv_room / (model.kv_bytes_per_token * (tokens_per_sequence if tokens_per_sequence > 1 else 1)))
    cap = p.max_concurrency if state.engine_slots is None else min(p.max_concurrency, state.engine_slots)
    room = cap if cap <= by_memory else by_memory
    return room if room > 1 else 1


def memory_need(model: ModelSpec, profile: BackendProfile, tokens: int) -> tuple[float, float]:
    """(bytes one request of ``tokens`` needs with the weights, bytes the backend has usable for both)."""
    need = model.weight_bytes + model.kv_bytes_per_token * tokens
    return need, profile.usable_bytes


def fit_problem(model: ModelSpec, state: BackendState, prompt_tokens: int, max_tokens: int) -> str | None:
    """Why this backend cannot take the request at all, or None when it can."""
    p = state.profile
    context = min(model.context, p.context or model.context)
    if prompt_tokens + max_tokens > context:
        return f"context {context} < {prompt_tokens} + {max_tokens} tokens"
    need, have = memory_need(model, p, prompt_tokens + max_tokens)
    if need > have:
        return f"needs {need / 1e9:.1f} GB for weights and KV cache, has {have / 1e9:.1f} GB usable"
    return None


def typical_output(observed: Observed) -> float:
    """Completion tokens of a request of unknown length on this backend: what its answers have shown."""
    return observed.out_tokens if observed.out_tokens is not None else TYPICAL_OUTPUT_TOKENS


def observe(
    previous: Observed, prior_ttft_ms: float, ttft_ms: float, tpot_ms: float | None, out_tokens: int | None = None
) -> Observed:
    """Fold one finished request into a backend's learned corrections; ``prior_ttft_ms`` is the
    request's ``Prediction.prior_ttft_ms`` (not the corrected TTFT: the correction may have moved
    since, and dividing it back out would feed the running average its own swings)."""
    ratio = min(20.0, max(0.05, ttft_ms / prior_ttft_ms)) if prior_ttft_ms > 0 else previous.ttft_ratio
    new_ratio = ratio if previous.samples == 0 else (1 - ALPHA) * previous.ttft_ratio + ALPHA * ratio
    new_tpot = previous.tpot_ms
    if tpot_ms is not None:
        new_tpot = tpot_ms if previous.tpot_ms is None else (1 - ALPHA) * previous.tpot_ms + ALPHA * tpot_ms
    new_out = previous.out_tokens
    if out_tokens is not None:
        new_out = out_tokens if previous.out_tokens is None else (1 - ALPHA) * previous.out_tokens + ALPHA * out_tokens
    # Every field written (a test holds it), so no dataclasses.replace: an interpreted call per request.
    return Observed(ttft_ratio=new_ratio, tpot_ms=new_tpot, samples=previous.samples + 1, out_tokens=new_out)
