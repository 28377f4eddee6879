"""choose(): pure, ranked, explained."""

from __future__ import annotations

import pytest

from routing.features import InvalidHeader, features
from routing.policy import choose
from routing.types import BackendState, FleetSnapshot, Reason, RequestFeatures, Rules


def snap(*states: BackendState) -> FleetSnapshot:
    return FleetSnapshot(states)


def feats(model: str = "m") -> RequestFeatures:
    return RequestFeatures(model=model, prompt_tokens=10, max_tokens=5)


def test_healthy_backends_serving_the_model_in_config_order() -> None:
    fleet = snap(
        BackendState("x", frozenset({"other"}), True),
        BackendState("a", frozenset({"m"}), True),
        BackendState("b", frozenset({"m"}), False),
        BackendState("c", frozenset({"m"}), True),
    )
    decision = choose(feats(), fleet, Rules())
    assert decision.reason is Reason.FIRST_HEALTHY
    assert [c.backend for c in decision.candidates] == ["a", "c"]
    assert decision.candidates[0].score > decision.candidates[1].score
    assert decision.excluded == {"b": "unhealthy"}


def test_attempts_are_capped() -> None:
    fleet = snap(*(BackendState(str(i), frozenset({"m"}), True) for i in range(5)))
    assert len(choose(feats(), fleet, Rules(max_attempts=2)).candidates) == 2


def test_no_backend_and_no_healthy_backend_are_different_reasons() -> None:
    fleet = snap(BackendState("a", frozenset({"m"}), False))
    assert choose(feats("z"), fleet, Rules()).reason is Reason.NO_BACKEND_FOR_MODEL
    assert choose(feats(), fleet, Rules()).reason is Reason.NO_HEALTHY_BACKEND


def test_budget_headers() -> None:
    f = features("m", ["abcdefgh"], 5, True, {"x-slo-ttft-ms": "250", "x-latency-budget-ms": "2000"})
    assert (f.ttft_budget_ms, f.latency_budget_ms, f.prompt_tokens) == (250.0, 2000.0, 3)
    for bad in ("soon", "-5", "inf", "nan"):
        with pytest.raises(InvalidHeader):
            features("m", [], None, False, {"x-ttft-budget-ms": bad})
