"""Where in a request body a pydantic validation error lies, as the API's own parameter path."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

_MEMBERS = frozenset({"str", "int", "float", "bool", "constrained-str", "constrained-int", "constrained-float"})


def param_path(
    loc: tuple[Any, ...], tags: Collection[str], tagged: Collection[str] = (), index: str = "[{}]", sep: str = "."
) -> str:
    """``loc`` without what pydantic adds to it: the union member it tried (``str``, ``list[...]``,
    a model's name) and a discriminated union's tag (in ``tags``, after a list index or after a field
    in ``tagged``). ``index`` formats list indexes (``[0]`` for OpenAI, ``.0`` for Anthropic)."""
    out = ""
    previous: Any = None
    for part in loc:
        if isinstance(part, int):
            out += index.format(part)
        elif part in _MEMBERS or part[:1].isupper() or "[" in part:
            continue
        elif part in tags and (isinstance(previous, int) or previous in tagged):
            previous = None
            continue
        else:
            out += f"{sep}{part}" if out else part
        previous = part
    return out.replace("schema_", "schema")


def deepest(exc: ValidationError, path: Callable[[tuple[Any, ...]], str]) -> tuple[str, ErrorDetails]:
    """The error that names the real problem: a union reports each member it tried, and the one that
    got furthest into the value under the first error's field is the one the client meant."""
    errors = exc.errors(include_url=False)
    base = path(errors[0]["loc"])
    err = max((e for e in errors if path(e["loc"]).startswith(base)), key=lambda e: len(path(e["loc"])))
    return path(err["loc"]), err
