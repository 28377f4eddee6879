"""Does shadow traffic slow the primary? The ASGI app driven in process (no sockets), a primary engine and
a candidate that both pace their tokens (``--token-ms``, the candidate ``--candidate-ms``) after a
prefill (``--first-ms``, both), the same requests with the rule's ``shadow`` off and at ``share: 1.0``
(every request mirrored), alternated so drift hits both alike.

    python benchmarks/shadow.py [--requests 300] [--repeats 3] [--first-ms 20] [--token-ms 1] [--candidate-ms 2]

Prints JSON: per mode and concurrency, the primary's p50 and p99 end-to-end (whole answers) and time to
first token (streams) in ms, the medians over the repeats, and the gateway's CPU per client request in
microseconds (with shadows on it includes the mirrored request's: the price of the experiment).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

sys.path.remove(str(Path(__file__).resolve().parent))
sys.path.insert(
    len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]), str(Path(__file__).parents[1])
)

from backends.base import Chunk, GenerationRequest, Usage
from benchmarks.asgi import Fast, post, started
from gateway.app import create_app
from gateway.config import load_config

CONFIG = """
models: [{{name: m, params_b: 8}}]
backends:
  - {{name: primary, engine: vllm, url: 'http://127.0.0.1:9', model: m, gpu: H100}}
  - {{name: candidate, engine: trtllm_serve, url: 'http://127.0.0.1:9', model: m, gpu: H100}}
routing:
  rules: [{{name: r, require: [primary]{shadow}}}]
"""


class Paced(Fast):
    """``Fast``, with a prefill of ``first_s`` and a pause before each token, as an engine decoding at
    ``token_s`` per token."""

    def __init__(self, name: str, model: str, first_s: float, token_s: float) -> None:
        super().__init__(name, model)
        self.first_s, self.token_s = first_s, token_s

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        await asyncio.sleep(self.first_s)
        for _ in range(self.tokens):
            await asyncio.sleep(self.token_s)
            yield Chunk(text=" tok")
        yield Chunk(finish_reason="stop", usage=Usage(5, self.tokens))


class _Stamped(list[bytes]):
    """A response body that notes when its first piece was written."""

    first = 0.0

    def append(self, item: bytes) -> None:
        if not self.first:
            self.first = time.perf_counter()
        super().append(item)


def _app(shadow: bool, first_s: float, token_s: float, candidate_s: float) -> Any:
    config = Path(tempfile.mkdtemp()) / "bench.yaml"
    rule = ", shadow: {to: candidate, share: 1.0, max_concurrency: 64}" if shadow else ""
    config.write_text(CONFIG.format(shadow=rule))
    pace = {"primary": token_s, "candidate": candidate_s}
    return create_app(load_config(config), lambda cfg, loaded: Paced(cfg.name, cfg.model, first_s, pace[cfg.name]))


async def _one(app: Any, stream: bool) -> float:
    body = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 16, "stream": stream}
    )
    out = _Stamped()
    start = time.perf_counter()
    assert await post(app, "/v1/chat/completions", body, out) == 200
    return ((out.first if stream else time.perf_counter()) - start) * 1000


async def _run(app: Any, stream: bool, requests: int, concurrency: int) -> tuple[list[float], float]:
    times: list[float] = []

    async def client() -> None:
        for _ in range(requests // concurrency):
            times.append(await _one(app, stream))

    cpu = time.process_time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return times, (time.process_time() - cpu) / len(times) * 1e6


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> None:
    apps = {
        mode: _app(mode == "on", args.first_ms / 1000, args.token_ms / 1000, args.candidate_ms / 1000)
        for mode in ("off", "on")
    }
    for app in apps.values():
        await started(app)
        for _ in range(50):
            await _one(app, False)
    results: dict[str, Any] = {}
    for concurrency in (1, 8):
        for stream in (False, True):
            what = "ttft" if stream else "e2e"
            runs: dict[str, list[tuple[float, float, float]]] = {"off": [], "on": []}
            for _ in range(args.repeats):
                for mode, app in apps.items():
                    times, cpu = await _run(app, stream, args.requests, concurrency)
                    runs[mode].append((_p(times, 0.5), _p(times, 0.99), cpu))
                    if app.state.shadows.tasks:  # the mirrored requests end before the next run
                        await asyncio.wait(list(app.state.shadows.tasks))
            for mode, rows in runs.items():
                results[f"c{concurrency}_{what}_{mode}"] = {
                    "p50_ms": round(statistics.median(r[0] for r in rows), 3),
                    "p99_ms": round(statistics.median(r[1] for r in rows), 3),
                    "cpu_us": round(statistics.median(r[2] for r in rows), 1),
                }
    print(json.dumps(results, indent=1))
    os._exit(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--first-ms", type=float, default=20.0)
    parser.add_argument("--token-ms", type=float, default=1.0)
    parser.add_argument("--candidate-ms", type=float, default=2.0)
    asyncio.run(main(parser.parse_args()))
