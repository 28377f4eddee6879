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
