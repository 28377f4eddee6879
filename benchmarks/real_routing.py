"""Routing on real engines where prefill costs what it costs: three llama-server processes serving the
timing model (tools/build_timing_model.py), tool-calling sessions with a shared preamble and growing
histories, 1, 3 and 6 concurrent clients, through enginegate and three client-side placements.

    python benchmarks/real_routing.py                       # every policy at 1, 3, 6 clients
    python benchmarks/real_routing.py --clients 3 --policies enginegate,round_robin

First it measures the timing model alone on this machine (prefill and decode tokens/s of one engine,
with the load average), then runs each placement on freshly started engines (tests/timing_fleet.py:
the same prompts for every placement, nothing cached from another run). Writes
``benchmarks/results/real_routing.md`` and ``.json``: reused prompt tokens as the engines count them
(``llamacpp:prompt_tokens_cached_total``), TTFT p50/p99 at the client (streamed, first token),
budgets met, session moves, load balance, and whether each answer equals round robin's (sent
straight to an engine) for the same request.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.timing_fleet import POLICIES, Run, Workload, run_policy, timing_engines

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "real_routing.md"
COLUMNS = (
    ("policy", "policy"), ("clients", "clients"), ("reused_tokens", "reused prompt tokens"),
    ("vs_round_robin", "x round robin"), ("reused_share", "reused share"), ("prefilled_tokens", "prefilled"),
    ("ttft_p50_s", "TTFT p50 s"), ("ttft_p99_s", "TTFT p99 s"), ("budget_met", "budget met"),
    ("moves", "moves"), ("requests_max_over_mean", "requests max/mean"),
    ("prefill_max_over_mean", "prefill max/mean"), ("same_answers", "answers = direct"),
    ("wall_s", "wall s"),
)  # fmt: skip


def speed(workdir: Path) -> dict[str, float]:
    """One engine alone: a cold prompt of about 1,000 tokens, then 64 tokens decoded (its own timings)."""
    prompt = "The build failed at step seven with a missing file in the cache path. " * 24
    with timing_engines(workdir, n=1) as (url,):
        load = os.getloadavg()[0]
        body = {"prompt": prompt, "n_predict": 64, "temperature": 0, "ignore_eos": True}
        timings = httpx.post(f"{url}/completion", json=body, timeout=900).json()["timings"]
    return {
        "load_average_1m": round(load, 2),
        "prompt_tokens": timings["prompt_n"],
        "prefill_tokens_per_s": round(timings["prompt_per_second"], 1),
        "decode_tokens_per_s": round(timings["predicted_per_second"], 1),
    }


def table(rows: list[dict[str, object]]) -> str:
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r.get(key, "")) for key, _ in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def compare(runs: list[Run]) -> list[dict[str, object]]:
    """Each run's row, with its reuse over round robin's and its answers against round robin's."""
    direct = {r.clients: {(a.session, a.turn): a.text for a in r.answers} for r in runs if r.policy == "round_robin"}
    rows = []
    for r in runs:
        row: dict[str, object] = dict(r.row())
        base = next((b for b in runs if b.policy == "round_robin" and b.clients == r.clients), None)
        if base is not None:
            row["vs_round_robin"] = round(r.reused / max(1, base.reused), 2)
            same = sum(direct[r.clients][(a.session, a.turn)] == a.text for a in r.answers)
            row["same_answers"] = f"{same}/{len(r.answers)}"
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", default="1,3,6")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--sessions", type=int, default=Workload.sessions)
    parser.add_argument("--turns", type=int, default=Workload.turns)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the engines' context managers stop them
    w = Workload(sessions=args.sessions, turns=args.turns)
    policies = args.policies.split(",")
    work = Path(tempfile.mkdtemp(prefix="real-routing-"))
    measured = speed(work / "speed")
    print(f"timing model alone: {measured}", file=sys.stderr)
    runs, walls = [], []
    for clients in (int(c) for c in args.clients.split(",")):
        for policy in sorted(policies, key=lambda p: p != "round_robin"):  # round robin first: the reference
            start = time.monotonic()
            runs.append(run_policy(policy, w, clients, work / f"{policy}-{clients}"))
            walls.append(round(time.monotonic() - start))
            print(f"{policy}, {clients} clients: {runs[-1].row()} ({walls[-1]} s)", file=sys.stderr)
    rows = compare(runs)
    for row, wall in zip(rows, walls, strict=True):
        row["wall_s"] = wall
    rows.sort(key=lambda r: (int(str(r["clients"])), POLICIES.index(str(r["policy"]))))
    after = round(os.getloadavg()[0], 2)
    text = (
        f"# Routing on real engines\n\n`python benchmarks/real_routing.py` on {os.cpu_count()} cores. "
        f"Timing model alone: {measured['prefill_tokens_per_s']} prompt tokens/s and "
        f"{measured['decode_tokens_per_s']} generated tokens/s on one thread (a {measured['prompt_tokens']}-token "
        f"prompt; load average {measured['load_average_1m']} before, {after} after the runs). Workload: "
        f"{w.sessions} sessions x {w.turns} turns, {w.max_tokens} tokens per answer, budget {w.budget_ms} ms "
        f"to the first token, seed {w.seed}.\n\n{table(rows)}\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    payload = {"speed": measured, "load_average_after": after, "workload": w.__dict__, "rows": rows}
    args.out.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
