"""Waiting in tests: poll a condition until a deadline, never a fixed sleep.

``wait_until`` for synchronous tests, ``eventually`` inside a running event loop (``eventually_async`` when
the condition itself must be awaited). Each returns as soon as the condition holds and fails with
``message`` at the deadline. ``passes`` polls an asserting check until it stops raising. ``settles`` is
for proving something stops happening: it returns once a reading stays put for a quiet window, and fails
if it is still moving at the deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, message: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(message or f"condition not met within {timeout}s")
        time.sleep(interval)


async def eventually(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, message: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(message or f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


async def eventually_async(
    condition: Callable[[], Awaitable[T]],
    timeout: float = 10.0,
    interval: float = 0.01,
    message: str | Callable[[], str] = "",
) -> T:
    """``eventually`` for a condition that is a coroutine (an engine endpoint read, say). ``message`` may
    be a callable, evaluated at the deadline, to report the last thing the condition saw."""
    deadline = time.monotonic() + timeout
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(text or f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def passes(check: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> None:
    """Runs the asserting ``check`` until it no longer raises AssertionError; at the deadline its last
    failure propagates, with the check's own message."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(interval)


def settles(
    read: Callable[[], T], quiet_s: float = 0.3, timeout: float = 10.0, interval: float = 0.02, message: str = ""
) -> T:
    """The value of ``read`` once it has not changed for ``quiet_s``; fails if it is still changing at the
    deadline. What a test that must show something stopped (a token counter, say) waits with."""
    deadline = time.monotonic() + timeout
    value, since = read(), time.monotonic()
    while True:
        time.sleep(interval)
        now, current = time.monotonic(), read()
        if current != value:
            value, since = current, now
        elif now - since >= quiet_s:
            return value
        if now >= deadline:
            raise AssertionError(f"{message or 'still changing'} after {timeout}s (last value {value!r})")
