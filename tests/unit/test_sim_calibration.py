"""The simulator's engine performance model: sane shape, published rows reproduced, constants in sync."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.calibration import fit_all
from routing.catalog import ENGINES, GPUS
from routing.sim.calibration import PERF, EnginePerf, family_for_engine, hardware, step_ms

REPORT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "calibration.md"

LLAMA2_7B_KV = 2 * 32 * 32 * 128 * 2  # bytes per token, FP16 cache
LLAMA3_70B_KV_FP8 = 2 * 80 * 8 * 128 * 1


def llama8b_on_h100(perf: EnginePerf, batch: int, gpus: int = 1, params_b: float = 8.03) -> float:
    return step_ms(perf, GPUS["H100"], gpus, params_b, 2.0, 131072, batch, batch * 1024, 0)


@pytest.mark.parametrize("family", sorted(PERF))
def test_bigger_batch_takes_longer_per_step_but_yields_more_tokens(family):
    perf = PERF[family]
    batches = [1, 2, 8, 32, 128, 512]
    steps = [llama8b_on_h100(perf, b) for b in batches]
    rates = [b / s for b, s in zip(batches, steps, strict=True)]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert rates == sorted(rates) and len(set(rates)) == len(rates)


@pytest.mark.parametrize("family", ["trtllm", "vllm", "tgi", "mii"])
def test_more_gpus_are_faster(family):
    perf = PERF[family]
    steps = [step_ms(perf, GPUS["H100"], n, 70.55, 2.0, 327680, 16, 16 * 2048, 512) for n in (2, 4, 8)]
    assert steps[0] > steps[1] > steps[2]


@pytest.mark.parametrize("family", sorted(PERF))
def test_bigger_model_is_slower(family):
    perf = PERF[family]
    assert llama8b_on_h100(perf, 8, params_b=8) < llama8b_on_h100(perf, 8, params_b=70)
    prefill = [step_ms(perf, GPUS["A100-80GB"], 1, p, 2.0, 131072, 0, 0, 2048) for p in (1, 8, 30)]
    assert prefill == sorted(prefill)


def stated_error(row: str, quantity: str) -> float:
    """The relative error calibration.md reports for one published quantity."""
    for line in REPORT.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0] == row and cells[2].startswith(quantity):
            return float(re.fullmatch(r"([+-]?\d+)%", cells[5])[1]) / 100  # type: ignore[index]
    raise AssertionError(f"{row} {quantity} not in {REPORT}")


@pytest.mark.parametrize(
    ("row", "quantity", "measured", "model"),
    [
        # TensorRT-LLM v0.5, LLaMA 7B FP8 on one H100: first token of a 128-token prompt in 7 ms.
        (
            "trt05-1",
            "TTFT ms",
            7.0,
            lambda: step_ms(PERF["trtllm"], GPUS["H100"], 1, 6.74, 1.0, LLAMA2_7B_KV / 2, 0, 0, 128, fp8=True),
        ),
        # llama.cpp on an i9-13900K (DDR5-6400), LLaMA 7B Q4_0, 128 generated tokens: 54.74 ms per token.
        (
            "lcpu-1",
            "ms/token",
            54.74,
            lambda: step_ms(PERF["cpu"], hardware("i9-13900K"), 1, 6.74, 0.5625, LLAMA2_7B_KV, 1, 64, 0),
        ),
        # NIM, Llama 3.3 70B FP8 on two H100s, one client, 5000 in / 500 out: 18.58 ms between tokens.
        (
            "nim-1",
            "ITL ms",
            18.58,
            lambda: step_ms(PERF["trtllm"], GPUS["H100"], 2, 70.55, 1.0, LLAMA3_70B_KV_FP8, 1, 5250, 0, fp8=True),
        ),
    ],
)
def test_constants_reproduce_published_rows_within_the_reported_error(row, quantity, measured, model):
    error = model() / measured - 1
    assert abs(error) <= abs(stated_error(row, quantity)) + 0.01


def test_refit_gives_the_constants_in_the_module():
    fitted = fit_all()
    assert fitted.keys() == PERF.keys()
    for family, perf in PERF.items():
        got = fitted[family]
        for name in ("mfu", "mbu", "step_overhead_ms", "tp_eff"):
            assert getattr(got, name) == pytest.approx(getattr(perf, name), rel=0.01), (family, name)


def test_every_routing_engine_has_a_family():
    families = {family_for_engine(kind, "H100") for kind in ENGINES}
    assert families <= PERF.keys()
    assert family_for_engine("trtllm_serve") == "trtllm"
    assert family_for_engine("tgi_messages", "L4") == "tgi"
    assert family_for_engine("mii_openai") == "mii"
    assert family_for_engine("llama_server", "A10G") == "llamacpp_gpu"
    assert {family_for_engine(kind, "CPU") for kind in ("llama_cpp", "ctranslate2", "vllm")} == {"cpu"}
    with pytest.raises(ValueError, match="unknown engine"):
        family_for_engine("sglang")


def test_hardware_comes_from_the_catalog_first():
    assert hardware("H100") is GPUS["H100"]
    assert hardware("L40S").memory_gb == 48
    with pytest.raises(KeyError):
        hardware("TPU")
