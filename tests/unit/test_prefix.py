"""Prefix-cache-aware routing: block hashes, the per-backend index, and choose() trading cache hits
against queueing through its predictions."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from routing.catalog import BYTES_PER_PARAM, ENGINES, GPUS
from routing.decisions import Reason
from routing.estimator import kv_capacity_tokens, predict
from routing.explain import render, to_dict
from routing.features import features
from routing.placement import HOME_SLACK
from routing.policy import choose
from routing.prefix import BLOCK_BYTES, MIN_CAPACITY_TOKENS, PrefixIndex, chain, rendered
from routing.rules import Rules
from routing.types import BackendProfile, BackendState, FleetSnapshot, ModelSpec

LLAMA_8B = ModelSpec("llama-8b", 8, BYTES_PER_PARAM["bf16"], 32768, 131072)
SYSTEM = "You are a careful assistant for the Acme help desk. Answer briefly and cite the manual. " * 12


def state(name: str, running: int = 0, prefix: PrefixIndex | None = None) -> BackendState:
    profile = BackendProfile(
        name, "vllm", frozenset({"llama-8b"}), GPUS["A100-80GB"], 1, 80.0, ENGINES["vllm"], 64, 3.0
    )
    return BackendState(profile, running=running, prefix=prefix)


def chat(*turns: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return messages


def feats(messages: list[dict[str, str]], **kw: object):  # type: ignore[no-untyped-def]
    texts = [m["content"] for m in messages]
    return features("llama-8b", texts, 64, True, {}, roles=[m["role"] for m in messages], **kw)  # type: ignore[arg-type]


def test_blocks_are_chained_so_prompts_share_exactly_their_common_leading_blocks() -> None:
    a = chain(b"x" * (4 * BLOCK_BYTES) + b"tail")
    b = chain(b"x" * (2 * BLOCK_BYTES) + b"y" + b"x" * (2 * BLOCK_BYTES))
    assert len(a) == 4  # the partial last block is never counted
    assert a[:2] == b[:2] and a[2] != b[2] and a[3] != b[3]  # after they part, no block matches again
    assert len(set(a)) == 4  # equal block contents at different depths are different prefixes


def test_block_keys_are_the_same_in_every_process() -> None:
    # Replicas must agree: Python's str hash is salted per process, the chain must not be.
    code = "from routing.prefix import chain; print(chain(b'abc' * 300))"
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout for _ in "12"
    }
    assert len(runs) == 1 and str(chain(b"abc" * 300)) in runs.pop()


def test_the_index_forgets_least_recently_used_tails_first_within_its_capacity() -> None:
    index = PrefixIndex(capacity_tokens=1000)
    shared = rendered([SYSTEM])[: 4 * BLOCK_BYTES]
    first = chain(shared + b"a" * (8 * BLOCK_BYTES))
    second = chain(shared + b"b" * (8 * BLOCK_BYTES))
    index.add(first, 64)
    assert index.match(first) == 12 and index.tokens == 12 * 64
    index.add(second, 64)  # 20 distinct blocks of 64 tokens do not fit in 1000
    assert index.tokens <= 1000
    assert index.match(second) == 12  # the newest prompt is whole
    assert 4 <= index.match(first) < 12  # the older lost its own tail, not the shared system prompt


def test_engine_reports_shrink_and_regrow_the_expected_cache() -> None:
    index = PrefixIndex(capacity_tokens=100_000)
    keys = [chain(rendered([f"conversation {i} " * 200])) for i in range(20)]
    for k in keys:
        index.add(k, 64)
    middle = keys[10]
    n = index.match(middle)
    assert n == len(middle) and index.match(keys[0]) == len(keys[0])
    ages = index.ages(middle, n)
    index.reported(ages, cached_tokens=0, block_tokens=64)  # the engine kept none of it: it holds less
    assert index.capacity < 100_000 and index.match(keys[0]) == len(keys[0])  # one report: part of the way
    for _ in range(10):
        index.reported(ages, cached_tokens=0, block_tokens=64)
    # towards the age of the first block it lacked (its count trusted to within a block): what is
    # older than that is forgotten, what is newer kept
    assert index.capacity < ages[1] + 0.05 * 100_000
    assert index.match(keys[0]) == 0 and index.match(keys[-1]) == len(keys[-1])
    shrunk = index.capacity
    index.reported(index.ages(keys[-1], 3), cached_tokens=128, block_tokens=64)  # a block short of 3: noise
    assert index.capacity == shrunk
    index.reported(index.ages(keys[-1], n), cached_tokens=n * 64, block_tokens=64)  # it held it all
    assert index.capacity >= shrunk and index.capacity >= MIN_CAPACITY_TOKENS


def test_opening_names_the_conversation_not_the_shared_system_prompt() -> None:
    one_t1 = feats(chat("How do I reset my password?"))
    one_t3 = feats(chat("How do I reset my password?", "Open settings.", "And then?"))
    other = feats(chat("My printer is on fire."))
    assert one_t1.prefix_hash == one_t3.prefix_hash  # every turn: same rendezvous key
    assert one_t1.prefix_hash != other.prefix_hash  # same system prompt, different conversation
    assert one_t1.prefix_blocks == one_t3.prefix_blocks[: len(one_t1.prefix_blocks)]
    assert one_t3.preamble_blocks == len(rendered([SYSTEM])) // BLOCK_BYTES
    # tokens per block follow the request's own count when the tokenizer gave one
    exact = feats(chat("How do I reset my password?"), prompt_tokens=1000)
    assert exact.block_tokens == 1000 * BLOCK_BYTES / len(
        rendered([m["content"] for m in chat("How do I reset my password?")])
    )


def test_cached_tokens_shorten_the_predicted_prefill_only() -> None:
    idle = state("a")
    cold = predict(LLAMA_8B, idle, 8000, 100)
    warm = predict(LLAMA_8B, idle, 8000, 100, cached_tokens=7000)
    assert warm.cached_tokens == 7000 and cold.cached_tokens == 0
    assert warm.ttft_ms < cold.ttft_ms / 4
    assert warm.tpot_ms == cold.tpot_ms  # the cached tokens still sit in the KV cache and are read
    assert predict(LLAMA_8B, idle, 8000, 100, cached_tokens=9000).cached_tokens == 7999  # the last token is computed


def _holding(messages: list[dict[str, str]], capacity: float = 1e6) -> PrefixIndex:
    index = PrefixIndex(capacity)
    f = feats(messages)
    index.add(f.prefix_blocks, f.block_tokens)
    return index


def test_a_long_cached_prompt_goes_where_it_is_held_until_queueing_there_costs_more() -> None:
    history = chat("Summarise this manual: " + "The pump must be primed before use. " * 600)
    turn = [*history, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "And the valves?"}]
    f = replace(feats(turn), ttft_budget_ms=2000)  # the cold backend prefills it in about 640 ms
    held = _holding(history)
    snapshot = FleetSnapshot((state("cold"), state("warm", prefix=held)), {"llama-8b": LLAMA_8B})
    decision = choose(f, snapshot, Rules())
    first = decision.candidates[0]
    assert first.backend == "warm" and first.prediction.cached_tokens > 0.9 * f.prompt_tokens - 100
    assert to_dict(decision, f)["candidates"][0]["cached_tokens"] == first.prediction.cached_tokens
    assert "cached" in render(decision, f, snapshot)
    # the same cache behind a long queue: the prediction, not a bonus, moves the request
    busy = FleetSnapshot((state("cold"), state("warm", running=400, prefix=held)), {"llama-8b": LLAMA_8B})
    assert choose(f, busy, Rules()).candidates[0].backend == "cold"


def test_new_conversations_sharing_a_system_prompt_spread_over_equal_backends() -> None:
    # The old affinity hashed the first 256 characters: a shared system prompt sent them all to one backend.
    twins = [state(f"b{i}", prefix=_holding(chat())) for i in range(4)]
    snapshot = FleetSnapshot(tuple(twins), {"llama-8b": LLAMA_8B})
    homes = {choose(feats(chat(f"Question number {i}?")), snapshot, Rules()).candidates[0].backend for i in range(40)}
    assert len(homes) == 4


def test_a_conversation_follows_its_own_history_and_replicas_agree_on_new_ones() -> None:
    opening = chat("Tell me about pumps. " * 30)
    twins = [state(f"b{i}") for i in range(4)]
    snapshot = FleetSnapshot(tuple(twins), {"llama-8b": LLAMA_8B})
    home = choose(feats(opening), snapshot, Rules()).candidates[0].backend
    # another replica, same fleet, knows nothing: the same home
    assert (
        choose(feats(opening), FleetSnapshot(tuple(twins), {"llama-8b": LLAMA_8B}), Rules()).candidates[0].backend
        == home
    )
    # load sent turn 2 elsewhere; turn 3 follows the history there, not the rendezvous home
    turn2 = [
        *opening,
        {"role": "assistant", "content": "Pumps move fluids. " * 40},
        {"role": "user", "content": "More."},
    ]
    elsewhere = next(s.name for s in twins if s.name != home)
    placed = [replace(s, prefix=_holding(turn2)) if s.name == elsewhere else s for s in twins]
    turn3 = [*turn2, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "Thanks."}]
    got = choose(feats(turn3), FleetSnapshot(tuple(placed), {"llama-8b": LLAMA_8B}), Rules()).candidates[0].backend
    assert got == elsewhere


def test_kv_capacity_in_tokens_comes_from_memory_weights_and_kv_bytes() -> None:
    profile = state("a").profile
    assert kv_capacity_tokens(LLAMA_8B, profile) == (80e9 * 0.9 - 16e9) / 131072


def test_the_history_of_a_backend_with_a_full_queue_does_not_decide_the_home() -> None:
    opening = chat("Tell me about pumps. " * 30)
    full = state("full", running=10_000, prefix=_holding(opening))
    others = [state(f"b{i}") for i in range(2)]
    rules = Rules(max_queue_wait_ms=1.0)
    decision = choose(feats(opening), FleetSnapshot((full, *others), {"llama-8b": LLAMA_8B}), rules)
    assert "full" in decision.excluded and decision.candidates[0].backend in ("b0", "b1")


def test_a_hopeless_request_takes_the_backend_where_its_prompt_costs_least_work() -> None:
    # Out of reach everywhere, a request goes to the cheapest capacity. Waiting takes no capacity and
    # a prompt found in cache saves its prefill: the backend holding it, though it queues, is cheaper
    # than an idle one that would prefill 8,000 tokens again (priced at e2e / slots, the queue made
    # the cold backend look cheaper, and misses drowned a busy fleet in prefill).
    history = chat("Summarise this manual: " + "The pump must be primed before use. " * 700)
    turn = [*history, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "And the valves?"}]
    f = replace(feats(turn), ttft_budget_ms=1)
    warm = replace(state("warm", running=64, prefix=_holding(history)), waiting=8)
    # as busy as each other: the load bound does not decide (see test_placement.py)
    snapshot = FleetSnapshot((replace(state("cold", running=64), waiting=8), warm), {"llama-8b": LLAMA_8B})
    decision = choose(f, snapshot, Rules())
    assert decision.reason is Reason.BEST_EFFORT
    first = decision.candidates[0]
    assert first.backend == "warm" and first.prediction.queue_ms > 0


def test_a_new_conversation_goes_to_the_least_busy_backend_with_caches_full_everywhere() -> None:
    # The rendezvous home bounded by cached tokens ignored load once every cache was full: a busy
    # home kept taking new conversations while another backend idled.
    full = [state(f"b{i}", running=40, prefix=_holding(chat(), capacity=MIN_CAPACITY_TOKENS)) for i in range(4)]
    quiet = replace(full[2], running=5)
    snapshot = FleetSnapshot((full[0], full[1], quiet, full[3]), {"llama-8b": LLAMA_8B})
    for i in range(20):
        decision = choose(feats(chat(f"Question number {i}?")), snapshot, Rules())
        assert [c.backend for c in decision.candidates if c.terms["home"]] == ["b2"]
        assert decision.candidates[0].backend == "b2"
    # equal loads: the rendezvous order breaks the tie, the same from every replica
    even = FleetSnapshot(tuple(full), {"llama-8b": LLAMA_8B})
    spread = {choose(feats(chat(f"Question number {i}?")), even, Rules()).candidates[0].backend for i in range(40)}
    assert len(spread) == 4


def test_saturated_backends_are_still_told_apart_by_load() -> None:
    # 1 - used/slots flattened to 0 once requests outnumbered slots: 300 and 100 in flight looked alike.
    a, b = state("a", running=300), state("b", running=100)
    decision = choose(feats(chat("hello")), FleetSnapshot((a, b), {"llama-8b": LLAMA_8B}), Rules())
    bounded = {c.backend: (c.in_flight, c.over_bound) for c in decision.candidates}
    assert bounded == {"a": (300, True), "b": (100, False)}
    assert decision.candidates[0].backend == "b"


def test_a_conversation_stays_with_its_history_while_predicted_within_its_slack() -> None:
    history = chat("Summarise this manual: " + "The pump must be primed before use. " * 600)
    turn = [*history, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "And the valves?"}]
    held = _holding(history)
    f = feats(turn)
    warm = replace(state("warm", running=8, prefix=held), prefill_backlog_tokens=60_000)  # prompts ahead of it
    snapshot = FleetSnapshot((state("cold", running=8), warm), {"llama-8b": LLAMA_8B})
    warm_ttft = next(c for c in choose(f, snapshot, Rules()).candidates if c.backend == "warm").prediction.ttft_ms
    # a budget the warm backend is predicted to miss by a third, the cold one to meet
    budgeted = replace(f, ttft_budget_ms=warm_ttft * 0.75)
    decision = choose(budgeted, snapshot, Rules())
    cold = next(c for c in decision.candidates if c.backend == "cold")
    assert cold.prediction.ttft_ms < budgeted.ttft_budget_ms  # the cold backend would meet it
    assert decision.candidates[0].backend == "warm" and decision.candidates[0].meets_budget
    # predicted beyond HOME_SLACK times the budget there, it moves
    hopeless_home = replace(f, ttft_budget_ms=warm_ttft / (HOME_SLACK * 1.1))
    moved = choose(hopeless_home, snapshot, Rules())
    assert next(c for c in moved.candidates if c.backend == "cold").prediction.ttft_ms < hopeless_home.ttft_budget_ms
    assert moved.candidates[0].backend == "cold"


def test_the_block_size_comes_from_the_config() -> None:
    messages = chat("Tell me about pumps. " * 40)
    texts = [m["content"] for m in messages]
    roles = [m["role"] for m in messages]
    default = features("llama-8b", texts, 64, True, {}, roles=roles)
    small = features("llama-8b", texts, 64, True, {}, roles=roles, block_bytes=BLOCK_BYTES // 4)
    assert len(small.prefix_blocks) >= 4 * len(default.prefix_blocks)
    assert small.block_tokens == pytest.approx(default.block_tokens / 4)
    assert small.preamble_blocks >= 4 * default.preamble_blocks > 0


def test_a_replica_learns_what_the_others_sent_and_skips_its_own_and_malformed_news() -> None:
    import orjson

    from gateway.fleet.prefix_share import PrefixShare

    learned: list[tuple[str, tuple[int, ...], float, int | None]] = []
    counts: dict[str, int] = {}

    def count(direction: str, prompts: int) -> None:
        counts[direction] = counts.get(direction, 0) + prompts

    share = PrefixShare("redis://unused", lambda b, k, t, c: learned.append((b, tuple(k), t, c)), count=count)
    # The conversation's key is the fourth item; an older replica sends three.
    share.apply(orjson.dumps({"s": "other", "m": [["x", 64.0, [1, 2, 3], 77], ["y", 60, [4]]]}))
    share.apply(orjson.dumps({"s": share.sender, "m": [["x", 64.0, [9]]]}))  # its own: already known
    bad_news = (
        b"not json", b'{"s": "other"}', orjson.dumps({"s": "o", "m": [["x", 64, ["k"]]]}),
        orjson.dumps({"s": "o", "m": [["x", 64, [1], "c"]]}),
    )  # fmt: skip
    for bad in bad_news:
        share.apply(bad)
    assert learned == [("x", (1, 2, 3), 64.0, 77), ("y", (4,), 60.0, None)]
    assert counts == {"received": 2, "malformed": 4}


def test_the_index_counts_the_conversations_whose_latest_prompt_it_holds() -> None:
    index = PrefixIndex(4 * 1024)
    first = chat("Conversation one: " + "the pump must be primed. " * 40)
    second = chat("Conversation two: " + "the valve must be closed. " * 40)
    for messages in (first, [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]):
        f = feats(messages)
        index.add(f.prefix_blocks, f.block_tokens, f.prefix_hash)
    assert index.conversations == 1  # two turns of one conversation
    f = feats(second)
    index.add(f.prefix_blocks, f.block_tokens, f.prefix_hash)
    assert index.conversations == 2
    index.add((), 40.0, 12345)  # a prompt shorter than a block: counted by its key alone
    assert index.conversations == 3
    # Evicted, a conversation is no longer held: a long prompt pushes the first two's blocks out (the
    # short one was sent less than the index's capacity ago: it would still be held).
    big = feats(chat("Another: " + "x y z " * 2400))
    index.add(big.prefix_blocks, big.block_tokens, big.prefix_hash)
    assert index.conversations == 2
    index.add(big.prefix_blocks, big.block_tokens, big.prefix_hash)
    assert index.conversations == 1
