"""The circuit breaker opens on consecutive engine failures, recovers in about a second after a blip,
backs off when recovery fails, and closes again on successful probes."""

from __future__ import annotations

from gateway.fleet.breaker import CircuitBreaker
from routing.types import Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_failure_blip_costs_about_a_second_not_ten() -> None:
    clock = Clock()
    b = CircuitBreaker("e", threshold=5, cooldown_s=1.0, clock=clock)
    for _ in range(5):
        b.failure()
    assert b.current() == (Breaker.OPEN, 0.0)
    clock.now = 1.0
    assert b.current()[0] is Breaker.HALF_OPEN
    for _ in range(4):  # 0.1 -> 0.2 -> 0.4 -> 0.8 -> closed
        b.success()
    assert b.current() == (Breaker.CLOSED, 1.0)


def test_a_failed_recovery_doubles_the_cooldown_up_to_its_cap_and_closing_resets_it() -> None:
    clock = Clock()
    b = CircuitBreaker("e", threshold=1, cooldown_s=1.0, max_cooldown_s=4.0, clock=clock)
    b.failure()
    waits = []
    for _ in range(4):
        start = clock.now
        while b.current()[0] is Breaker.OPEN:
            clock.now += 0.25
        waits.append(clock.now - start)
        b.failure()  # the probes fail: open again, for longer
        b.failure()
    assert waits == [1.0, 2.0, 4.0, 4.0]
    while b.current()[0] is Breaker.OPEN:
        clock.now += 0.25
    for _ in range(4):
        b.success()
    assert b.current()[0] is Breaker.CLOSED
    b.failure()
    assert b.current_cooldown_s == 1.0


def test_successes_between_failures_keep_it_closed() -> None:
    b = CircuitBreaker("e", threshold=3, clock=Clock())
    for _ in range(10):
        b.failure()
        b.failure()
        b.success()
    assert b.current()[0] is Breaker.CLOSED


def test_one_stray_failure_while_recovering_is_forgiven_two_that_outnumber_successes_are_not() -> None:
    clock = Clock()
    b = CircuitBreaker("e", threshold=1, clock=clock)
    b.failure()
    clock.now = 1.0
    assert b.current()[0] is Breaker.HALF_OPEN
    b.failure()  # a fault of one request, not of the engine
    b.success()
    b.success()
    b.failure()  # two failures, two successes: still recovering
    assert b.current()[0] is Breaker.HALF_OPEN
    b.success()
    b.success()
    assert b.current()[0] is Breaker.CLOSED
    b.failure()
    clock.now = 2.0
    assert b.current()[0] is Breaker.HALF_OPEN
    b.failure()
    b.failure()
    assert b.current()[0] is Breaker.OPEN
