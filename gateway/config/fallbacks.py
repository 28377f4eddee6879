"""The checks of ``models[].aliases`` and ``models[].fallbacks`` across the models (docs/traffic.md)."""

from __future__ import annotations

from gateway.config.models import ModelConfig
from routing.fallback import Step, chains, cycle


def aliases_of(models: list[ModelConfig]) -> dict[str, str]:
    """alias -> the model it names."""
    return {alias: m.name for m in models for alias in m.aliases}


def chains_of(models: list[ModelConfig]) -> dict[str, tuple[Step, ...]]:
    """Each model's whole fallback chain (``routing.fallback.chains``) of a validated config."""
    return chains({m.name: [Step(s.model, frozenset(s.when)) for s in m.fallbacks] for m in models})


def problems(models: list[ModelConfig]) -> list[str]:
    """``path: message`` for every alias that shadows a name or another alias, and every fallback that
    names no generating model, names one twice, or closes a cycle."""
    out: list[str] = []
    names = {m.name: m for m in models}
    owner: dict[str, str] = {}
    for i, m in enumerate(models):
        for j, alias in enumerate(m.aliases):
            where = f"models[{i}].aliases[{j}]"
            if alias in names:
                out.append(f"{where}: {alias!r} is a model's name (an alias cannot shadow it)")
            elif alias in owner:
                out.append(f"{where}: {alias!r} is already an alias of model {owner[alias]!r}")
            else:
                owner[alias] = m.name
    graph: dict[str, list[Step]] = {}
    for i, m in enumerate(models):
        steps = m.fallbacks
        if steps and m.kind == "embed":
            why = "the vectors of another model mean other things"
            out.append(f"models[{i}].fallbacks: embedding models have no fallbacks ({why})")
            continue
        seen: set[str] = set()
        for j, step in enumerate(steps):
            where = f"models[{i}].fallbacks[{j}]"
            target = names.get(step.model)
            if target is None and step.model in owner:
                out.append(f"{where}: {step.model!r} is an alias of {owner[step.model]!r} (name the model)")
            elif target is None:
                out.append(f"{where}: unknown model {step.model!r} (known: {', '.join(names)})")
            elif target.kind != "generate":
                out.append(f"{where}: {step.model!r} is an embedding model; a generating model falls back to another")
            elif step.model in seen:
                out.append(f"{where}: {step.model!r} is named twice")
            elif not step.when:
                out.append(f"{where}.when: empty: the step would never be tried")
            seen.add(step.model)
        graph[m.name] = [Step(s.model, frozenset(s.when)) for s in steps if s.model in names]
    loop = cycle(graph)
    if loop is not None:
        i = next(i for i, m in enumerate(models) if m.name == loop[0])
        out.append(f"models[{i}].fallbacks: the chain cycles: {' -> '.join(loop)}")
    return out
