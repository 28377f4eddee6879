"""Gateway CPU per request with no network: the ASGI app driven directly, a scripted engine answering
16 tokens at once; chat, whole and streamed. Isolates the gateway's own work from wrk, sockets and
process wake-ups (``benchmarks/overhead.py`` measures all of it together).

    python benchmarks/inprocess.py                 # this tree
    PYTHONPATH=/path/to/other/tree python benchmarks/inprocess.py   # another checkout, same venv
    python benchmarks/inprocess.py --otlp http://127.0.0.1:4318     # tracing on, spans sent there
                                                   # (a collector, or ``python -m tests.otlp 4318``)
    python benchmarks/inprocess.py --http          # the vLLM adapter to benchmarks/fake_engine.py over
                                                   # loopback: the adapter's client and parser counted too

Prints the best-of-five CPU microseconds per request (1,000 requests each) as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

# The tree's packages, not this folder's scripts (benchmarks/routing.py would shadow routing/). A
# PYTHONPATH given on the command line still comes first.
if str(Path(__file__).resolve().parent) in sys.path:  # run as a script (benchmarks/stages.py imports it)
    sys.path.remove(str(Path(__file__).resolve().parent))
sys.path.insert(
    len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]), str(Path(__file__).parents[1])
)

from benchmarks.asgi import CONFIG, Fast, post, started
from gateway.app import create_app
from gateway.config import load_config
from gateway.http.limits import tune_gc

REPEATS, REQUESTS, WARMUP = 5, 1000, 300


def _app(otlp: str | None, sampling: float, engine_url: str | None) -> Any:
    config = Path(tempfile.mkdtemp()) / "bench.yaml"
    telemetry = f"telemetry: {{otlp_endpoint: '{otlp}', sampling_ratio: {sampling}}}\n" if otlp else ""
    if engine_url is not None:  # the config's own vLLM backend, at the fake engine
        config.write_text(CONFIG.replace("http://127.0.0.1:9", engine_url) + telemetry)
        return create_app(load_config(config))
    config.write_text(CONFIG + telemetry)
    return create_app(load_config(config), lambda cfg, loaded: Fast(cfg.name, cfg.model))


async def _one(app: Any, stream: bool) -> None:
    body = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 16, "stream": stream}
    )
    status = await post(app, "/v1/chat/completions", body)
    assert status == 200, status


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--otlp", metavar="URL", help="tracing on: telemetry.otlp_endpoint (default off)")
    parser.add_argument("--sampling", type=float, default=1.0, help="telemetry.sampling_ratio with --otlp")
    parser.add_argument("--http", action="store_true", help="the vLLM adapter to benchmarks/fake_engine.py")
    args = parser.parse_args()
    engine_url, engines = None, []
    if args.http:
        from benchmarks.overhead import start_fake_engine

        port = 18000 + os.getpid() % 1000
        engines = start_fake_engine(port)  # its CPU is its own process's: process_time counts only the gateway
        engine_url = f"http://127.0.0.1:{port}"
    app = _app(args.otlp, args.sampling, engine_url)
    task = await started(app)
    tune_gc()  # the collector as `serve` sets it
    for _ in range(WARMUP):
        await _one(app, False)
        await _one(app, True)
    # With tracing on, each run's spans are sent before its clock stops (and the warm-up's before it
    # starts): the exporter's thread is part of the cost. process_time counts every thread.
    flush = app.state.tracing.provider.force_flush if args.otlp else lambda: True
    best: dict[str, float] = {}
    for stream in (False, True):
        runs = []
        for _ in range(REPEATS):
            flush()
            t = time.process_time()
            for _ in range(REQUESTS):
                await _one(app, stream)
            flush()
            runs.append((time.process_time() - t) / REQUESTS * 1e6)
        best["stream_us" if stream else "whole_us"] = round(min(runs), 1)
    import gateway.app

    tracing = {"otlp": args.otlp, "sampling": args.sampling} if args.otlp else {}
    mode = {"engine": "http"} if args.http else {}
    print(json.dumps({"tree": str(Path(gateway.app.__file__).parents[1]), **tracing, **mode, **best}))
    finish(task, engines)


def finish(task: asyncio.Task[None], engines: list[subprocess.Popen[bytes]]) -> None:
    """The run is over: the engines stop, and the process ends here (the fleet's poller and the app's
    lifespan need no orderly end)."""
    task.cancel()
    for proc in engines:
        proc.terminate()
    os._exit(0)


if __name__ == "__main__":
    asyncio.run(main())
