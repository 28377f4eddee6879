"""Read engine load from Prometheus text: per-engine metric maps, versioned by name candidates."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from backends.base import Load


@dataclass(frozen=True)
class Gauge:
    """One number: the first candidate name present wins; samples matching ``labels`` are summed."""

    names: tuple[str, ...]
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class LoadMap:
    running: Gauge
    waiting: Gauge
    kv_cache: Gauge | None = None
    kv_scale: float = 1.0
    """Multiply the kv-cache gauge by this to get a 0..1 fraction."""
    held: tuple[Gauge, Gauge] | None = None
    """Requests the engine holds but does not run, as the first gauge minus the second (TensorRT-LLM's
    active minus scheduled requests): they wait, so they are added to ``waiting``."""


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _read(found: dict[str, list[tuple[dict[str, str], float]]], gauge: Gauge) -> float | None:
    for name in gauge.names:
        if name in found:
            want = dict(gauge.labels)
            return sum(v for labels, v in found[name] if all(labels.get(k) == x for k, x in want.items()))
    return None


def read_load(text: str, mapping: LoadMap) -> Load | None:
    """Load from metrics text, or None when the engine exposes none of the mapped names."""
    found = samples(text)
    running = _read(found, mapping.running)
    waiting = _read(found, mapping.waiting)
    if running is None and waiting is None:
        return None
    kv = _read(found, mapping.kv_cache) if mapping.kv_cache else None
    if mapping.held is not None:
        holding, run = (_read(found, g) for g in mapping.held)
        waiting = (waiting or 0) + max(0.0, (holding or 0) - (run or 0))
    return Load(
        running=int(running or 0),
        waiting=int(waiting or 0),
        kv_cache_usage=None if kv is None else kv * mapping.kv_scale,
    )
