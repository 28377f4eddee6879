"""The configuration reference, generated from the config models so that it cannot drift.

Every key of the gateway's YAML file with its type, default and description, walked from the
pydantic models (descriptions are the attribute docstrings under each field, or a field's
``description``). MkDocs runs this module as a hook (``mkdocs.yml``: ``hooks:``): the page
``docs/config-reference.md`` holds a marker that is replaced at build time. By hand:
``python -m tools.config_reference`` prints the Markdown.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- config-reference -->"
REFERENCE_PAGE = "config-reference.md"
TAG = "engine"
"""The key that tells a list's variants apart (``backends[].engine``)."""
RESULTS = ROOT / "benchmarks" / "results"
"""Benchmark results, published in the site under the same path (``benchmarks/results/...``)."""


def root_model() -> type[BaseModel]:
    """The root of the config file (the one line to change when the config module moves)."""
    from gateway.config import GatewayConfig

    return GatewayConfig


@dataclass(frozen=True)
class Row:
    key: str
    """Dotted path as written in YAML: ``routing.breaker.threshold``, ``backends[].url``."""
    type: str
    default: str
    description: str


@dataclass(frozen=True)
class Section:
    title: str
    intro: str
    rows: tuple[Row, ...]


@cache
def attribute_docstrings(cls: type) -> dict[str, str]:
    """``{field: docstring}`` from the string literal under each annotated attribute of ``cls`` itself."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            out[node.target.id] = _one_line(after.value.value)
    return out


def _one_line(text: str) -> str:
    # reStructuredText literals (``x``) as Markdown code spans
    return " ".join(inspect.cleandoc(text).split()).replace("``", "`")


def _description(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    if field.description:
        return _one_line(field.description)
    for cls in model.__mro__:  # a field documented where it is declared, in a base class too
        if name in attribute_docstrings(cls):
            return attribute_docstrings(cls)[name]
    return ""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config models an annotation holds: itself, list items, dict values, union members."""
    annotation = _strip(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def type_name(annotation: Any) -> str:
    annotation = _strip(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(type_name(a) for a in args))  # variants: "mapping" once
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(annotation, str(annotation))


_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "length ≥"), ("max_length", "length ≤"))


def _constraints(field: FieldInfo) -> str:
    found = []
    for item in field.metadata:
        for attr, sign in _BOUNDS:
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{sign} {value}")
    return ", ".join(found)


def _with_bounds(kind: str, field: FieldInfo) -> str:
    bounds = _constraints(field)
    return f"{kind}, {bounds}" if bounds else kind


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    if isinstance(value, BaseModel):
        return "{}" if value == type(value)() else _yaml(value.model_dump())
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return f"`{_yaml(field.default_factory())}`"  # type: ignore[call-arg]
    if field.default is PydanticUndefined:
        return "required"
    return f"`{_yaml(field.default)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def rows(model: type[BaseModel], prefix: str, skip: frozenset[str] = frozenset()) -> Iterator[Row]:
    """One row per key of ``model`` under ``prefix``, then the keys of the models it nests."""
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        key = f"{prefix}.{name}" if prefix else name
        yield Row(
            key, _with_bounds(type_name(field.annotation), field), _default(field), _description(model, name, field)
        )
        annotation = _strip(field.annotation)
        origin = typing.get_origin(annotation)
        inner = f"{key}[]" if origin is list else f"{key}.<name>" if origin is dict else key
        nested = _models_in(annotation)
        if len(nested) == 1:
            yield from rows(nested[0], inner)


def _defining_class(model: type[BaseModel], name: str) -> type:
    """The class in ``model``'s bases that declares the field (where its docstring also lives)."""
    for cls in reversed(model.__mro__):
        if name in getattr(cls, "__annotations__", {}):
            return cls
    return model


def _engine(model: type[BaseModel]) -> str:
    return str(typing.get_args(model.model_fields[TAG].annotation)[0])


def union_sections(
    key: str, field: FieldInfo, members: list[type[BaseModel]], description: str = ""
) -> Iterator[Section]:
    """A list of tagged variants (``backends``): each group of keys once, under the class that declares
    them (every backend, engines over HTTP, one engine), naming the ``engine:`` values that take them."""
    groups: dict[type, list[type[BaseModel]]] = {}
    for member in members:
        for name in member.model_fields:
            takers = groups.setdefault(_defining_class(member, name), [])
            if name != TAG and member not in takers:
                takers.append(member)
    tag = " or ".join(type_name(m.model_fields[TAG].annotation) for m in members).replace(" or one of", ",")
    head = (
        Row(key, _with_bounds(type_name(field.annotation), field), _default(field), description),
        Row(f"{key}[].{TAG}", tag, "required", "Which engine the backend is: the keys below depend on it."),
    )
    for cls, takers in groups.items():
        if not takers:
            continue
        names = frozenset(n for n in takers[0].model_fields if _defining_class(takers[0], n) is not cls) | {TAG}
        every = len(takers) == len(members)
        title = f"`{key}[]`: " + (
            "every backend" if every else "`engine:` " + ", ".join(f"`{_engine(m)}`" for m in takers)
        )
        body = tuple(rows(takers[0], f"{key}[]", skip=names))
        yield Section(title, _one_line(cls.__doc__ or ""), (*head, *body) if every else body)


def sections(root: type[BaseModel] | None = None) -> Iterator[Section]:
    root = root or root_model()
    for name, field in root.model_fields.items():
        annotation = _strip(field.annotation)
        nested = _models_in(annotation)
        intro = _description(root, name, field)
        if len(nested) > 1:
            yield from union_sections(name, field, nested, intro)
            continue
        section_rows = tuple(rows(root, "", skip=frozenset(root.model_fields) - {name}))
        if section_rows and section_rows[0].type == "mapping":
            section_rows = section_rows[1:]  # the section's own heading names it
        if nested and not intro:
            intro = _one_line(nested[0].__doc__ or "")
        yield Section(f"`{name}`", intro, section_rows)


def markdown(root: type[BaseModel] | None = None) -> str:
    out = []
    for section in sections(root):
        out += [f"## {section.title}", ""]
        if section.intro:
            out += [section.intro, ""]
        out += ["| key | type | default | description |", "|---|---|---|---|"]
        out += [f"| `{r.key}` | {_cell(r.type)} | {_cell(r.default)} | {_cell(r.description)} |" for r in section.rows]
        out.append("")
    return "\n".join(out)


# MkDocs hooks (mkdocs.yml: hooks). The site documents the checkout it is built from, not whatever
# copy of the package the environment has installed.


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Benchmark results are published as they are committed, under ``benchmarks/results/``."""
    from mkdocs.structure.files import File

    for path in sorted(RESULTS.iterdir()):
        if path.suffix in (".md", ".png"):
            files.append(File.generated(config, f"benchmarks/results/{path.name}", abs_src_path=str(path)))
    return files


_RESULTS_LINK = re.compile(r"\]\(\.\./benchmarks/results/")


def on_page_markdown(markdown_text: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """The reference into its page; links written for the repository (``../benchmarks/results/x.md``
    from ``docs/``) to the published copies."""
    if page.file.src_uri == REFERENCE_PAGE:
        if MARKER not in markdown_text:
            raise ValueError(f"{REFERENCE_PAGE} lost its marker {MARKER}")
        markdown_text = markdown_text.replace(MARKER, markdown())
    return _RESULTS_LINK.sub("](benchmarks/results/", markdown_text)


if __name__ == "__main__":
    print(markdown())
