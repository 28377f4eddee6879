"""A rule's weighted split (``routing.rules[].split``), what keeps callers on one arm, and the canary
guard; and the checks that reach across sections (an arm names a backend or pool serving the rule's
models)."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from gateway.config.models import Name
from gateway.strict import Frozen

if TYPE_CHECKING:
    from gateway.config.engines import BackendConfig
    from gateway.config.models import ModelConfig

WEIGHT_SUM = 100.0
"""A split's weights are percents of the rule's traffic: they sum to this."""


class ArmConfig(Frozen):
    to: Name
    """The backend or pool this arm's requests go to (within it, routing chooses as under ``require:``)."""
    weight: float = Field(gt=0, le=WEIGHT_SUM)
    """Percent of the rule's traffic; the weights of a split sum to 100."""
    name: Name | None = None
    """The arm's name in ``x-enginegate-arm``, logs, metrics and ``/admin/splits``; default: ``to``."""

    @property
    def label(self) -> str:
        return self.name or self.to


class StickyConfig(Frozen):
    by: Literal["conversation", "key", "header"] | None = None
    """What keeps a caller on one arm: ``conversation`` (a hash of the conversation's opening: its
    system prompt and first user message), ``key`` (the API key's id) or ``header`` (the value of
    ``header``); without the key or the header, the conversation. Default: ``header`` when ``header``
    is given, else ``conversation``."""
    header: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9-]*$")
    """The request header whose value keeps a caller on one arm (lower case), e.g. ``x-user-id``."""

    @model_validator(mode="after")
    def _header_given(self) -> StickyConfig:
        if self.by == "header" and self.header is None:
            raise ValueError("by: header needs header: (the header's name)")
        if self.header is not None and self.by not in (None, "header"):
            raise ValueError(f"header: is only read with by: header (here by: {self.by})")
        if self.header == "authorization":
            raise ValueError("use by: key to keep an API key on one arm (the credential itself is never hashed)")
        return self

    @property
    def kind(self) -> str:
        """The routing form: ``conversation``, ``key`` or ``header:<name>``."""
        if self.header is not None:
            return f"header:{self.header}"
        return self.by or "conversation"


class GuardConfig(Frozen):
    max_error_rate_delta: float | None = Field(default=None, gt=0, le=1)
    """Stop a canary arm whose error rate (5xx and broken streams over its requests) exceeds the
    control arm's by more than this (0.05: five points)."""
    max_budget_miss_delta: float | None = Field(default=None, gt=0, le=1)
    """Stop a canary arm whose share of latency-budget misses (over its answers to requests with a
    budget) exceeds the control arm's by more than this."""
    min_requests: int = Field(default=100, ge=1)
    """Neither arm is judged before both have this many requests (budget misses: this many answers
    with a budget), counted since the config was loaded."""

    @model_validator(mode="after")
    def _some_margin(self) -> GuardConfig:
        if self.max_error_rate_delta is None and self.max_budget_miss_delta is None:
            raise ValueError("give max_error_rate_delta, max_budget_miss_delta or both")
        return self


def _arms_valid(arms: list[ArmConfig]) -> list[ArmConfig]:
    """Two arms or more, distinct, weights summing to 100."""
    if not arms:
        return arms
    if len(arms) < 2:
        raise ValueError("needs two arms or more (one arm is require:)")
    total = sum(a.weight for a in arms)
    if abs(total - WEIGHT_SUM) > 1e-6:
        raise ValueError(f"the arms' weights must sum to 100 (they sum to {total:g})")
    labels = [a.label for a in arms]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        names = ", ".join(map(repr, twice))
        raise ValueError(f"arm {names} appears twice (give the arms distinct to: or name:)")
    return arms


Arms = Annotated[list[ArmConfig], AfterValidator(_arms_valid)]


def check_split(
    arms: Sequence[ArmConfig], sticky: StickyConfig | None, guard: GuardConfig | None, require: Sequence[str]
) -> None:
    """Sticky and guard only with a split; a split without require (each arm is one)."""
    if not arms and (sticky is not None or guard is not None):
        raise ValueError("sticky: and guard: need split:")
    if arms and require:
        raise ValueError("split: and require: exclude each other (each arm is its own require:)")


def split_problems(
    rules: Sequence[tuple[str, Sequence[str], Sequence[ArmConfig]]],
    models: Sequence[ModelConfig],
    backends: Sequence[BackendConfig],
) -> list[str]:
    """``path: message`` for every arm naming no backend or pool, or unable to serve a model its rule
    matches, and for a split rule's name used twice; ``rules``: each rule's name, ``match.models`` and
    ``split``."""
    problems = []
    known = [m.name for m in models]  # embedding models too: a rule matching them routes their requests
    generating = {m.name for m in models if m.kind == "generate"}
    names = [name for name, _, _ in rules]
    for i, (name, patterns, arms) in enumerate(rules):
        if arms and names.count(name) > 1:  # the split's metrics and guard go by the rule's name
            problems.append(f"routing.rules[{i}].name: {name!r} is used twice (a split rule needs its own name)")
        matched = [m for m in known if not patterns or any(fnmatch.fnmatchcase(m, p) for p in patterns)]
        for j, arm in enumerate(arms):
            where = f"routing.rules[{i}].split[{j}].to"
            members = [b for b in backends if arm.to in (b.name, b.pool)]
            if not members and arm.to in known:  # an arm that sends its requests to another model
                embedding = sorted(m for m in {arm.to, *matched} if m not in generating)
                if embedding:  # another model's vectors mean something else: never a split's arm
                    problems.append(f"{where}: an arm naming a model splits generation models only "
                                    f"({', '.join(map(repr, embedding))} embeds)")  # fmt: skip
                continue
            if not members:
                problems.append(f"{where}: {arm.to!r} is neither a backend, a pool nor a model")
                continue
            served = {b.model for b in members}
            for model in matched:
                if model not in served:
                    problems.append(
                        f"{where}: {arm.to!r} cannot serve model {model!r}, which the rule matches "
                        "(narrow the rule's match.models, or add a backend of that model to the arm)"
                    )
    return problems
