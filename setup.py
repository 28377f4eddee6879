"""enginegate's build: pure Python by default; ``ENGINEGATE_COMPILE=1`` compiles the request path with mypyc.

mypyc (part of mypy, which already checks every module strictly) turns the listed modules into C
extensions: same source, same behaviour, less interpreter per call. The image builds this way
(``Dockerfile``); a development tree never does, because a compiled module sits beside its source and
silently wins the import over any later edit: ``make compiled`` builds a copy (``tools/compiled_tree.py``)
and ``make test`` runs the request path's tests again in it. The modules are listed once, in
``pyproject.toml`` (``[tool.enginegate] compiled``); a module with an async generator stays
interpreted (mypyc does not compile those).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from setuptools import setup


def compiled_modules(root: Path) -> list[str]:
    """The source files ``[tool.enginegate] compiled`` names, relative to ``root``."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    return list(config["tool"]["enginegate"]["compiled"])


def ext_modules() -> list[Any]:
    if os.environ.get("ENGINEGATE_COMPILE") != "1":
        return []
    from mypyc.build import mypycify  # a build dependency only when compiling: Dockerfile installs mypy

    return mypycify(compiled_modules(Path(__file__).parent), opt_level="3")


setup(ext_modules=ext_modules())
