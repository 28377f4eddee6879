"""Whether a module runs compiled (``make compiled``: mypyc, as the image ships it) or as Python source.

``make test`` runs the request path's tests twice: in the tree, interpreted, and in ``build/compiled``.
A test that looks at what only interpreted code has (frames, a stand-in object passed where a compiled
class is declared) is marked ``interpreted_only``: it ran on the source already.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest


def compiled(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from a compiled extension rather than its source."""
    return Path(module.__file__ or "").suffix in {".so", ".pyd"}


def interpreted_only(module: ModuleType, why: str) -> pytest.MarkDecorator:
    """Skip the test where ``module`` runs compiled, saying ``why`` it needs the source."""
    return pytest.mark.skipif(compiled(module), reason=f"{module.__name__} is compiled: {why}")
