"""Where a fleet saturates on a workload, model by model, and which backends are the bottleneck."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.sim.simulate import SimFleet, backend_capacity_rps
from routing.sim.workload import SimRequest


@dataclass(frozen=True)
class ModelCapacity:
    """One model's backends and the request rate they sustain on the model's mean request."""

    model: str
    share: float
    """Its share of the workload's requests."""
    backends: dict[str, float]
    """Requests/s each backend serving it sustains at best."""

    @property
    def rps(self) -> float:
        return sum(self.backends.values())

    @property
    def fleet_rps(self) -> float:
        """The whole workload's request rate at which this model's backends saturate."""
        return self.rps / self.share if self.share > 0 else float("inf")


def capacities(
    fleet: SimFleet, requests: Sequence[SimRequest], models: Sequence[str], prefill_share: float = 1.0
) -> list[ModelCapacity]:
    """Every model the workload asks for, the first to saturate first (a model no backend serves has
    a capacity of 0)."""
    out = []
    engines = fleet.engines()
    for model in sorted(set(models)):
        mine = [r for r, m in zip(requests, models, strict=True) if m == model]
        prompt = sum(r.prompt_tokens for r in mine) / len(mine)
        out_tokens = sum(r.output_tokens for r in mine) / len(mine)
        each = {
            e.name: backend_capacity_rps(e, prompt, out_tokens, prefill_share) for e in engines if e.model.name == model
        }
        out.append(ModelCapacity(model, len(mine) / len(requests), each))
    return sorted(out, key=lambda c: c.fleet_rps)


def bottleneck(caps: Sequence[ModelCapacity]) -> str:
    """A line naming the model and backends that saturate first, and at what request rate."""
    if not caps:
        return "capacity: no requests"
    first = caps[0]
    if not first.backends:
        return f"bottleneck: model {first.model} ({first.share:.0%} of requests) has no backend: every request fails"
    backends = ", ".join(f"{n} {rps:.2f} req/s" for n, rps in sorted(first.backends.items(), key=lambda kv: kv[1]))
    then = f"; next: model {caps[1].model} at {caps[1].fleet_rps:.2f} req/s" if len(caps) > 1 else ""
    return (
        f"bottleneck: model {first.model} ({first.share:.0%} of requests) on {backends}: the fleet saturates at "
        f"about {first.fleet_rps:.2f} req/s{then}"
    )


def lines(caps: Sequence[ModelCapacity]) -> list[str]:
    """A capacity line per model, the bottleneck first."""
    return [
        f"model {c.model}: {c.share:.0%} of requests, {c.rps:.2f} req/s on "
        + (", ".join(f"{n} {rps:.2f}" for n, rps in c.backends.items()) or "no backend")
        + f": saturates at {c.fleet_rps:.2f} req/s of all traffic"
        for c in caps
    ]
