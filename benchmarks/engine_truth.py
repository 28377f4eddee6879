"""What the simulator's ground truth assumes, measured on a real engine: step noise, the per-sequence
cost of a decode batch and prefill/decode interference, on llama-server serving the timing model.

``routing/sim/truth.py`` adds to the published-number physics a step noise (``NOISE_SIGMA``), a
per-sequence cost (``SEQ_OVERHEAD_MS``) and an interference share (``INTERFERENCE``) that no
published table states. This measures the same three quantities on one llama-server (one thread,
the deterministic 137M timing model from ``tools/build_timing_model.py``), from the token events of
its streams as a client sees them, so the assumed constants can be set beside a measurement. A CPU
engine is not a GPU: the measured values bound the shapes (how large a per-step spread, how much a
prefill in the batch delays decoding), not the GPU constants themselves.

    python benchmarks/engine_truth.py [--out benchmarks/results/engine_truth.md]
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from routing.sim.truth import INTERFERENCE, NOISE_SIGMA, SEQ_OVERHEAD_MS
from tests.timing_fleet import timing_engines

DECODE_TOKENS = 64
"""Tokens per decode measurement (ignoring end of sequence: the timing model's answers are noise)."""
VOCAB = 730
"""The timing model's vocabulary (the demo tokenizer's); prompts are random ids above its specials."""


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(16, VOCAB) for _ in range(n)]


def stream(
    url: str, prompt: list[int], n: int, arrivals: list[float] | None = None
) -> tuple[list[float], dict[str, Any]]:
    """One uncached completion: the arrival time of each token event (appended to ``arrivals`` as
    they come, when given), and the engine's timings."""
    body = {"prompt": prompt, "n_predict": n, "stream": True, "cache_prompt": False, "ignore_eos": True,
            "temperature": 0}  # fmt: skip
    arrivals = [] if arrivals is None else arrivals
    timings: dict[str, Any] = {}
    with httpx.Client(timeout=600) as client, client.stream("POST", f"{url}/completion", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            doc = orjson.loads(line[6:])
            if doc.get("content") or doc.get("tokens"):
                arrivals.append(time.monotonic())
            if doc.get("stop"):
                timings = doc.get("timings", {})
    return arrivals, timings


def gaps(arrivals: list[float]) -> list[float]:
    """Milliseconds between consecutive tokens, the first (prefill) left out."""
    return [(b - a) * 1000 for a, b in itertools.pairwise(arrivals[1:])]


def noise(url: str, rng: random.Random, runs: int) -> tuple[float, float, float]:
    """(median decode step ms, sigma of log step time about its run's median, run-to-run CV of the mean)."""
    logs: list[float] = []
    means: list[float] = []
    medians: list[float] = []
    for _ in range(runs):
        g = gaps(stream(url, _tokens(rng, 64), DECODE_TOKENS)[0])
        m = statistics.median(g)
        medians.append(m)
        means.append(statistics.fmean(g))
        logs += [math.log(x / m) for x in g if x > 0]
    return statistics.median(medians), statistics.pstdev(logs), statistics.pstdev(means) / statistics.fmean(means)


def batch(url: str, rng: random.Random, size: int) -> float:
    """Median decode step (ms) with ``size`` sequences decoding together."""
    results: list[list[float]] = [[] for _ in range(size)]
    prompts = [_tokens(rng, 64) for _ in range(size)]

    def one(i: int) -> None:
        results[i] = gaps(stream(url, prompts[i], DECODE_TOKENS)[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    middle = [g[len(g) // 4 : 3 * len(g) // 4] for g in results]  # all decoding together: no ramp
    return statistics.median(x for g in middle for x in g)


def interference(url: str, rng: random.Random, prompt: int) -> tuple[float, float, float]:
    """(prefill ms alone, decode step ms alone, the step that decoded beside that prefill in ms)."""
    _, alone = stream(url, _tokens(rng, prompt), 1)
    prefill = float(alone["prompt_ms"])
    arrivals: list[float] = []
    decoding = _tokens(rng, 64)
    t = threading.Thread(target=stream, args=(url, decoding, 3 * DECODE_TOKENS, arrivals))
    t.start()
    deadline = time.monotonic() + 120
    while len(arrivals) < DECODE_TOKENS // 2 and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # the decode under way: the prefill goes into its batch
    before = gaps(list(arrivals))
    stream(url, _tokens(rng, prompt), 1)
    t.join()
    step = statistics.median(before)
    return prefill, step, max(gaps(arrivals))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_truth.md"))
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp, timing_engines(Path(tmp), n=1) as (url,):
        stream(url, _tokens(rng, 32), 4)  # warm-up
        step, sigma, cv = noise(url, rng, args.runs)
        steps = {b: batch(url, rng, b) for b in (1, 2, 3)}
        mixed = [interference(url, rng, 400) for _ in range(args.runs)]
    per_seq = (steps[3] - steps[1]) / 2
    shares = [(m - p - d) / min(p, d) for p, d, m in mixed]
    added = [(m - p - d) / p for p, d, m in mixed]
    lines = [
        "# Engine truth: the simulator's assumed noise, per-sequence cost and interference, measured",
        "",
        "llama-server (one thread, three slots, flash attention off) on the deterministic 137M timing model,",
        "uncached prompts of random token ids, end of sequence ignored; times from the token events a client",
        f"sees. Written by `benchmarks/engine_truth.py` ({args.runs} runs each).",
        "",
        "| quantity | measured here (CPU) | `routing/sim/truth.py` assumes (GPU) |",
        "|---|---|---|",
        f"| decode step, one sequence | {step:.1f} ms | (published physics) |",
        f"| step noise: sigma of log(step / run median) | {sigma:.3f} | `NOISE_SIGMA` {NOISE_SIGMA} |",
        f"| run-to-run spread of the mean step (CV) | {cv:.3f} | `SPEED_SPREAD` +-12% between instances |",
        f"| decode step at batch 1 / 2 / 3 | {steps[1]:.1f} / {steps[2]:.1f} / {steps[3]:.1f} ms | |",
        f"| cost per added sequence | {per_seq:.2f} ms ({per_seq / steps[1]:.0%} of a batch-1 step) "
        f"| `SEQ_OVERHEAD_MS` {SEQ_OVERHEAD_MS} ms (well under 1% of a step) |",
        "| prefill of 400 tokens alone / decode step alone / the step beside it, median | "
        + " / ".join(f"{statistics.median(x):.0f}" for x in zip(*mixed, strict=True))
        + " ms | |",
        f"| interference: (mixed step - prefill - decode step) / the smaller | {statistics.median(shares):.2f} "
        f"(runs {min(shares):.2f} to {max(shares):.2f}; {statistics.median(added):.1%} of the prefill) "
        f"| `INTERFERENCE` {INTERFERENCE} |",
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
