"""Where a request is best placed: cache reuse priced in time and capacity, and bounded loads.

Every candidate is judged by its predicted first-token and end-to-end times (``estimator.predict``),
which already hold what matters between staying and moving: the queue and batch on each backend,
and the prefill its cached prompt tokens skip. What one request's prediction leaves out is what its
prefill costs everyone else: a cache miss makes a backend prefill the whole history again, and
while the fleet is busy that GPU time delays the requests sharing it. So each candidate's times are
raised by the GPU work it takes beyond the least costly candidate, scaled by how busy the fleet is
(nothing on an idle fleet, the whole difference when every slot is in use), and the budgets are
met or missed on those times: reuse is preferred exactly when it pays.

Balance comes from bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2018): no backend takes more
than ``Rules.load_bound`` times its fair share (by slots) of the requests in flight, this one
included, unless every one would. A separate load term weighed against an affinity bonus (the
earlier design) made a few requests in flight outweigh the prefill a cache hit saves: three
concurrent clients on three llama-servers reused 1.00x round robin's prompt tokens.
"""

from __future__ import annotations

import hashlib
import math

from routing.decisions import Candidate, Prediction
from routing.estimator import prefill_ms
from routing.rules import Rules
from routing.types import BackendState, ModelSpec, RequestFeatures
from values import value

HOPELESS_RATIO = 2.0
"""Predicted at more than this multiple of its budget on every backend, a request goes to the cheapest
capacity rather than where it misses least."""
SAFE_RATIO = 0.5
"""A prediction at most this share of the budget meets it safely, whatever the estimate's error."""
HOME_BOUND = 1.1
"""Among equally busy backends, a new conversation's home holds at most this multiple of their mean
expected cache."""
NEW_BOUND = 1.0
"""The load bound of a new conversation (nothing of it held beyond the shared preamble): its fair
share exactly. Its first turn decides where all its turns will find their history, so it is placed
for balance; a continuing one may go up to ``Rules.load_bound`` (and one request more) to stay with
its cache (simulated chat sessions on six identical GPUs at 100% load, seeds 0 and 1: 29.8% and
30.6% within budget placing new conversations at 1, 27.4% and 29.3% at 1.25)."""
SLOT_CACHES = frozenset({"llama_server"})
"""Engines whose prompt cache is one prompt per slot (llama.cpp's server: a slot keeps the last prompt
it served, and a request takes the slot whose prompt it shares most of). Once each of its slots
holds a live conversation, another conversation there evicts one: a new conversation is placed
elsewhere while a backend has a slot's worth of room (``PrefixIndex.conversations`` against its
slots). Engines with a paged KV cache (vLLM, TensorRT-LLM, TGI, SGLang) hold many conversations
per slot, bounded by tokens, which the index already ages out."""
HOME_SLACK = 3.0
"""The backend holding a conversation's own history counts as meeting its budget while predicted
within this multiple of it: the tolerance for prediction error. Leaving costs the fleet the whole
history's prefill on a cold backend, and one prediction is a noisy thing to pay that for (simulated
chat sessions, six identical GPUs at 100% load: actual first-token times ran 0.5x to 1.7x the
prediction between the quartiles). Pricing the capacity a miss costs does not replace it (same
cells, seeds 0-3, within budget and cache hits: no slack 26.7-27.7% and 79.6-79.8%; 2: 29.7-30.6%
and 80.9%; 3: 30.8-31.6% and 81.0%, against SGLang's router's 30.4-30.6% and 81.0%; the mixed
fleet moved by -0.5 to +0.6 points)."""


def _rendezvous(key: int, name: str) -> bytes:
    """A stable 64-bit digest of (request key, backend), big-endian: the backends of a conversation in
    descending order of it are its rendezvous order (bytes of one length compare as their numbers)."""
    return hashlib.blake2b(b"%d:%s" % (key, name.encode()), digest_size=8).digest()


def busy(state: BackendState) -> float:
    """The backend's share of its slots in use (above 1 when requests wait)."""
    return (state.running + state.waiting) / max(1, state.profile.max_concurrency)


def home(alive: list[BackendState], matched: list[int], f: RequestFeatures) -> int:
    """The tie-break between candidates predicted alike (its index in ``alive``): for a new
    conversation (nothing of it held beyond the shared preamble), the least busy backends in the
    rendezvous order of its opening, skipping those whose expected cache holds more than
    ``HOME_BOUND`` times the mean (so conversations spread over an idle fleet however the hash falls,
    and every gateway replica agrees); for a continuing one, the same among the backends holding
    about as much of it as the best (a quarter less: after a failover it goes back to where it was).
    ``matched``: the blocks of the prompt each backend is expected to hold."""
    if len(alive) == 1:
        return 0
    beyond = max(matched) - f.preamble_blocks
    if beyond > 0:
        least = beyond - beyond // 4
        near = [i for i, blocks in enumerate(matched) if blocks - f.preamble_blocks >= least]
    else:
        shares = [busy(s) for s in alive]
        idlest = min(shares)
        near = [i for i, share in enumerate(shares) if share <= idlest]
    if len(near) == 1:  # nothing to order (one backend alone is within any bound of its own mean)
        return near[0]
    order = {i: _rendezvous(f.prefix_hash, alive[i].profile.name) for i in near}
    ranked = sorted(near, key=order.__getitem__, reverse=True)  # stable, as sorting by the negated number
    tokens = [prefix.tokens if (prefix := alive[i].prefix) is not None else 0.0 for i in ranked]
    bound = HOME_BOUND * sum(tokens) / len(tokens)
    return next((i for i, held in zip(ranked, tokens) if held <= bound), ranked[0])


def work_ms(model: ModelSpec, state: BackendState, p: Prediction, f: RequestFeatures, out: int) -> float:
    """GPU time a request takes: all of it while its uncached prompt is prefilled (compute-bound: the
    batch's step waits for the chunk), then its share of the batch per output token (decode reads
    the weights once for every sequence). Waiting takes none. Counting prefill at a batch share
    priced a cache miss at almost nothing and drowned a busy simulated fleet in prefill."""
    return prefill_ms(model, state, f.prompt_tokens - p.cached_tokens) + p.tpot_ms * out / p.slots


def bounds(in_flight: list[int], slots: list[int], factor: float, spare: int) -> list[int]:
    """Each backend's bound: the most requests it may have in flight with this one, ``factor`` times
    its share (by the slots this request's size leaves it) of every request in flight plus this one,
    rounded up, plus ``spare``."""
    fair = factor * (sum(in_flight) + 1) / sum(slots)
    return [math.ceil(fair * n - 1e-9) + spare for n in slots]


def meets(times: tuple[float, float], p: Prediction, f: RequestFeatures) -> bool:
    """Whether (first-token, end-to-end) times and the prediction's time per token meet the budgets."""
    return (
        (f.ttft_budget_ms is None or times[0] <= f.ttft_budget_ms)
        and (f.latency_budget_ms is None or times[1] <= f.latency_budget_ms)
        and (f.tpot_budget_ms is None or p.tpot_ms <= f.tpot_budget_ms)
    )


def budget_ratio(times: tuple[float, float], p: Prediction, f: RequestFeatures) -> float | None:
    """Time over budget for the tightest stated budget (above 1: missed), None without budgets."""
    pairs = ((times[0], f.ttft_budget_ms), (times[1], f.latency_budget_ms), (p.tpot_ms, f.tpot_budget_ms))
    ratios = [pred / budget for pred, budget in pairs if budget is not None]
    return max(ratios) if ratios else None


def budget_term(ratio: float | None, e2e: float, fastest_e2e: float, closest_miss: float) -> float:
    """1 for meeting the budget with a safe margin (cost then picks among such backends, so loose
    requests leave the fast backends to tight ones), down to 0.5 for just meeting it; below 0.5 for
    missing it, the closest miss scoring 0.5; without a budget, speed relative to the fastest."""
    if ratio is None:
        return fastest_e2e / e2e if e2e > 0 else 1.0
    if ratio <= SAFE_RATIO:
        return 1.0
    if ratio <= 1:
        return 1 - 0.5 * (ratio - SAFE_RATIO) / (1 - SAFE_RATIO)
    return 0.5 * closest_miss / ratio


@value(frozen=True)
class Scored:
    """The candidates with their scores, and whether the request is hopeless everywhere."""

    candidates: list[Candidate]
    hopeless: bool
    closest_miss: float
    """The least time over budget among the candidates (the home's slack included), 1 when one meets it."""

    def __init__(
        self,
        candidates: list[Candidate],
        hopeless: bool,
        closest_miss: float,
    ) -> None:
        # Written out, compiled: the record's fields assigned once (see routing.types).
        self.candidates = candidates  # type: ignore[misc]
        self.hopeless = hopeless  # type: ignore[misc]
        self.closest_miss = closest_miss  # type: ignore[misc]


def scored(
    alive: list[BackendState],
    preds: list[Prediction],
    matched: list[int],
    new: bool,
    probing: set[str],
    f: RequestFeatures,
    model: ModelSpec,
    rules: Rules,
    out: int,
) -> Scored:
    """Each backend's times priced with the capacity it takes, its score and where it stands against
    its load bound (lists in ``alive``'s order, as ``preds`` and ``matched``, the blocks of the prompt
    each holds: this runs on every request). ``new``: nothing of the conversation is held anywhere
    beyond its preamble."""
    in_flight = [s.running + s.waiting for s in alive]
    work = [work_ms(model, s, p, f, out) for s, p in zip(alive, preds)]
    # The GPU time beyond the least costly candidate's, times the fleet's share of slots in use: how
    # much of that work delays other requests (none on an idle fleet, all of it on a full one).
    least, busy_share = min(work), min(1.0, sum(in_flight) / sum(p.slots for p in preds))
    extra = [busy_share * (w - least) for w in work]
    times = [(p.ttft_ms + x, p.e2e_ms + x) for p, x in zip(preds, extra)]
    fastest = min(t[1] for t in times)
    cost = [s.profile.cost_per_hour * w for s, w in zip(alive, work)]
    cheapest = min(cost)
    tie = home(alive, matched, f)
    budgeted = f.budgeted
    ratios: list[float | None] = [None] * len(alive)
    if budgeted:
        ratios = [budget_ratio(t, p, f) for t, p in zip(times, preds)]
    if not new and (ratio := ratios[tie]) is not None:
        ratios[tie] = ratio / HOME_SLACK  # the conversation's history is there: see HOME_SLACK
    closest_miss = min((r for r in ratios if r is not None and r > 1), default=1.0) if budgeted else 1.0
    held = [s.prefix.conversations if s.prefix is not None else 0 for s in alive]
    over = _over_bound(alive, preds, in_flight, held, new, rules)
    w = rules.weights
    total = (w.budget + w.cost) or 1.0
    candidates = []
    for i, (s, p) in enumerate(zip(alive, preds)):
        name = s.profile.name
        terms = {
            "budget": budget_term(ratios[i], times[i][1], fastest, closest_miss),
            "cost": cheapest / cost[i] if cost[i] > 0 else 1.0,
            "home": 1.0 if i == tie else 0.0,
            "conversations": float(held[i]),
            "last_resort": 1.0 if name in probing else 0.0,
        }
        score = (w.budget * terms["budget"] + w.cost * terms["cost"]) / total
        met = (not budgeted or meets(times[i], p, f)) or (i == tie and not new and (ratios[i] or 0.0) <= 1)
        saved = prefill_ms(model, s, p.cached_tokens) if p.cached_tokens else 0.0  # prefill is linear in tokens
        # Positional (saved_ms, saved_gpu_ms, capacity_ms, in_flight, bound, over_bound): keywords cost
        # a microsecond per candidate on every request.
        candidates.append(
            Candidate(
                name, round(score, 6), p, met, terms, saved * s.observed.ttft_ratio, saved, extra[i],
                in_flight[i], over[i][0], over[i][1],
            )
        )  # fmt: skip
    # Far from its budget everywhere, a request cannot be saved; sent to the backend closest to its
    # budget it would only take that backend's capacity from requests that can still make theirs, so
    # it takes the cheapest capacity instead (in the simulator this beat "least loaded" and "closest").
    if closest_miss > 1 and any(c.meets_budget for c in candidates):
        closest_miss = 1.0  # one meets it: nothing is hopeless
    return Scored(candidates, closest_miss > HOPELESS_RATIO, closest_miss)


def _over_bound(
    alive: list[BackendState], preds: list[Prediction], in_flight: list[int], held: list[int], new: bool, rules: Rules
) -> list[tuple[int, bool]]:
    """Each backend's load bound and whether this request would take it over.

    A continuing conversation's home may hold one request more than its bound: with a few requests
    in flight the bound rounds to one (1.25 x 2 requests / 3 backends), and three clients on three
    llama-servers moved every turn whose home was serving another client."""
    bound = bounds(in_flight, [p.slots for p in preds], *((NEW_BOUND, 0) if new else (rules.load_bound, 1)))
    if len(alive) == 1:
        return [(bound[0], False)]  # over its bound or not, the only one is not (see the end)
    over = [n + 1 > b for n, b in zip(in_flight, bound)]
    if new:
        full = [s.profile.engine in SLOT_CACHES and c >= s.profile.max_concurrency for s, c in zip(alive, held)]
        if any(full):
            # Placed by the requests in flight alone, a new conversation follows whichever client just
            # finished: six clients, eight sessions on three 3-slot llama-servers put four sessions on
            # one in 2 runs of 5, and every turn there then evicted another session's history.
            over = [a or b for a, b in zip(over, full)]
            if all(over):
                over = full  # where its history will stay matters more than one request's balance
    if all(over):
        over = [False] * len(over)  # every one over its bound: none is (bounded loads place a key somewhere)
    return list(zip(bound, over))
