"""Soak: the gateway under steady mixed load for a long time, watched for leaks (not part of CI).

    python benchmarks/overhead.py --soak 600 [--out benchmarks/results/soak.md]

wrk drives streaming and non-streaming chat through the gateway to the fast fake engine in 30 s
rounds, while a thread of clients leaves streams after their first chunk (so cancellation runs all
the time). Between rounds it samples the gateway's RSS and open file descriptors (from /proc),
its asyncio tasks and requests in flight (from /metrics). At the end it checks that nothing was
lost (wrk saw no errors, every request the clients finished was counted) and that RSS, fds and
tasks are flat: the last samples within a margin of those after the warm-up round.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.overhead import Run, rss_mb, start_fake_engine, start_gateway, wrk

ROUND_S = 30.0
RSS_MARGIN_MB = 15.0
FD_MARGIN = 20
TASK_MARGIN = 20


@dataclass
class Sample:
    at_s: float
    rss_mb: float
    fds: int
    tasks: float
    in_flight: float


def _metric(text: str, name: str) -> float:
    values = [float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
    return sum(values)


def _sample(pid: int, gateway: str, started: float) -> Sample:
    text = httpx.get(f"{gateway}/metrics", timeout=10).text
    return Sample(
        at_s=time.monotonic() - started,
        rss_mb=rss_mb(pid),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        tasks=_metric(text, "enginegate_event_loop_tasks"),
        in_flight=_metric(text, "enginegate_requests_in_flight"),
    )


def _leavers(gateway: str, model: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """Streams abandoned after their first chunk, back to back."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            try:
                with client.stream("POST", f"{gateway}/v1/chat/completions", json=body) as resp:
                    next(resp.iter_raw())
                counts["left"] += 1
            except (httpx.HTTPError, StopIteration):
                counts["failed"] += 1
            time.sleep(0.02)


def soak(seconds: float, model: str, engine_port: int, gateway_port: int, out: Path | None) -> None:
    procs = start_fake_engine(engine_port)
    engine = f"http://127.0.0.1:{engine_port}"
    gw = start_gateway(engine, model, gateway_port)
    procs.append(gw)
    gateway = f"http://127.0.0.1:{gateway_port}"
    url = f"{gateway}/v1/chat/completions"
    bodies = [
        json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream})
        for stream in (False, True)
    ]
    samples: list[Sample] = []
    runs: list[Run] = []
    counts = {"left": 0, "failed": 0}
    stop = threading.Event()
    started = time.monotonic()
    leaver = threading.Thread(target=_leavers, args=(gateway, model, stop, counts), daemon=True)
    try:
        samples.append(_sample(gw.pid, gateway, started))
        leaver.start()
        with ThreadPoolExecutor(2) as pool:
            while time.monotonic() - started < seconds:
                left = seconds - (time.monotonic() - started)
                length = max(1.0, min(ROUND_S, left))
                rounds = [pool.submit(wrk, url, body, 16, length) for body in bodies]
                runs += [r.result() for r in rounds]
                samples.append(_sample(gw.pid, gateway, started))
        stop.set()
        leaver.join(timeout=15)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and samples[-1].in_flight > 0:
            time.sleep(0.2)
            samples.append(_sample(gw.pid, gateway, started))
        final = httpx.get(f"{gateway}/metrics", timeout=10).text
    finally:
        stop.set()
        for p in reversed(procs):  # the gateway first: the engine going away is no news for this run
            p.terminate()
            p.wait(timeout=30)
    served = sum(r.requests for r in runs)
    errors = sum(r.errors + r.socket_errors for r in runs)
    ok_counted = sum(
        float(v) for v in re.findall(r'^enginegate_requests_total\{[^}]*outcome="ok"[^}]*\} (\S+)$', final, re.M)
    )
    base = samples[1] if len(samples) > 2 else samples[0]  # after the warm-up round
    end = samples[-1]
    flat = (
        end.rss_mb - base.rss_mb <= RSS_MARGIN_MB
        and end.fds - base.fds <= FD_MARGIN
        and end.tasks - base.tasks <= TASK_MARGIN
        and end.in_flight == 0
    )
    lines = [
        f"Soak: {seconds:g} s of wrk (16 clients streaming, 16 not, {ROUND_S:g} s rounds) plus clients leaving "
        f"streams after the first chunk; fake engine, {os.cpu_count()} cores shared.",
        "",
        "| t (s) | RSS MB | fds | asyncio tasks | in flight |",
        "|---|---|---|---|---|",
        *(f"| {s.at_s:.0f} | {s.rss_mb:.1f} | {s.fds} | {s.tasks:.0f} | {s.in_flight:.0f} |" for s in samples),
        "",
        f"Requests completed by wrk: {served:,}; wrk errors (non-2xx, socket errors, timeouts): {errors}; "
        f"streams left early: {counts['left']:,} ({counts['failed']} failed); "
        f"counted ok by the gateway: {ok_counted:,.0f} (wrk's, plus streams left early that the engine had "
        "already finished, plus those in flight at each round's end, which wrk does not count).",
        f"After warm-up to the end: RSS {base.rss_mb:.1f} -> {end.rss_mb:.1f} MB, fds {base.fds} -> {end.fds}, "
        f"tasks {base.tasks:.0f} -> {end.tasks:.0f}: {'flat' if flat else 'NOT FLAT'}; "
        f"{'nothing lost' if errors == 0 and counts['failed'] == 0 else 'REQUESTS LOST'}.",
    ]
    table = "\n".join(lines)
    print(table)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table + "\n")
