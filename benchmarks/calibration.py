"""Fit the simulator's engine performance model (routing/sim/calibration.py) to published numbers.

    python benchmarks/calibration.py              # fit, print PERF literals, write results/calibration.md
    python benchmarks/calibration.py --out -      # the report on stdout instead

Every row of data/published_engine_numbers.csv is either turned into one or more predictions
(TTFT, time per output token, tokens/s, end-to-end time) of the model in
``routing.sim.calibration.step_ms`` or left out with a stated reason. Per engine family the model's
MFU, MBU, per-step overhead (and tensor-parallel efficiency where multi-GPU rows exist) minimise the
sum of squared log errors: a coarse grid, then a compass search that halves its steps, so the
result is deterministic. The printed constants go into ``PERF``; a unit test reruns ``fit_all``
and checks they still agree.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from routing.catalog import BYTES_PER_PARAM, MEMORY_HEADROOM, GpuSpec
from routing.sim.calibration import PERF, EnginePerf, hardware, step_ms

ROOT = Path(__file__).resolve().parent.parent
CSV_PATH = ROOT / "data" / "published_engine_numbers.csv"
OUT_PATH = ROOT / "benchmarks" / "results" / "calibration.md"

FITTED = ("trtllm", "vllm", "llamacpp_gpu", "cpu")

TGI_VS_VLLM = {"mfu": 0.85, "mbu": 1.0, "step_overhead_ms": 1.0}
"""TGI has no usable rows (its two rows are capacity claims). The BentoML comparison (Llama 3 on
A100 80GB, June 2024; rows bento-*) reports, in its text, vLLM with the lowest TTFT at every load and
TGI's decode rate in vLLM's range (exact values only in charts): TGI = vLLM with 15% lower MFU
(slower prefill) and the same MBU and step overhead."""

LLAMACPP_TP_EFF = 0.6
"""No multi-GPU llama.cpp rows. Its default split across GPUs is by layers, which runs a single
stream on one GPU at a time: little speed-up (0.6 per doubling gives 1.2x on two GPUs)."""
CPU_TP_EFF = 0.9
"""No multi-socket CPU rows; a documented guess for sockets joined by llama.cpp's NUMA support."""

TOKEN_BUDGET = 8192
"""Tokens one in-flight-batching iteration may carry (TensorRT-LLM's max_num_tokens, vLLM's
max_num_batched_tokens), the engines' defaults for the rows' versions as far as known."""
MAX_BATCH = {"trtllm": 2048, "vllm": 1024}
"""Sequence cap of one iteration under maximum load (taken as trtllm-bench's max_batch_size and vLLM's
max_num_seqs for offline use on H100-class GPUs). Elsewhere the KV cache is the tighter limit; the
cap binds only on trt10-1 (the report prints each row's batch)."""
SINGLE_STREAM_CONTEXT = 256
"""Mean context of a single-stream decode whose prompt length was not stated."""
UNSTATED_PROMPT = 512
"""Prompt length of prompt-eval figures that do not state one (llama.cpp's default batch)."""
MLPERF_ISL, MLPERF_OSL = 900, 128
"""MLPerf llama3.1-8b (CNN/DailyMail): articles average ~781 word-level tokens (See et al. 2017), ~1.15
Llama-3 tokens each, plus the prompt template; answers stop at max_new_tokens 128 (the reference run's
answers average 611 characters)."""


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    params_b: float
    layers: int
    kv_heads: int
    head_dim: int = 128


MODELS = (
    (re.compile(r"llama (2 )?7b", re.I), Model("Llama-2 7B", 6.74, 32, 32)),
    (re.compile(r"llama (2 )?70b", re.I), Model("Llama-2 70B", 68.98, 80, 8)),
    (re.compile(r"llama 3(\.1)? 8b", re.I), Model("Llama-3 8B", 8.03, 32, 8)),
    (re.compile(r"llama 3(\.3)? 70b", re.I), Model("Llama-3 70B", 70.55, 80, 8)),
)

HARDWARE_NAMES = (
    ("H100 PCIe", "H100-PCIe"),
    ("H100", "H100"),  # the rows' "H100 80GB", "H100 SXM 80GB" and MLPerf's "H100" are SXM parts
    ("H200", "H200"),
    ("A100", "A100-80GB"),  # TensorRT-LLM's "A100" tables were run on 80 GB SXM parts
    ("L40S", "L40S"),
    ("RTX 4090", "RTX-4090"),
    ("i9-13900K", "i9-13900K"),
    ("Mac Pro 2019 Intel 16-core", "Xeon-W-3245"),
    ("i7-7820HQ", "i7-7820HQ"),
)

PRECISION_ALIASES = {"f16": "fp16"}

READ_AS_PER_GPU = "table header lacks 'per GPU', read as per GPU"
"""TensorRT-LLM's A100 table does not say per GPU (its H100 table does); read as totals, the 4-GPU
Llama-2 70B rows would be several times slower than the model (the report prints by how much)."""

UNSTATED_CPU_PRECISION = "q4_0"
"""lcpu-1/2 do not say: at DDR5-6400's 102 GB/s any 8-bit or wider 7B model needs over 70 ms per
token even at full bandwidth, against 54.7 ms measured; Q4_0 was llama.cpp's usual benchmark format."""

SKIP_ROWS = {
    "nim-7": "GPU, precision and ISL/OSL were not captured (row notes)",
    "nim-8": "GPU, precision and ISL/OSL were not captured (row notes)",
    "nim-9": "GPU, precision and ISL/OSL were not captured (row notes)",
    "nim-10": "GPU, precision and ISL/OSL were not captured (row notes)",
    "vllmci-3": "200 ShareGPT prompts: lengths not in the row, long-tailed and filter-dependent; "
    "with 200 requests the makespan is set by the longest answers, not a steady state",
    "vllmci-4": "as vllmci-3",
    "mlperf51-2": "Server scenario: throughput is set by MLPerf's TTFT/TPOT limits and arrival process",
    "mlperf51-4": "as mlperf51-2",
    "bento-1": "LMDeploy is not simulated; approximate value with unknown batch (concurrency 100, engine-chosen)",
    "bento-2": "MLC-LLM is not simulated; approximate value with unknown batch",
    "tgi3-1": "capacity claim (tokens held in KV cache), not a speed",
    "tgi3-2": "prefix-cache reuse claim on an unspecified setup, not a per-step speed",
    "lcpp-8": "Apple Metal backend: its kernels differ from CUDA's and no fleet GPU resembles it",
    "lcpu-3": "model size not stated; a 44-vCPU VM's share of the socket's memory bandwidth is unknown",
}


@dataclass(frozen=True, slots=True)
class Setup:
    """One deployment a row describes: hardware, model and number formats."""

    gpu: GpuSpec
    gpu_count: int
    model: Model
    bytes_per_param: float
    kv_bytes: float
    fp8: bool

    @property
    def kv_per_token(self) -> float:
        return 2 * self.model.layers * self.model.kv_heads * self.model.head_dim * self.kv_bytes

    def step(self, perf: EnginePerf, batch: float, ctx_tokens: float, prefill_tokens: float) -> float:
        return step_ms(
            perf,
            self.gpu,
            self.gpu_count,
            self.model.params_b,
            self.bytes_per_param,
            self.kv_per_token,
            round(batch),
            ctx_tokens,
            prefill_tokens,
            fp8=self.fp8,
        )

    def kv_batch(self, seq_tokens: int) -> int:
        """Sequences of ``seq_tokens`` whose KV cache fits next to the weights."""
        budget = MEMORY_HEADROOM * self.gpu.memory_gb * 1e9 * self.gpu_count
        budget -= self.model.params_b * 1e9 * self.bytes_per_param
        return max(1, int(budget // (self.kv_per_token * seq_tokens)))

    def describe(self) -> str:
        fmt = "FP8" if self.fp8 else f"{self.bytes_per_param:g} B/param"
        return f"{self.model.name} {fmt}, {self.gpu_count}x {self.gpu.name}"


Predict = Callable[[EnginePerf], float]


@dataclass(frozen=True, slots=True)
class Measurement:
    """One published number and the model's prediction of it as a function of the constants."""

    row: str
    family: str
    setup: str
    quantity: str
    value: float
    predict: Predict
    assumption: str = ""
    gpus: int = 1


@dataclass(slots=True)
class Rows:
    measurements: list[Measurement] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


# --- workload models: published set-ups turned into step times ------------------------------------------------


def inflight_step(perf: EnginePerf, s: Setup, batch: int, isl: int, osl: int, prefill_per_step: float) -> float:
    """Mean iteration time in steady state: ``batch`` sequences decoding at mean context isl + osl/2,
    prompts arriving at ``prefill_per_step`` tokens per iteration in chunks of up to TOKEN_BUDGET.
    A share of iterations carries a chunk, the rest decode only."""
    ctx = batch * (isl + osl / 2)
    decode = s.step(perf, batch, ctx, 0)
    if prefill_per_step <= 0:
        return decode
    chunk = max(prefill_per_step, min(isl, TOKEN_BUDGET))
    share = prefill_per_step / chunk
    return share * s.step(perf, batch, ctx, chunk) + (1 - share) * decode


def static_batch_seconds(perf: EnginePerf, s: Setup, batch: int, isl: int, osl: int) -> float:
    """A static batch: one context step over all prompts (which yields the first tokens), then osl - 1 decodes."""
    prefill = s.step(perf, 0, 0, batch * isl)
    return (prefill + (osl - 1) * s.step(perf, batch, batch * (isl + osl / 2), 0)) / 1000


# --- reading rows -------------------------------------------------------------------------------------------


def _number(text: str) -> float | None:
    text = text.strip().lstrip("~").replace(",", "")
    return float(text) if text else None


def _family(engine: str) -> str | None:
    if engine.startswith(("TensorRT-LLM", "NVIDIA NIM")):
        return "trtllm"
    if engine == "vLLM":
        return "vllm"
    if engine.startswith("llama.cpp (CPU"):
        return "cpu"
    if engine == "llama.cpp":
        return "llamacpp_gpu"
    return None


def _setup(row: dict[str, str], family: str) -> tuple[Setup, list[str]]:
    notes: list[str] = []
    model = next((m for pattern, m in MODELS if pattern.search(row["model"])), None)
    gpu_key = next((key for label, key in HARDWARE_NAMES if label in row["gpu"]), None)
    if model is None or gpu_key is None:
        raise ValueError(f"{row['id']}: no model or hardware for {row['model']!r} on {row['gpu']!r}")
    precision = row["precision"].split()[0].lower()
    if row["precision"].startswith("not stated"):
        precision = UNSTATED_CPU_PRECISION
        notes.append("precision unstated: Q4_0 assumed")
    precision = PRECISION_ALIASES.get(precision, precision)
    fp8 = precision == "fp8"
    # TensorRT-LLM's FP8 builds (--fp8_kv_cache, ModelOpt FP8 checkpoints) keep the KV cache in FP8 too;
    # vLLM keeps it in 16 bits unless told otherwise, llama.cpp in F16.
    kv_bytes = 1.0 if fp8 and family == "trtllm" else 2.0
    count = int(row["num_gpus"]) if family != "cpu" else 1
    return Setup(hardware(gpu_key), count, model, BYTES_PER_PARAM[precision], kv_bytes, fp8), notes


def interpret(row: dict[str, str]) -> Rows:
    """The measurements one CSV row yields, or why (some of) it is left out."""
    out = Rows()
    rid = row["id"]
    if rid in SKIP_ROWS:
        out.skipped.append((rid, SKIP_ROWS[rid]))
        return out
    family = _family(row["engine"])
    if family is None:
        raise ValueError(f"{rid}: engine {row['engine']!r} has no family; add it to SKIP_ROWS with a reason")
    s, notes = _setup(row, family)

    def add(quantity: str, value: float | None, predict: Predict, *extra: str) -> None:
        if value is None:
            raise ValueError(f"{rid}: no value for {quantity}")
        note = "; ".join(n for n in (*notes, *extra) if n)
        out.measurements.append(Measurement(rid, family, s.describe(), quantity, value, predict, note, s.gpu_count))

    workload, batch_text, unit = row["workload"], row["batch_or_concurrency"], row["throughput_unit"]
    ttft, itl, e2e, tput = (_number(row[k]) for k in ("ttft_ms", "itl_or_tpot_ms", "e2e_latency_ms", "throughput"))

    if m := re.fullmatch(r"input (\d+) \(first-token only\)", workload):
        isl = int(m[1])
        add(f"TTFT ms, ISL {isl}, batch 1", ttft, lambda p: s.step(p, 0, 0, isl))
    elif (m := re.match(r"ISL (\d+) / OSL (\d+)", workload)) and (b := re.fullmatch(r"batch (\d+)", batch_text)):
        isl, osl, batch = int(m[1]), int(m[2]), int(b[1])
        # The v0.6.1 tables report output tokens/s per GPU; only the H100 one says so.
        per_gpu = s.gpu_count
        why = "static batching" + (f"; {READ_AS_PER_GPU}" if per_gpu > 1 and "per GPU" not in unit else "")
        add(
            f"output tok/s{'/GPU' if per_gpu > 1 else ''}, {isl}/{osl}, batch {batch}",
            tput,
            lambda p: batch * osl / static_batch_seconds(p, s, batch, isl, osl) / per_gpu,
            why,
        )
    elif (m := re.match(r"ISL (\d+) / OSL (\d+)", workload)) and batch_text.startswith("max load"):
        isl, osl = int(m[1]), int(m[2])
        add(
            f"output tok/s, {isl}/{osl}, max load",
            tput,
            _max_load(s, family, isl, osl),
            _max_load_note(s, family, isl + osl),
        )
    elif (m := re.match(r"ISL (\d+) / OSL (\d+)", workload)) and (c := re.fullmatch(r"concurrency (\d+)", batch_text)):
        _closed_loop(out, add, s, rid, int(m[1]), int(m[2]), int(c[1]), ttft, itl, tput)
    elif (m := re.fullmatch(r"input (\d+) / output (\d+)", workload)) and (
        b := re.fullmatch(r"fixed batch (\d+)", batch_text)
    ):
        isl, osl, batch = int(m[1]), int(m[2]), int(b[1])
        add(
            f"e2e ms, {isl}/{osl}, batch {batch}",
            e2e,
            lambda p: static_batch_seconds(p, s, batch, isl, osl) * 1000,
        )
    elif "Offline" in workload:
        isl, osl = MLPERF_ISL, MLPERF_OSL
        add(
            "output tok/s, MLPerf Offline",
            tput,
            _max_load(s, family, isl, osl),
            f"ISL {isl} / OSL {osl} assumed",
            _max_load_note(s, family, isl + osl),
        )
    elif family in ("llamacpp_gpu", "cpu"):
        _single_stream(add, s, workload, itl, tput, unit)
    else:
        raise ValueError(f"{rid}: workload {workload!r} not understood; add it to SKIP_ROWS with a reason")
    return out


def _max_load(s: Setup, family: str, isl: int, osl: int) -> Predict:
    batch = min(MAX_BATCH[family], s.kv_batch(isl + osl))
    return lambda p: batch * 1000 / inflight_step(p, s, batch, isl, osl, batch * isl / osl)


def _max_load_note(s: Setup, family: str, seq_tokens: int) -> str:
    batch = min(MAX_BATCH[family], s.kv_batch(seq_tokens))
    return f"batch {batch} (what the KV cache holds, at most {MAX_BATCH[family]})"


def _closed_loop(
    out: Rows,
    add: Callable[..., None],
    s: Setup,
    rid: str,
    isl: int,
    osl: int,
    clients: int,
    ttft: float | None,
    itl: float | None,
    tput: float | None,
) -> None:
    """``clients`` users each sending the next request when the last one finished (AIPerf concurrency)."""
    batch = min(clients, s.kv_batch(isl + osl))
    note = f"{batch} running (KV-cache limit)" if batch < clients else ""

    def itl_ms(p: EnginePerf) -> float:
        # A running sequence waits through the other sequences' prompt chunks too.
        return inflight_step(p, s, batch, isl, osl, (batch - 1) * isl / osl)

    def ttft_ms(p: EnginePerf) -> float:
        return s.step(p, batch - 1, (batch - 1) * (isl + osl / 2), isl)

    who = f"{clients} client{'s' if clients > 1 else ''}"
    add(f"ITL ms, {isl}/{osl}, {who}", itl, itl_ms, note)
    add(
        f"output tok/s, {isl}/{osl}, {who}",
        tput,
        lambda p: batch * osl * 1000 / (ttft_ms(p) + (osl - 1) * itl_ms(p)),
        note,
    )
    if clients == 1:
        add(f"TTFT ms, {isl}/{osl}, {who}", ttft, ttft_ms)
    else:
        out.skipped.append(
            (
                f"{rid} (TTFT)",
                "TTFT with other clients includes waiting for their prompts and, past the KV limit, queueing: "
                "the simulator produces those waits itself",
            )
        )


def _single_stream(
    add: Callable[..., None], s: Setup, workload: str, itl: float | None, tput: float | None, unit: str
) -> None:
    gen = re.search(r"(?:gen|tg)\s*(\d+)", workload)
    ctx = int(gen[1]) / 2 if gen else SINGLE_STREAM_CONTEXT
    ctx_note = "" if gen else f"mean context {SINGLE_STREAM_CONTEXT} assumed"
    if itl is not None:
        add("ms/token, batch 1", itl, lambda p: s.step(p, 1, ctx, 0), ctx_note)
    elif "generation tok/s" in unit:
        add("tok/s, batch 1", tput, lambda p: 1000 / s.step(p, 1, ctx, 0), ctx_note)
    prompt = re.search(r"(?:prompt eval|pp512) ([\d.]+) tok/s", unit)
    pp_value = float(prompt[1]) if prompt else (tput if unit.startswith("prompt tok/s") else None)
    if pp_value is not None:
        pp = re.search(r"(?:pp|prompt )(\d+)", workload + " " + unit)
        tokens = int(pp[1]) if pp else UNSTATED_PROMPT
        note = "" if pp else f"prompt of {UNSTATED_PROMPT} tokens assumed"
        add(f"prompt tok/s, {tokens} tokens", pp_value, lambda p: tokens * 1000 / s.step(p, 0, 0, tokens), note)


def load_rows(path: Path = CSV_PATH) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def collect(rows: Sequence[dict[str, str]]) -> Rows:
    """Every row interpreted: measurements to fit, and what was left out with the reason."""
    total = Rows()
    for row in rows:
        part = interpret(row)
        total.measurements += part.measurements
        total.skipped += part.skipped
    return total


# --- fitting -----------------------------------------------------------------------------------------------

BOUNDS = {"mfu": (0.02, 1.0), "mbu": (0.05, 1.0), "step_overhead_ms": (0.05, 100.0), "tp_eff": (0.4, 1.0)}
GRID_POINTS = {"mfu": 6, "mbu": 6, "step_overhead_ms": 6, "tp_eff": 4}


def log_error(perf: EnginePerf, m: Measurement) -> float:
    return math.log(m.predict(perf) / m.value)


def loss(perf: EnginePerf, measurements: Sequence[Measurement]) -> float:
    return math.fsum(log_error(perf, m) ** 2 for m in measurements)


def fit_family(family: str, measurements: Sequence[Measurement], tp_eff: float | None = None) -> EnginePerf:
    """Constants minimising the squared log errors; ``tp_eff`` fixed when given, else fitted."""
    names = ["mfu", "mbu", "step_overhead_ms"] + (["tp_eff"] if tp_eff is None else [])
    lo = [math.log(BOUNDS[n][0]) for n in names]
    hi = [math.log(BOUNDS[n][1]) for n in names]

    def make(x: Sequence[float]) -> EnginePerf:
        values = dict(zip(names, (math.exp(v) for v in x), strict=True))
        return EnginePerf(family, tp_eff=values.pop("tp_eff", tp_eff or 1.0), **values)

    def cost(x: Sequence[float]) -> float:
        return loss(make(x), measurements)

    axes = [
        [a + (b - a) * (i + 0.5) / GRID_POINTS[n] for i in range(GRID_POINTS[n])]
        for n, a, b in zip(names, lo, hi, strict=True)
    ]
    best = min((list(x) for x in itertools.product(*axes)), key=cost)
    best_cost = cost(best)
    steps = [(b - a) / GRID_POINTS[n] for n, a, b in zip(names, lo, hi, strict=True)]
    while max(steps) > 1e-5:
        improved = False
        for i, sign in itertools.product(range(len(names)), (1, -1)):
            trial = list(best)
            trial[i] = min(hi[i], max(lo[i], trial[i] + sign * steps[i]))
            trial_cost = cost(trial)
            if trial_cost < best_cost:
                best, best_cost, improved = trial, trial_cost, True
        if not improved:
            steps = [st / 2 for st in steps]
    return make(best)


def fit_all(path: Path = CSV_PATH) -> dict[str, EnginePerf]:
    """Fitted constants for every family (TGI and MII derived from vLLM as documented above)."""
    data = collect(load_rows(path))
    by_family = {f: [m for m in data.measurements if m.family == f] for f in FITTED}
    trtllm = fit_family("trtllm", by_family["trtllm"])
    # vLLM has one multi-GPU row: its tensor-parallel efficiency comes from TensorRT-LLM's many.
    vllm = fit_family("vllm", by_family["vllm"], tp_eff=trtllm.tp_eff)
    tgi = replace(
        vllm,
        family="tgi",
        mfu=vllm.mfu * TGI_VS_VLLM["mfu"],
        mbu=vllm.mbu * TGI_VS_VLLM["mbu"],
        step_overhead_ms=vllm.step_overhead_ms * TGI_VS_VLLM["step_overhead_ms"],
    )
    return {
        "trtllm": trtllm,
        "vllm": vllm,
        "tgi": tgi,
        "mii": replace(vllm, family="mii"),
        "llamacpp_gpu": fit_family("llamacpp_gpu", by_family["llamacpp_gpu"], tp_eff=LLAMACPP_TP_EFF),
        "cpu": fit_family("cpu", by_family["cpu"], tp_eff=CPU_TP_EFF),
    }


# --- output ------------------------------------------------------------------------------------------------


def literal(perf: dict[str, EnginePerf]) -> str:
    """The ``PERF`` entries as Python source, four significant digits."""
    return "\n".join(
        f'EnginePerf("{p.family}", mfu={p.mfu:.4g}, mbu={p.mbu:.4g}, '
        f"step_overhead_ms={p.step_overhead_ms:.4g}, tp_eff={p.tp_eff:.4g}),"
        for p in perf.values()
    )


def report(perf: dict[str, EnginePerf], data: Rows) -> str:
    """The markdown written to benchmarks/results/calibration.md."""
    lines = [
        "# Engine performance model: calibration against published numbers",
        "",
        "Generated by `benchmarks/calibration.py` from `data/published_engine_numbers.csv` (numbers published by",
        "vendors, CI systems, MLPerf submitters and community threads, not measured here); the constants are",
        "`routing.sim.calibration.PERF`, the base of the simulator's ground truth for engine speed",
        "(`routing.sim.truth` adds per-sequence cost, prefill/decode interference, hidden per-instance speeds",
        "and step noise, none of which the router's estimator models). One engine iteration:",
        "",
        "    step = overhead + (weights + KV cache read) / (bandwidth x MBU)",
        "                    + 2 x params x (decode tokens + prompt tokens) / (peak FLOP/s x MFU)",
        "",
        "N tensor-parallel GPUs count as `N x tp_eff ** log2(N)`. FP8 rows: 1 byte per parameter and twice the",
        "FP16 tensor rate. Fitted per family by least squares on log(model / measured) (grid, then compass",
        "search). Errors below are model / measured - 1.",
        "",
        "## Constants",
        "",
        "| family | MFU | MBU | step overhead ms | tp_eff | source |",
        "|---|---|---|---|---|---|",
    ]
    how = {
        "trtllm": "fitted (TensorRT-LLM and NIM rows)",
        "vllm": "fitted (4 quantities for 3 constants: loosely pinned); tp_eff from trtllm",
        "tgi": f"vLLM's with MFU x {TGI_VS_VLLM['mfu']}: BentoML ranks TGI's TTFT behind vLLM's, decode alike",
        "mii": "vLLM's: no rows; FastGen's own claims and vLLM's reply disagree, no neutral numbers",
        "llamacpp_gpu": f"fitted; tp_eff {LLAMACPP_TP_EFF} documented (layer split), not fitted",
        "cpu": f"fitted; tp_eff {CPU_TP_EFF} documented, not fitted",
    }
    for p in perf.values():
        lines.append(
            f"| {p.family} | {p.mfu:.3f} | {p.mbu:.3f} | {p.step_overhead_ms:.2f} | {p.tp_eff:.3f} | {how[p.family]} |"
        )
    lines += ["", "## Error per family", "", "| family | quantities | median abs error | worst |", "|---|---|---|---|"]
    for family in FITTED:
        errors = [(abs(m.predict(perf[family]) / m.value - 1), m.row) for m in data.measurements if m.family == family]
        worst = max(errors)
        median = statistics.median(e for e, _ in errors)
        lines.append(f"| {family} | {len(errors)} | {median:.0%} | {worst[0]:.0%} ({worst[1]}) |")
    lines += [
        "",
        "## Quantities used",
        "",
        "| row | set-up | quantity | measured | model | error | assumptions |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in data.measurements:
        model = m.predict(perf[m.family])
        lines.append(
            f"| {m.row} | {m.setup} | {m.quantity} | {_fmt(m.value)} | {_fmt(model)} | {model / m.value - 1:+.0%} "
            f"| {m.assumption} |"
        )
    lines += ["", "## Left out", "", "| row | reason |", "|---|---|"]
    lines += [f"| {rid} | {reason} |" for rid, reason in data.skipped]
    lines += ["", "## Assumptions and known gaps", ""]
    lines += [f"- {text}" for text in NOTES]
    totals = [
        f"{m.row} {m.predict(perf[m.family]) * m.gpus / m.value:.1f}x"
        for m in data.measurements
        if READ_AS_PER_GPU in m.assumption
    ]
    lines.append(f"- Read as totals instead of per GPU, model / measured would be: {', '.join(totals)}.")
    return "\n".join(lines) + "\n"


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.4g}"


NOTES = (
    "Hardware: datasheet peaks; `H100`/`H100 80GB`/`H100 SXM 80GB` are the SXM part (3,350 GB/s, 989 TFLOP/s), "
    "`A100`/`A100 80GB` the 80 GB SXM part, `H200` 4,800 GB/s. Added in `routing.sim.calibration.EXTRA_HARDWARE`: "
    "L40S (864 GB/s, 362 dense FP16 TFLOP/s; the 181 figure is the older L40's), H100 PCIe (2,000 GB/s, 756), "
    "RTX 4090 (1,008 GB/s, 165 with FP32 accumulation), and the CPU hosts (dual/six-channel DRAM bandwidth, "
    "FP32 vector peak).",
    "FP8 (TensorRT-LLM, NIM, vLLM rows): weights 1 byte/param, FLOPs at twice the FP16 rate. TensorRT-LLM and NIM "
    "FP8 builds also keep the KV cache in FP8 (`--fp8_kv_cache`, ModelOpt checkpoints); vLLM's stays 16-bit. "
    "Embeddings kept in 16 bits are ignored (~1 GB on 8B models).",
    "Models: Llama-2 7B 6.74B params, 32 layers, 32 KV heads; Llama-2 70B 68.98B, 80 layers, 8 KV heads; "
    "Llama-3 8B 8.03B, 32 layers, 8 KV heads; Llama-3 70B 70.55B, 80 layers, 8 KV heads (head dim 128).",
    "TTFT rows at batch 1: one iteration with the whole prompt. Static batching (TensorRT-LLM v0.6.1): one "
    "context iteration over all prompts, then OSL - 1 decode iterations at mean context ISL + OSL/2. Max load "
    f"(trtllm-bench, MLPerf Offline): as many sequences as the KV cache holds ({MEMORY_HEADROOM:.0%} of GPU memory "
    f"minus weights), at most {MAX_BATCH['trtllm']} (TensorRT-LLM) or {MAX_BATCH['vllm']} (vLLM), with prompts "
    f"arriving in chunks of up to {TOKEN_BUDGET} tokens; output tok/s = batch / mean iteration. Clients (NIM): "
    "closed loop, ITL = mean iteration with the other clients' prompts mixed in, throughput = running x OSL / "
    "(TTFT + (OSL - 1) x ITL).",
    "Single-stream llama.cpp rows: one decode iteration per token; prompt-eval figures: one iteration over the "
    f"prompt ({UNSTATED_PROMPT} tokens where unstated).",
    "Tensor parallelism has one efficiency for every step, but the rows show it is better for big prefills than "
    "for small decode steps (trt05-3 under-, trt05-8 over-estimated); the overhead also absorbs all-reduce latency.",
    "The model is too fast on the long-output 70B static-batch rows (trt061-6, trt061-8); the A100 "
    "70B rows (trt061-12..14) are read as per GPU, as the H100 table is.",
    "llama.cpp rows mix 2023 builds (XiongjieDai's table) with a 2024 one (lcpp-7, RTX 4090) whose prompt "
    "processing is several times faster per FLOP; one MFU cannot fit both, so prompt-eval errors are large. "
    "The same holds for the CPU prompt rows (2023 build with 32 threads on a hybrid CPU against a 2026 build).",
    "TGI and MII are not fitted (no usable rows); see the constants table.",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--csv", type=Path, default=CSV_PATH)
    parser.add_argument("--out", default=str(OUT_PATH), help="markdown report path, or - for stdout")
    args = parser.parse_args(argv)
    perf = fit_all(args.csv)
    print("# PERF literals for routing/sim/calibration.py", file=sys.stderr)
    print(literal(perf), file=sys.stderr)
    drift = [f for f, p in perf.items() if not _close(p, PERF.get(f))]
    if drift:
        print(f"# differs from routing.sim.calibration.PERF by more than 1%: {', '.join(drift)}", file=sys.stderr)
    text = report(perf, collect(load_rows(args.csv)))
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
    return 0


def _close(a: EnginePerf, b: EnginePerf | None, rel: float = 0.01) -> bool:
    if b is None:
        return False
    pairs = ((a.mfu, b.mfu), (a.mbu, b.mbu), (a.step_overhead_ms, b.step_overhead_ms), (a.tp_eff, b.tp_eff))
    return all(abs(x - y) <= rel * abs(y) for x, y in pairs)


if __name__ == "__main__":
    raise SystemExit(main())
