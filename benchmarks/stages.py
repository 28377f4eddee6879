"""Where one request's CPU goes: the pipeline's stages timed in process, with no network.

The ASGI app driven directly (``benchmarks/asgi.py``) on uvloop, one request at a time, an engine
that answers at once (or, with ``--http``, the vLLM adapter to ``benchmarks/fake_engine.py`` over
loopback: then the attempt's time includes waiting for the engine). Each stage is the time between
entering and leaving one function of the pipeline, summed over the requests and divided by them; the
stages nest as listed (``attempt`` holds the adapter and its HTTP client), and what is left of the
request's CPU outside them is the ASGI entry, the request's lifecycle and the event loop. Wrapping a
function costs about 0.2 µs a call, within the noise of every stage.

    PYTHONPATH=$PWD python benchmarks/stages.py           # chat, whole answers
    PYTHONPATH=$PWD python benchmarks/stages.py --stream  # streamed
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.remove(str(Path(__file__).resolve().parent))  # benchmarks/routing.py would shadow routing/
sys.path.insert(
    len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]), str(Path(__file__).parents[1])
)

import uvloop

from benchmarks.asgi import started
from benchmarks.inprocess import _app, _one, finish
from gateway.http import exchange
from gateway.http.limits import tune_gc
from gateway.pipeline import dispatch, generation, lifecycle, serve

REQUESTS, WARMUP = 3000, 500

# (label, owner, attribute, coroutine): the stages, outermost first.
STAGES = [
    ("body read and parsed (orjson)", serve, "_json", True),
    ("body validated, request built (door)", generation.Generating, "understood", False),
    ("routing features (prompt, prefix blocks)", generation.Generation, "features", True),
    ("route: metrics, trace, decision log", serve, "_route", False),
    ("  choose() and the split", serve, "routed", False),
    ("attempt: adapter, HTTP client, parse", dispatch, "_attempt", True),
    ("answer shaped (OpenAI JSON)", generation.Generation, "whole", False),
    ("accounting (estimator, breaker, metrics, log)", lifecycle.RequestLife, "answered", False),
    ("response written", exchange.Exchange, "respond", True),
]


def _timed(spent: collections.Counter[str], label: str, fn: Callable[..., Any], coroutine: bool) -> Any:
    clock = time.perf_counter
    if coroutine:

        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            began = clock()
            try:
                return await fn(*args, **kwargs)
            finally:
                spent[label] += clock() - began

        return timed_async

    def timed(*args: Any, **kwargs: Any) -> Any:
        began = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += clock() - began

    return timed


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stream", action="store_true", help="streamed answers (default: whole)")
    parser.add_argument("--http", action="store_true", help="the vLLM adapter to benchmarks/fake_engine.py")
    args = parser.parse_args()
    spent: collections.Counter[str] = collections.Counter()
    for label, owner, name, coroutine in STAGES:
        setattr(owner, name, _timed(spent, label, getattr(owner, name), coroutine))
    engines, url = [], None
    if args.http:
        from benchmarks.overhead import start_fake_engine

        port = 18000 + os.getpid() % 1000
        engines, url = start_fake_engine(port), f"http://127.0.0.1:{port}"
    app = _app(None, 1.0, url)
    task = await started(app)
    tune_gc()  # the collector as `serve` sets it
    for _ in range(WARMUP):
        await _one(app, args.stream)
    spent.clear()
    cpu = time.process_time()
    for _ in range(REQUESTS):
        await _one(app, args.stream)
    total = (time.process_time() - cpu) / REQUESTS * 1e6
    stages = {label: round(spent[label] / REQUESTS * 1e6, 1) for label, *_ in STAGES}
    print(json.dumps({"stream": args.stream, "http": args.http, "cpu_us_per_request": round(total, 1), **stages}))
    finish(task, engines)


if __name__ == "__main__":
    uvloop.run(main())
