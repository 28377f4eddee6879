"""``@value`` records: built like mutable ones, hashed and compared by their fields, and ``evolve`` gives
what ``dataclasses.replace`` gives, defaults, factories and ``__post_init__`` included."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from backends.base import GenerationRequest
from values import evolve, value


@value(frozen=True)
class Pair:
    a: int
    b: str = "b"
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a < 0")


@value(frozen=True, kw_only=True)
class Named:
    x: int
    y: int = 0


@dataclass
class Plain:
    x: int
    y: int = 0


def test_evolve_gives_what_replace_gives() -> None:
    p = Pair(1, tags=["t"])
    assert evolve(p, b="c") == replace(p, b="c") == Pair(1, "c", ["t"])
    assert evolve(p) == p and evolve(p) is not p
    request = GenerationRequest("r", "m", messages=[{"role": "user", "content": "hi"}], stop=("x",), n=2)
    assert evolve(request, max_tokens=7) == replace(request, max_tokens=7)
    assert evolve(request, max_tokens=7).clock is request.clock  # fields excluded from comparison kept too


def test_evolve_runs_the_checks_and_refuses_unknown_fields() -> None:
    with pytest.raises(ValueError, match="a < 0"):
        evolve(Pair(1), a=-1)
    with pytest.raises(TypeError, match="no field 'c'"):
        evolve(Pair(1), c=3)


def test_keyword_only_records_and_other_dataclasses_go_to_replace() -> None:
    assert evolve(Named(x=1), y=2) == Named(x=1, y=2)
    assert evolve(Plain(1), y=2) == Plain(1, 2)
    with pytest.raises(TypeError):
        evolve(Plain(1), z=2)


def test_a_record_must_say_it_is_frozen() -> None:
    """The type checker sees ``value`` as ``dataclasses.dataclass`` (for mypyc): without ``frozen=True`` it
    would let fields be assigned, so the run time refuses the record."""
    with pytest.raises(TypeError, match="frozen=True"):

        @value
        class Loose:
            x: int

    with pytest.raises(TypeError, match="frozen=True"):
        value()


def test_records_are_slotted_and_hashed_by_their_fields_where_interpreted() -> None:
    assert not hasattr(Pair(1), "__dict__")
    assert hash(Named(x=1)) == hash(Named(x=1)) and Named(x=1) == Named(x=1)
