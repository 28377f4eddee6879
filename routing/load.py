"""How busy a backend is now, from the engine's last reported gauges and the gateway's own count.

Engines report running and waiting requests when polled, every few seconds. Between
polls, every request this gateway sends or finishes changes the truth, and routing on
the last poll alone sends every request of the interval to whichever backend looked
idlest (herding). So the engine's figures are moved by the change in this gateway's
own in-flight count since the poll; they never fall below that count, which is exact
for this gateway's traffic. Without (fresh) engine figures, the gateway's count is all
there is.
"""

from __future__ import annotations


def current(
    polled_running: int | None,
    polled_waiting: int | None,
    in_flight_at_poll: int,
    in_flight: int,
    max_concurrency: int,
) -> tuple[int, int]:
    """(running, waiting) as routing should see them; ``polled_*`` None when the figures are missing or stale."""
    if polled_running is None:
        total = in_flight
    else:
        total = max(in_flight, polled_running + (polled_waiting or 0) + in_flight - in_flight_at_poll)
    running = min(total, max_concurrency)
    return running, total - running
