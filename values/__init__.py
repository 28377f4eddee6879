"""``@value``: an immutable record for the request path, as cheap to build as a mutable one.

A frozen dataclass stores each field in ``__init__`` through ``object.__setattr__`` (its own
``__setattr__`` refuses), which makes building one about five times slower than building the same
class unfrozen (seven fields: 760 ns against 160 ns here), and the request path builds a few dozen
per request and more per streamed chunk. A ``@value`` class is frozen for the type checker (every
module is mypy-strict: an assignment to a field is an error there, ``dataclass_transform``'s
``frozen_default``) and a plain slotted dataclass at run time, hashed by its fields as a frozen one
is (``unsafe_hash``). ``dataclasses.replace`` works on it as on any dataclass.

The lowest layer of the tree (``tests/unit/test_layering.py``): ``routing`` and ``backends``, which
must not know each other, both build such records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, dataclass_transform, overload

T = TypeVar("T")


@overload
def value(cls: type[T], /) -> type[T]: ...
@overload
def value(*, kw_only: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, kw_only_default=False)
def value(cls: type[T] | None = None, /, *, kw_only: bool = False) -> type[T] | Callable[[type[T]], type[T]]:
    """``cls`` as a slotted dataclass, read-only to the type checker (see the module); ``kw_only`` as
    ``dataclass`` takes it (a subclass adding a field without a default to a class with defaults)."""

    def make(c: type[T]) -> type[T]:
        return dataclass(slots=True, unsafe_hash=True, kw_only=kw_only)(c)

    return make if cls is None else make(cls)
