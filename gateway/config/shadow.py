"""Shadow traffic: a rule's ``shadow:`` (the candidate a share of its requests is mirrored to) and the
top-level ``shadow:`` section (where the comparisons of each request pair go)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from pydantic import Field

from gateway.config.models import Name
from gateway.strict import Frozen


class RuleShadow(Frozen):
    to: Name
    """The candidate: a backend, a pool, or a model (a name that is both is refused). A mirrored request
    is routed among the backends it names (a model: among the backends serving that model, which is
    then asked instead) by the same ``choose()`` as any request; its answer is read to its end and
    dropped."""
    share: float = Field(gt=0, le=1)
    """The share of the rule's requests mirrored, drawn per request (1: every request)."""
    max_concurrency: int = Field(default=8, ge=1, le=10_000)
    """Mirrored requests of this rule in flight at once; a request beyond it is not mirrored (counted
    in ``enginegate_shadow_dropped_total`` with reason ``full``): the candidate never queues behind
    the gateway's own experiment."""


class ShadowConfig(Frozen):
    log_path: str | None = None
    """A JSON-lines file each request pair's comparison is appended to, for ``enginegate shadow
    report`` (relative: to the config file); null: kept in memory only (``GET /admin/shadow``)."""
    ring: int = Field(default=10_000, ge=1, le=1_000_000)
    """Comparisons kept in memory for ``GET /admin/shadow`` (the oldest go first)."""
    log_texts: bool = False
    """Also store the prompt and both answers' texts in each comparison. They are user data: off by
    default, when the texts are compared in memory and only the verdict is kept."""
    similarity_threshold: float = Field(default=0.5, ge=0, le=1)
    """Sampled answers (temperature above 0) agree when the Jaccard similarity of their word sets
    reaches this; greedy answers (temperature 0) agree only when their texts are equal."""


class _Rule(Protocol):
    @property
    def shadow(self) -> RuleShadow | None: ...


def shadow_problems(rules: Sequence[_Rule], backends: Iterable[str], models: Iterable[str]) -> list[str]:
    """Rules whose ``shadow.to`` names no backend, pool or model, or names a model and a backend or pool
    alike (``backends``: the backends' and pools' names)."""
    targets, names = set(backends), set(models)
    problems = []
    for i, r in enumerate(rules):
        to = r.shadow.to if r.shadow is not None else None
        if to is None:
            continue
        if to not in targets | names:
            problems.append(f"routing.rules[{i}].shadow.to: {to!r} is neither a backend, a pool nor a model")
        elif to in targets and to in names:
            problems.append(f"routing.rules[{i}].shadow.to: {to!r} names a model and a backend or pool; rename one")
    return problems
