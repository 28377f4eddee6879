"""Stay or move, decided in time and capacity, and bounded loads (issue 24): choose() on hand-built
snapshots whose caches come from the real prefix index."""

from __future__ import annotations

from dataclasses import replace

from routing.catalog import GPUS
from routing.explain import render, to_dict
from routing.policy import choose
from routing.rules import Rules
from routing.types import BackendState, FleetSnapshot, ModelSpec
from tests.unit.test_prefix import LLAMA_8B, _holding, chat, feats, state

TINY = ModelSpec("llama-8b", 0.5, 2, 32768, 12288)
"""A 0.5B model: prefill is cheap, so the time a hit saves is small beside a shared batch."""
MANUAL = "Summarise this manual: " + "The pump must be primed before use. " * 600


def _turn() -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    history = chat(MANUAL)
    return history, [*history, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "And valves?"}]


def _fleet(*states: BackendState) -> FleetSnapshot:
    return FleetSnapshot(states, {"llama-8b": LLAMA_8B})


def test_a_conversation_stays_home_while_its_cached_prefill_saves_more_than_the_queue_there_costs() -> None:
    history, turn = _turn()
    f = feats(turn)
    # Another conversation's request is running at home, the other backend is idle: the ~5,700 cached
    # tokens save more time than sharing the batch costs, so the turn stays.
    home = state("home", running=1, prefix=_holding(history))
    decision = choose(f, _fleet(state("cold"), home), Rules())
    first, cold = decision.candidates
    assert first.backend == "home" and first.prediction.ttft_ms < cold.prediction.ttft_ms
    assert first.saved_ms > 0 and first.saved_gpu_ms > 0 and cold.saved_ms == 0
    # Prompts queued for prefill at home: waiting behind them now costs more than prefilling it all
    # elsewhere, and it moves.
    queued = replace(home, prefill_backlog_tokens=3 * f.prompt_tokens)
    moved = choose(f, _fleet(state("cold"), queued), Rules())
    assert [c.backend for c in moved.candidates] == ["cold", "home"]
    assert moved.candidates[0].prediction.ttft_ms < moved.candidates[1].prediction.ttft_ms


def _unpriced(s: BackendState, **kw: object) -> BackendState:
    """No cost_per_hour: only time and GPU work decide (as on engines nobody priced)."""
    return replace(s, profile=replace(s.profile, cost_per_hour=0.0), **kw)  # type: ignore[arg-type]


def test_on_a_busy_fleet_the_gpu_time_a_miss_costs_keeps_the_conversation_home() -> None:
    history, turn = _turn()
    f = feats(turn)
    held = _holding(history)
    # Home is a little slower for this request alone (prompts queued there), but moving prefills the
    # whole history again: on an idle fleet that costs nobody, on a full one it delays everyone.
    backlog = f.prompt_tokens + f.prompt_tokens // 4
    pair = (_unpriced(state("cold")), _unpriced(state("home", prefix=held), prefill_backlog_tokens=backlog))
    idle = choose(f, _fleet(*pair), Rules())
    assert idle.candidates[0].backend == "cold" and idle.candidates[0].capacity_ms == 0
    full = [replace(s, running=64) for s in pair]
    busy = choose(f, _fleet(*full), Rules())
    by_name = {c.backend: c for c in busy.candidates}
    assert by_name["cold"].prediction.ttft_ms < by_name["home"].prediction.ttft_ms
    assert busy.candidates[0].backend == "home"
    assert by_name["cold"].capacity_ms > 0.5 * by_name["home"].saved_gpu_ms and by_name["home"].capacity_ms == 0


def test_bounded_load_caps_a_hot_home() -> None:
    history, turn = _turn()
    f = feats(turn)
    hot = state("hot", running=30, prefix=_holding(history))
    fleet = _fleet(hot, state("b", running=5), state("c", running=5))
    # Unbounded, the cached history wins: slots are free everywhere, nothing queues.
    assert choose(f, fleet, Rules(load_bound=10.0)).candidates[0].backend == "hot"
    # 41 in flight with this one, a fair share of 13.7 each: at most 18 on one backend, and one more
    # for a conversation's home.
    decision = choose(f, fleet, Rules())
    hot_c = next(c for c in decision.candidates if c.backend == "hot")
    assert decision.candidates[0].backend in ("b", "c")
    assert hot_c.over_bound and hot_c.bound == 19 and hot_c.in_flight == 30 and hot_c.saved_ms > 0
    assert to_dict(decision, f, Rules())["candidates"][-1]["over_bound"] is True
    assert "31/19!" in render(decision, f, fleet, Rules())
    # every backend over its bound: none is
    crowded = _fleet(hot, state("b", running=30), state("c", running=30))
    assert choose(f, crowded, Rules()).candidates[0].backend == "hot"


def test_three_concurrent_sessions_on_three_idle_backends_spread_one_per_backend_and_stay() -> None:
    indexes = {name: _holding([], capacity=1e6) for name in ("a", "b", "c")}
    sessions = [chat(f"Session {i}: tell me about pump model {i}. " * 20) for i in range(3)]
    where: dict[int, list[str]] = {i: [] for i in range(3)}
    for turn in range(6):
        for i, messages in enumerate(sessions):
            # Three clients: each sends its next turn while the other two wait for their answers.
            in_flight = {name: 0 for name in indexes}
            for j in range(3):
                if j != i and where[j] and (turn > 0 or j < i):
                    in_flight[where[j][-1]] += 1
            fleet = _fleet(*(state(n, running=in_flight[n], prefix=indexes[n]) for n in indexes))
            f = feats(messages)
            chosen = choose(f, fleet, Rules()).candidates[0].backend
            indexes[chosen].add(f.prefix_blocks, f.block_tokens)
            where[i].append(chosen)
            answer = {"role": "assistant", "content": "Noted. " * 30}
            sessions[i] = [*messages, answer, {"role": "user", "content": "More?"}]
    assert sorted(w[0] for w in where.values()) == ["a", "b", "c"]
    assert all(len(set(w)) == 1 for w in where.values()), where


def _llama_server(name: str, running: int, prefix: object = None) -> BackendState:
    """A CPU llama-server with four slots and a small model (prefill in tens of ms per 1,000 tokens)."""
    s = state(name, running=running, prefix=prefix)  # type: ignore[arg-type]
    profile = replace(s.profile, engine="llama_server", gpu=GPUS["CPU"], memory_gb=16.0, max_concurrency=4)
    return replace(s, profile=profile, running=running)


def test_a_few_requests_in_flight_never_force_a_conversation_off_its_cache() -> None:
    # Three concurrent clients on three llama-servers: a turn whose home serves another client's
    # request, the other backends idle or serving one. The load term sent these turns away (reuse
    # 1.00x round robin's); a bound without a spare request rounds to one and would as well.
    history = chat("Task: " + "call the tools in turn and report what they return. " * 10)
    f = feats([*history, {"role": "assistant", "content": "ok " * 50}, {"role": "user", "content": "Next?"}])
    for at_home, elsewhere in ((1, 0), (2, 0), (1, 1)):
        fleet = FleetSnapshot(
            (
                _llama_server("home", at_home, _holding(history)),
                _llama_server("b", elsewhere),
                _llama_server("c", 0),
            ),
            {"llama-8b": TINY},
        )
        decision = choose(f, fleet, Rules())
        assert decision.candidates[0].backend == "home", (at_home, elsewhere, decision.candidates)
        assert not decision.candidates[0].over_bound


def _sessions_held(n: int, start: int) -> tuple[object, list[list[dict[str, str]]]]:
    """A llama-server-sized index holding the opening turns of ``n`` conversations."""
    index = _holding([], capacity=1e6)
    sessions = [chat(f"Session {start + i}: check the tool output of build {start + i}. " * 6) for i in range(n)]
    for messages in sessions:
        f = feats(messages)
        index.add(f.prefix_blocks, f.block_tokens, f.prefix_hash)
    return index, sessions


def test_a_new_conversation_goes_where_fewer_conversations_live_not_where_a_client_just_finished() -> None:
    # Six clients, eight sessions, three 3-slot engines: the first six conversations spread two a
    # backend; the seventh went to "x" when its client finished there. The eighth arrives when x's other
    # client finishes: x has the fewest requests in flight but already holds three of its three slots'
    # conversations (placed by requests in flight, it went there in 2 of 5 real runs, and every turn
    # then evicted another session's history).
    x, x_sessions = _sessions_held(3, 0)
    y, _ = _sessions_held(2, 3)
    z, _ = _sessions_held(2, 5)
    assert (x.conversations, y.conversations, z.conversations) == (3, 2, 2)  # type: ignore[attr-defined]
    fleet = FleetSnapshot(
        (
            replace(_llama_server("x", 1, x), profile=replace(_llama_server("x", 1).profile, max_concurrency=3)),
            replace(_llama_server("y", 2, y), profile=replace(_llama_server("y", 2).profile, max_concurrency=3)),
            replace(_llama_server("z", 2, z), profile=replace(_llama_server("z", 2).profile, max_concurrency=3)),
        ),
        {"llama-8b": TINY},
    )
    f = feats(chat("Session 7: check the tool output of build 7. " * 6))
    decision = choose(f, fleet, Rules())
    by_name = {c.backend: c for c in decision.candidates}
    assert decision.candidates[0].backend in ("y", "z"), decision.candidates
    assert by_name["x"].over_bound and by_name["x"].terms["conversations"] == 3
    assert "convs" in render(decision, f, fleet, Rules())
    # A continuing conversation of x's is not moved by it: the bound on conversations is for new ones.
    turn = [*x_sessions[0], {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Next?"}]
    assert choose(feats(turn), fleet, Rules()).candidates[0].backend == "x"
