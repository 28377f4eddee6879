"""Where in a request body a pydantic validation error lies, as the API's own parameter path, and the
one 400 every OpenAI-shaped door answers for it (``validation_error``)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from gateway.http.errors import ApiError, bad_request, clip

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


def validation_error(exc: ValidationError, path: Callable[[tuple[Any, ...]], str]) -> ApiError:
    """A pydantic error as OpenAI's 400: the deepest error's parameter (``path`` spells it in the
    door's own terms), clipped when quoted, and OpenAI's code for what is wrong with it."""
    param, err = deepest(exc, path)
    kind = err["type"]
    if kind == "union_tag_invalid":  # the discriminator's value is wrong: name that field
        param += "." + str(err.get("ctx", {}).get("discriminator", "type")).strip("'")
    shown = clip(param)
    if kind == "missing":
        return bad_request(f"Missing required parameter: '{shown}'.", shown, "missing_required_parameter")
    if kind == "extra_forbidden":
        return bad_request(f"Unrecognized request argument supplied: {shown}", shown, "unknown_parameter")
    code = "invalid_type" if kind.endswith("_type") or kind == "union_tag_invalid" else "invalid_value"
    return bad_request(f"Invalid value for '{shown}': {clip(err['msg'])}.", shown, code)
