"""``@value(frozen=True)``: an immutable record for the request path, as cheap to build as a mutable
one, and read at C speed where mypyc compiles it.

A frozen dataclass stores each field in ``__init__`` through ``object.__setattr__`` (its own
``__setattr__`` refuses), which makes building one about five times slower than building the same
class unfrozen (seven fields: 760 ns against 160 ns here), and the request path builds a few dozen
per request and more per streamed chunk. A ``@value`` class is frozen for the type checker (every
module is mypy-strict: an assignment to a field is an error there) and a plain dataclass at run time,
hashed by its fields as a frozen one is (``unsafe_hash``): slotted where it is interpreted, and where
mypyc compiles its module a native class, whose fields compiled code reads as C struct members.

The type checker and mypyc see ``value`` as ``dataclasses.dataclass`` itself, which is why each record
says ``frozen=True`` (the run time refuses a record without it): mypyc makes a class native only under
a decorator it knows by name (``dataclasses.dataclass``, attrs), and any other class is a Python
class, every field of which compiled code reads through the type's attribute lookup (about 250
instructions a read, measured under callgrind; 388 such reads were a fifth of a whole answer's
instructions). ``dataclasses.replace`` works on a record as on any dataclass; ``evolve`` does the same
about four times faster (for the request path: 0.8 against 3.4 µs for ``GenerationRequest``'s 27
fields), reading the fields at once and passing them by position where ``replace`` looks each one up
by name and passes it as a keyword.

Building a native record still runs the ``__init__`` that ``dataclass`` writes, interpreted, each field
set through a descriptor (10,500 instructions for ``RequestFeatures``' 21 fields); the records built on
every request write theirs out in the class, which mypyc compiles (``routing.types``). A record another
record extends keeps the generated one: mypyc calls a written-out ``__init__`` of a base wrongly from a
subclass's.

The lowest layer of the tree (``tests/unit/test_layering.py``): ``routing`` and ``backends``, which
must not know each other, both build such records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

__all__ = ["evolve", "value"]

T = TypeVar("T")

if TYPE_CHECKING:
    from dataclasses import dataclass as value
else:

    def value(cls: type[T] | None = None, /, *, frozen: bool = False, kw_only: bool = False) -> Any:
        """``cls`` as a dataclass hashed by its fields, slotted unless mypyc made it a native class
        (see the module); ``frozen`` must be said, and is the type checker's alone."""
        if not frozen:
            raise TypeError("a @value record is frozen: write @value(frozen=True)")

        def make(c: type[T]) -> type[T]:
            native = "__mypyc_attrs__" in c.__dict__  # mypyc hands its native class over as it is
            made = dataclass(slots=not native, unsafe_hash=True, kw_only=kw_only)(c)
            names = tuple(f.name for f in fields(made))
            if len(names) > 1 and not kw_only and all(f.init and not f.kw_only for f in fields(made)):
                setattr(made, _SHAPE, (attrgetter(*names), {name: i for i, name in enumerate(names)}))
            return made

        return make if cls is None else make(cls)


_SHAPE = "_value_shape"
"""The class attribute where ``value`` leaves what ``evolve`` needs: a getter of every field at once, and
each field's position; absent where the fields cannot all be passed by position."""


def evolve(record: T, /, **changes: Any) -> T:
    """``dataclasses.replace(record, **changes)`` for a ``@value`` record, faster (the module docstring);
    any other dataclass goes to ``replace``."""
    cls = type(record)
    shape: tuple[Callable[[T], tuple[Any, ...]], dict[str, int]] | None = getattr(cls, _SHAPE, None)
    if shape is None:
        return replace(record, **changes)  # type: ignore[type-var]  # a dataclass, or replace says why not
    get, index = shape
    values = list(get(record))
    for name, new in changes.items():
        i = index.get(name)
        if i is None:
            raise TypeError(f"{cls.__name__} has no field {name!r}")
        values[i] = new
    return cls(*values)
