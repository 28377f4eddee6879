"""A house a newcomer can read: product modules under 400 lines and functions under 80.

A module or function that is longer must say why it is one piece: a line in its docstring starting
"One piece:" (a long table, a state machine that reads best whole). Tests, tools and benchmarks are
not product code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "backends", "routing", "values")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
REASON = "One piece:"


def _modules() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def _says_why(node: ast.Module | ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    doc = ast.get_docstring(node) or ""
    return any(line.strip().startswith(REASON) for line in doc.splitlines())


def _too_long(path: Path, root: Path = ROOT) -> list[str]:
    source = path.read_text()
    tree = ast.parse(source)
    name = path.relative_to(root).as_posix()
    found = []
    lines = source.count("\n")
    if lines > MAX_MODULE_LINES and not _says_why(tree):
        found.append(f"{name}: {lines} lines")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES and not _says_why(node):
                found.append(f"{name}:{node.lineno} {node.name}(): {length} lines")
    return found


def test_product_modules_and_functions_are_short_or_say_why() -> None:
    found = [problem for path in _modules() for problem in _too_long(path)]
    assert not found, "split these at their seams, or say why each is one piece:\n" + "\n".join(found)


@pytest.mark.parametrize(("lines", "reason", "flagged"), [(401, "", True), (401, f"{REASON} a table.", False)])
def test_the_check_flags_a_long_module_unless_it_says_why(
    tmp_path: Path, lines: int, reason: str, flagged: bool
) -> None:
    module = tmp_path / "m.py"
    module.write_text(f'"""A module.\n\n{reason}\n"""\n' + "x = 1\n" * lines)
    assert bool(_too_long(module, tmp_path)) is flagged


def test_the_check_flags_a_long_function() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(90))
    tree = ast.parse(f"def f():\n{body}")
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef) and not _says_why(function)
