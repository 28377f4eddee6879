"""Waiting in tests: poll a condition until a deadline, never a fixed sleep.

``wait_until`` for synchronous tests, ``eventually`` inside a running event loop.
Both return as soon as the condition holds and fail with ``message`` at the deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
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
