"""``@value`` records: built like mutable ones, hashed and compared by their fields, and ``evolve`` gives
what ``dataclasses.replace`` gives, defaults, factories and ``__post_init__`` included."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, cast

import pytest

import routing.types
from backends.base import EngineClock, GenerationRequest
from tests.compiled import interpreted_only
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


def _written_out() -> list[type]:
    """Every ``@value`` record of the tree whose class writes out its ``__init__`` (``routing.types``)."""
    root = Path(__file__).resolve().parents[2]
    found = []
    for path in sorted(p for package in ("backends", "gateway", "routing") for p in (root / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = [
            node.name
            for node in tree.body
            if isinstance(node, ast.ClassDef)
            and any(isinstance(d, ast.Call) and getattr(d.func, "id", None) == "value" for d in node.decorator_list)
            and any(isinstance(item, ast.FunctionDef) and item.name == "__init__" for item in node.body)
        ]
        if names:
            module = importlib.import_module(path.relative_to(root).with_suffix("").as_posix().replace("/", "."))
            found += [getattr(module, name) for name in names]
    return found


@interpreted_only(routing.types, "a compiled __init__ has no signature to inspect (the source is the same)")
def test_a_written_out_init_takes_the_fields_in_order_with_their_defaults() -> None:
    """A record's own ``__init__`` (compiled where its module is) must be the one ``dataclass`` would write:
    the fields in order, with the same defaults (None for a field built by a factory, which it builds)."""
    records = _written_out()
    assert {cls.__name__ for cls in records} >= {"RequestFeatures", "Candidate", "Decision", "BackendState"}
    for cls in records:
        params = list(inspect.signature(cls).parameters.values())
        assert [p.name for p in params] == [f.name for f in fields(cls)], cls
        for p, f in zip(params, fields(cls), strict=True):
            if f.default is not MISSING:
                assert p.default == f.default, (cls, f.name)
            elif f.default_factory is not MISSING:
                assert p.default is None, (cls, f.name)
            else:
                assert p.default is inspect.Parameter.empty, (cls, f.name)


@interpreted_only(routing.types, "the required fields are given stand-in objects, which compiled records refuse")
def test_a_written_out_init_sets_every_field() -> None:
    for cls in _written_out():
        required = [object() for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        made = cls(*required)
        for f, given in zip(fields(cls), required, strict=False):
            assert getattr(made, f.name) is given
        for f in fields(cls)[len(required) :]:
            factory = cast("Callable[[], object]", f.default_factory)
            expected = f.default if f.default is not MISSING else factory()
            assert getattr(made, f.name) == expected, (cls, f.name)


def test_sized_gives_what_evolve_gives() -> None:
    """``GenerationRequest.sized`` spells every field out (compiled, for every request without a length):
    a field added to the request and missed there would differ from ``evolve``'s copy here."""
    defaults = GenerationRequest("r", "m")
    values: dict[str, Any] = {}
    for f in fields(GenerationRequest)[2:]:
        now = getattr(defaults, f.name)
        values[f.name] = {
            int: 5,
            float: 0.5,
            bool: not now,
            str: "x",
            tuple: ("s",),
            dict: {"k": 1},
            list: [{"role": "user"}],
        }.get(type(now), now)
    values.update(
        max_tokens=9, messages=[{"role": "user"}], prompt="p", seed=3, tool_choice="none", parallel_tool_calls=True
    )
    values.update(response_format={"type": "json_object"}, presence_penalty=0.1, frequency_penalty=0.2)
    values.update(logit_bias={1: 2.0}, user="u", clock=EngineClock(1.0), headers={"traceparent": "t"})
    request = GenerationRequest("r", "m", **values)
    assert all(getattr(request, f.name) != getattr(defaults, f.name) for f in fields(GenerationRequest)[2:])
    sized = request.sized(7)
    assert sized == evolve(request, max_tokens=7)
    assert [getattr(sized, f.name) for f in fields(GenerationRequest)] == [
        getattr(evolve(request, max_tokens=7), f.name) for f in fields(GenerationRequest)
    ]  # clock and headers too, which equality leaves out
