"""The compiled request path (setup.py, ``make compiled``): what it compiles, and where.

In the tree no module is compiled (a compiled module beside its source wins the import over every later
edit); in the copy ``tools/compiled_tree.py`` builds, every module ``pyproject.toml`` lists is, so that
the tests ``make test`` runs again there test compiled code and not the source beside it.
"""

from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path

import pytest

from tests.compiled import compiled
from tools.compiled_tree import MARK

ROOT = Path(__file__).resolve().parents[2]
LISTED = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["enginegate"]["compiled"]
PACKAGES = ("gateway", "backends", "routing", "values")


def _module(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _async_generators(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{path}:{node.lineno} {node.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.AsyncFunctionDef)
        and any(isinstance(inner, ast.Yield | ast.YieldFrom) for inner in ast.walk(node))
    ]


def test_every_listed_module_exists_and_has_nothing_mypyc_cannot_compile() -> None:
    assert sorted(set(LISTED)) == LISTED, "the list is kept sorted, each module once"
    for path in LISTED:
        assert (ROOT / path).is_file(), f"{path} is listed as compiled but does not exist"
        assert path.split("/")[0] in PACKAGES
        assert not _async_generators(ROOT / path), "mypyc does not compile async generators"


def _byte_tests(source: str) -> list[int]:
    """The lines that test one byte in bytes with a bytes literal (``b"x" in data``)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Constant)
        and isinstance(node.left.value, bytes)
        and len(node.left.value) == 1
        and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
    ]


def test_the_request_path_tests_a_byte_in_bytes_with_its_int() -> None:
    """``0 in data``, not ``b"\\x00" in data``: the bytes are tried as an int first, a TypeError made and
    cleared each time (``values.calls``)."""
    assert _byte_tests('x = 0 in data\nif b"\\\\" not in data or b"ab" in data: pass') == [2]
    assert [f"{path}:{line}" for path in LISTED for line in _byte_tests((ROOT / path).read_text())] == []


IN_COPY = (ROOT / MARK).exists()
"""Running in build/compiled, after tools/compiled_tree.py built it."""


@pytest.mark.skipif(IN_COPY, reason="the compiled copy holds compiled modules by design")
def test_the_tree_holds_no_compiled_module() -> None:
    stray = [p for package in PACKAGES for p in (ROOT / package).rglob("*") if p.suffix in {".so", ".pyd"}]
    assert stray == [], "compile in a copy (make compiled), never beside the sources"


@pytest.mark.skipif(not IN_COPY, reason="only the copy make compiled builds holds compiled modules")
def test_the_copy_holds_every_listed_module_compiled() -> None:
    loaded = {path: importlib.import_module(_module(path)) for path in LISTED}
    assert [path for path, module in loaded.items() if not compiled(module)] == []


def _records(path: str) -> list[str]:
    """The ``@value`` records a module defines."""
    tree = ast.parse((ROOT / path).read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(
            isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "value"
            for d in node.decorator_list
        )
    ]


@pytest.mark.skipif(not IN_COPY, reason="only the copy make compiled builds holds compiled modules")
def test_the_records_of_compiled_modules_are_native_classes() -> None:
    """mypyc takes ``@value(frozen=True)`` for ``dataclasses.dataclass`` (``values``): a record of a compiled
    module is a native class, whose fields compiled code reads as struct members, not a Python class."""
    records = {(path, name) for path in LISTED for name in _records(path)}
    assert len(records) >= 10  # routing's records among them
    python = [
        f"{path}:{name}"
        for path, name in sorted(records)
        if "__mypyc_attrs__" not in vars(getattr(importlib.import_module(_module(path)), name))
    ]
    assert python == []
