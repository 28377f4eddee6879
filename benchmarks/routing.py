"""Routing quality: traces replayed at several loads through every policy, on a mixed and a uniform fleet.

    python benchmarks/routing.py                  # writes benchmarks/results/routing.md (and PNGs)
    python benchmarks/routing.py --quick          # shorter traces, for a look
    python benchmarks/routing.py --admission none # one admission setting only (default: both)

Workloads: the Azure conversation trace as it is (no prompt blocks: nothing to cache), a multi-turn
chat workload with shared system prompts on its arrivals (``routing.sim.workload.chat_sessions``),
and Mooncake's synthetic trace (prefix blocks as published). Fleets: ``configs/sim-fleet.yaml``
(8B and 70B Llama on TensorRT-LLM, vLLM, TGI, DeepSpeed-MII and llama.cpp; 80% of requests ask
for the 8B model) and a uniform one, six vLLM H100s serving the 8B model (about 430k tokens of KV
cache each). Budgets come from the default mix: interactive chat (60%, first token within 500
ms), agent steps (25%, first token 2 s and whole answer 20 s) and batch jobs (15%, whole answer
within 2 minutes). Offered load is a share of the fleet's estimated capacity on each workload.
Every policy runs under the same admission: the fleet sheds a request queued on an engine longer than
the config's ``routing.max_queue_wait_s`` (20 s), or nobody sheds; both by default. Engine step times
come from ``routing.sim.truth`` (fitted physics plus effects the router's estimator does not model,
seeded by ``--seed``), and the router's prediction error against them is reported per section.
Numbers, not pass/fail: the verdicts say where enginegate leads the strongest peer and where not.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.config import load_config  # noqa: E402
from gateway.ops.sim_plots import plot  # noqa: E402
from gateway.whatif.fleets import sim_fleet  # noqa: E402
from routing.catalog import BYTES_PER_PARAM, ENGINES, GPUS  # noqa: E402
from routing.sim import report  # noqa: E402
from routing.sim.policies import Policy  # noqa: E402
from routing.sim.simulate import SimFleet  # noqa: E402
from routing.sim.sweep import all_policies, parse_shares, sweep  # noqa: E402
from routing.sim.traces import TraceRow, load_trace  # noqa: E402
from routing.sim.truth import NOISE_SIGMA  # noqa: E402
from routing.sim.workload import chat_sessions  # noqa: E402
from routing.types import BackendProfile, ModelSpec  # noqa: E402

AZURE_CONV = ROOT / "data/traces/AzureLLMInferenceTrace_conv.csv"
MOONCAKE = ROOT / "data/traces/mooncake_synthetic_trace.jsonl"
BASELINES_WITHOUT_CACHE = ("round_robin", "random", "least_busy", "latency", "static")
"""Policies that know nothing of prefixes."""
ENGINEGATE = ("enginegate", "enginegate_2x", "enginegate_2x_shared")


def uniform_fleet() -> SimFleet:
    """Six vLLM H100s with the 8B model: 72 GB usable - 16 GB of weights = 427k tokens of KV each."""
    model = ModelSpec("llama-3.1-8b", 8, BYTES_PER_PARAM["bf16"], 131072, 131072)
    profiles = tuple(
        BackendProfile(
            f"vllm-h100-{i}",
            "vllm",
            frozenset({model.name}),
            GPUS["H100"],
            1,
            80.0,
            ENGINES["vllm"],
            max_concurrency=256,
            cost_per_hour=4.0,
        )
        for i in range(6)
    )
    return SimFleet(profiles, {model.name: model})


def workloads(quick: bool) -> dict[str, tuple[list[TraceRow], str]]:
    azure = load_trace(AZURE_CONV)
    mooncake = load_trace(MOONCAKE)
    if quick:
        azure = [r for r in azure if r.arrival_s < 900]
        mooncake = [r for r in mooncake if r.arrival_s < 300]
    return {
        "Azure conversation (no prefixes)": (azure, "Azure LLM inference trace, conversation service, as published"),
        "chat sessions on Azure arrivals": (
            chat_sessions(azure),
            "multi-turn conversations, 8 shared system prompts (400-2,000 tokens), 64-token blocks",
        ),
        "Mooncake synthetic": (mooncake, "Mooncake FAST'25 synthetic trace, 512-token blocks as published"),
    }


def strongest_peer(here: dict[str, report.Point]) -> report.Point:
    peers = [p for name, p in here.items() if name not in ENGINEGATE]
    return max(peers, key=lambda p: p.result.attainment)


def verdict(points: Sequence[report.Point]) -> tuple[list[str], list[str]]:
    """(a line per load, the loads where enginegate does not lead)."""
    lines, behind = [], []
    for load in sorted({p.load for p in points}):
        here = {p.result.policy: p for p in points if p.load == load}
        ours = here["enginegate"].result
        best = strongest_peer(here).result
        ours_cost = ours.busy_cost_per_hour
        cheaper = [n for n, p in here.items() if n not in ENGINEGATE and p.result.busy_cost_per_hour < ours_cost]
        margin = (ours.attainment - best.attainment) * 100
        lines.append(
            f"- {load:.0%}: enginegate {ours.attainment:.1%} within budget (cache hits {ours.cache_hit_rate:.1%}, "
            f"{ours.rejected} rejected), strongest peer {best.policy} {best.attainment:.1%} "
            f"({best.cache_hit_rate:.1%}, {best.rejected} rejected): {margin:+.1f} points ({_call(margin)}); "
            f"busy GPU ${ours_cost:.2f}/h" + (f", more than {', '.join(cheaper)}" if cheaper else ", the lowest")
        )
        if margin < TIE_POINTS:
            behind.append(f"{load:.0%} ({best.policy}, {margin:+.1f} points: {_call(margin)})")
    return lines, behind


TIE_POINTS = 1.0
"""Within this many points of the strongest peer counts as a tie (about the spread between seeds)."""


def _call(margin: float) -> str:
    return "leads" if margin >= TIE_POINTS else "ties" if margin > -TIE_POINTS else "trails"


def section(
    title: str, fleet: SimFleet, rows: list[TraceRow], about: str, loads: Sequence[float], shares: str, seed: int,
    progress: Callable[[str], None], png: Path, names: Sequence[str] | None,
) -> tuple[list[str], list[str]]:  # fmt: skip
    started = time.perf_counter()

    def chosen() -> list[Policy]:
        every = all_policies(fleet.rules, fleet.models, seed)
        return [p for p in every if names is None or p.name in names]

    capacity, points = sweep(fleet, rows, loads, parse_shares(shares), seed=seed, progress=progress, policies=chosen)
    took = time.perf_counter() - started
    lines, behind = verdict(points)
    policies = len({p.result.policy for p in points})
    plot(points, png, title)
    body = [
        "",
        f"### {title}",
        "",
        f"{about}; {len(rows):,} requests. Estimated capacity {capacity:.2f} requests/s (with the prefill an "
        f"ideal cache leaves); {len(loads)} loads x {policies} policies simulated in {took:.0f} s.",
        "",
        report.markdown(points),
        "",
        *lines,
        "",
        "The router's prediction at its decision against what the ground truth then produced (absolute error "
        "as a share of the actual, answered requests it placed; e2e as predicted, without the answer's length, "
        "and with the true length: the timing error alone):",
        "",
        report.errors(points),
        "",
        f"![attainment against load]({png.name})",
    ]
    return body, [f"{title}: {b}" for b in behind]


def header_note() -> str:
    """What every table and verdict below counts, and how the comparison is kept fair."""
    return (
        "`within budget`: share of all requests whose first token and whole answer came within their budgets "
        "(failed and rejected requests count as missed). " + report.CAPTION + " Admission is the fleet's and "
        "the same for every policy: `admission 20 s` sheds a request still queued on an engine 20 s after it got "
        "there (waiting, or holding a slot with no prefill chunk yet; the config's `routing.max_queue_wait_s`; "
        "enginegate's own queue-wait shedding is off in the simulator), `no admission` sheds nothing. enginegate "
        "sheds, as a policy choice, requests it predicts above three times their budget on every backend while "
        "every one queues (`routing.shed_over_budget: 3`, set in `configs/sim-fleet.yaml`, off by default in the "
        "gateway): its `hopeless (503)` column, counted as missed. Engine step "
        "times come from `routing/sim/truth.py`: the physics fitted to published numbers plus per-sequence cost, "
        "prefill/decode interference, a hidden per-instance speed (+-12%) and lognormal step noise, none of which "
        "the router's estimator models; it learns them online as the gateway does. Verdicts: within 1 point of "
        "the strongest peer is a tie. `cache hits`: share of answered requests' prompt tokens the engines found "
        "in their prefix caches. `fleet GPU $/h`: price per hour of keeping the whole fleet up, the same for "
        "every policy. Requests without an answer are counted by reason (shed by admission, strict 429, no "
        "backend, lost mid-answer). `static` is a strawman (a hand-written engine table). `enginegate_2x`: two "
        "gateway replicas, requests split at random, each with its own prefix index; `enginegate_2x_shared`: the "
        "same sharing where they sent each prompt (`routing.prefix.share`, heard 5 ms later)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs/sim-fleet.yaml")
    parser.add_argument("--load", default="50,80,100,120")
    parser.add_argument("--models", default="llama-3.1-8b:0.8,llama-3.1-70b:0.2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="the first 15 (Azure) and 5 (Mooncake) minutes")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    parser.add_argument(
        "--admission", choices=("both", "config", "none"), default="both",
        help="the config's max_queue_wait_s for every policy, none for any, or both runs (default)",
    )  # fmt: skip
    parser.add_argument("--policies", help="comma-separated subset of the policies (default: all)")
    parser.add_argument("--workloads", help="comma-separated first words of the workloads (azure,chat,mooncake)")
    parser.add_argument(
        "--noise-sigma", type=float,
        help=f"the ground truth's step noise (default {NOISE_SIGMA}; benchmarks/results/engine_truth.md measured "
        "0.18 on a CPU llama-server)",
    )  # fmt: skip
    args = parser.parse_args()
    mixed = sim_fleet(load_config(args.config))
    uniform = replace(uniform_fleet(), admission_s=mixed.admission_s, rules=mixed.rules)  # the config's routing
    if args.noise_sigma is not None:
        mixed, uniform = (replace(f, truth=replace(f.truth, noise_sigma=args.noise_sigma)) for f in (mixed, uniform))
    names = [n.strip() for n in args.policies.split(",")] if args.policies else None
    if names is not None and "enginegate" not in names:
        parser.error("--policies must include enginegate (the verdicts compare against it)")
    modes = {"config": mixed.admission_s, "none": None}
    admissions = list(modes) if args.admission == "both" else [args.admission]
    loads = [float(x) / 100 for x in args.load.split(",")]
    fleets = {
        f"mixed fleet (`{args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config}`)": (
            mixed,
            args.models,
        ),
        "uniform fleet (6x vLLM H100, 8B)": (uniform, "llama-3.1-8b:1"),
    }
    sections = [
        "# Routing benchmark",
        "",
        f"Seed {args.seed}; default budget mix{'; quick run (shortened traces)' if args.quick else ''}; "
        f"policies: {', '.join(names) if names else 'all'}"
        + (f"; step noise sigma {args.noise_sigma:g}" if args.noise_sigma is not None else "")
        + ". Written by `benchmarks/routing.py`.",
        "",
        header_note(),
    ]
    behind: list[str] = []
    chosen = workloads(args.quick)
    if args.workloads:
        wanted = {w.strip().lower() for w in args.workloads.split(",")}
        chosen = {title: w for title, w in chosen.items() if title.split()[0].lower() in wanted}
    for mode in admissions:
        limit = modes[mode]
        label = f"admission {limit:g} s" if limit is not None else "no admission"
        for fleet_name, (fleet, shares) in fleets.items():
            sections += ["", f"## {fleet_name}, {label}"]
            for title, (rows, about) in chosen.items():
                png = args.out / f"routing_{mode}_{fleet_name.split()[0]}_{title.split()[0].lower()}.png"
                body, late = section(
                    title, replace(fleet, admission_s=limit), rows, about, loads, shares, args.seed,
                    lambda line: print(line, file=sys.stderr), png, names,
                )  # fmt: skip
                sections += body
                behind += [f"{fleet_name}, {label}, {line}" for line in late]
    sections += ["", "## Where enginegate does not lead (ties within 1 point, or trails)", ""]
    sections += [f"- {line}" for line in behind] or ["- nowhere in this run"]
    text = "\n".join(sections) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "routing.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
