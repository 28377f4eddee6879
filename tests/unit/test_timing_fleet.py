"""The real-engine harness's pure parts (tests/timing_fleet.py): the sessions every placement is given,
the client-side placements it compares the gateway with, and what a run reports."""

from __future__ import annotations

import itertools

from tests.timing_fleet import (
    Answer,
    CacheAware,
    LeastBusy,
    RoundRobin,
    Run,
    Target,
    Workload,
    common_prefix,
    prompt_text,
    schedule,
    sessions,
)

URLS = ("http://a", "http://b", "http://c")


def test_sessions_are_the_same_every_time_and_each_turn_extends_the_last() -> None:
    w = Workload(sessions=3, turns=3)
    made = sessions(w)
    assert made == sessions(w) and made != sessions(Workload(sessions=3, turns=3, seed=1))
    for turns in made:
        assert len(turns) == 3
        for before, after in itertools.pairwise(turns):
            assert after[: len(before)] == before and len(after) == len(before) + 2
    assert len({turns[0][0]["content"] for turns in made}) == 1  # one shared preamble
    assert len({turns[0][1]["content"] for turns in made}) == 3  # each session its own task
    order = schedule(w)
    assert sorted(order) == [(s, t) for s in range(3) for t in range(3)]
    assert [t for _, t in order] == sorted(t for _, t in order)  # every turn t before any turn t + 1


def test_common_prefix_is_the_longest_shared_start() -> None:
    assert [common_prefix(a, b) for a, b in (("abc", "abd"), ("abc", "abc"), ("", "x"), ("xa", "ya"))] == [2, 3, 0, 0]
    assert common_prefix("a" * 1000 + "b", "a" * 1000 + "c") == 1000


def test_the_cache_aware_baseline_follows_the_longest_match_above_half_else_the_smallest_tree() -> None:
    policy = CacheAware(URLS)
    first = policy.open(0, "p" * 10 + "session one" * 10)
    policy.close(first)
    second = policy.open(0, "p" * 10 + "session two" * 10)  # shares a tenth: the engines holding least text
    assert second.engine != first.engine
    policy.close(second)
    again = policy.open(0, "p" * 10 + "session one" * 10 + "turn two")
    assert again.engine == first.engine


def test_least_busy_takes_the_emptiest_engine_and_rotates_among_equals() -> None:
    policy = LeastBusy(URLS)
    picked = []
    for _ in range(3):
        target = policy.open(0, "x")
        picked.append(target.engine)
        policy.close(target)
    assert sorted(p for p in picked if p is not None) == [0, 1, 2]
    held = policy.open(0, "x")
    assert policy.open(0, "x").engine != held.engine


def test_round_robin_cycles_over_the_scheduled_order() -> None:
    policy = RoundRobin(URLS)
    assert [policy.open(p, "x").engine for p in (0, 1, 2, 3, 7)] == [0, 1, 2, 0, 1]


def test_a_run_counts_moves_placement_and_budgets() -> None:
    answers = [
        Answer(0, 0, 0, "a", 1.0), Answer(0, 1, 0, "b", 2.0), Answer(0, 2, 1, "c", 9.0),
        Answer(1, 0, 1, "d", 1.0), Answer(1, 1, 2, "e", 1.0), Answer(1, 2, 2, "f", 1.0),
    ]  # fmt: skip
    counters = [{"prompt_tokens_cached_total": 10.0, "prompt_tokens_total": 30.0}] * 3
    run = Run("x", 2, answers, counters, budget_ms=5000)
    assert run.moves == 2 and run.requests == [2, 2, 2] and run.reused == 30
    assert run.sessions_per_engine == [1, 1, 0]
    assert run.met == 5 / 6 and run.ttft(0.5) == 1.0 and run.ttft(0.99) == 9.0
    assert run.row()["requests_max_over_mean"] == 1.0


def test_prompt_text_keeps_roles_apart() -> None:
    user = prompt_text([{"role": "user", "content": "hi"}])
    assert user != prompt_text([{"role": "system", "content": "hi"}]) and user.startswith("user")
    assert isinstance(Target("u", None), Target)
