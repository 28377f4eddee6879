"""The architecture as a test: no import cycle between modules, and packages import only downwards.

Every module of ``gateway/``, ``backends/``, ``routing/`` and ``values/`` is parsed (never imported) and every
import counts: at module level, inside functions (a lazy import is still a dependency, only a later
one) and under ``TYPE_CHECKING`` (a module that names another's types changes when they change; a
lower layer that needs a higher one's object says what it needs as a ``Protocol`` of its own, as
``gateway.http.protocol.Served`` and ``gateway.tenancy.gate.Admitted`` do).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "backends", "routing", "values")

LAYERS: tuple[tuple[str, ...], ...] = (
    # Lowest first. A module may import its own group and any group of a lower layer; groups that
    # share a layer are independent of each other. A module belongs to the longest group naming it.
    ("values",),  # the request path's immutable records (``@value``), shared by everything above
    ("routing", "backends"),  # the pure policy; the engine adapters: neither knows the gateway nor the other
    ("gateway.strict",),  # the one strict base of every pydantic model at the edges
    ("gateway.tenancy.settings",),  # the auth: and redis: sections of the config schema
    ("gateway.config",),  # the YAML schema and its loader
    ("gateway.telemetry", "gateway.http"),  # metrics and logs; the connection layer (Exchange, ApiError, drain)
    ("gateway.fleet", "gateway.tenancy", "gateway.cache"),  # the running backends; API keys, limits and
    # usage; the response cache
    ("gateway.whatif",),  # what a config would do: structural diff, decisions replayed, fleets simulated
    ("gateway.state",),  # what a running gateway holds: the config's runtime, fleet, tenancy, metrics
    ("gateway.pipeline",),  # the one generation pipeline
    ("gateway.doors",),  # the front doors (and the admin API): they use the pipeline, never the reverse
    ("gateway.api_app", "gateway.console", "gateway.lifespan"),  # the OpenAPI document of every door; the
    # operator's page; what starts before the first request and stops after the last
    ("gateway.app", "gateway.epp"),  # the composition roots: the ASGI app and its routes; the endpoint picker
    ("gateway.ops",),  # the operator's commands: config check/show/schema, route explain
    ("gateway.cli",),  # the `enginegate` command: serve, explain, simulate, keys
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: Iterable[str]) -> list[str]:
    """The project modules one import statement reaches (``from a import b`` reaches ``a.b`` when that
    is a module, else ``a``)."""
    names = set(known)
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: resolved against this module's package
            package = module.split(".") if is_package else module.split(".")[:-1]
            base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
        wanted = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base for alias in node.names]
    found = []
    for name in wanted:
        while name and name not in names:  # `import a.b.c` depends on the module a.b.c, or the package holding it
            name = name.rpartition(".")[0]
        if name:
            found.append(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, anywhere in its source (a copy to change at will)."""
    return {module: set(targets) for module, targets in _parsed().items()}


@functools.cache
def _parsed() -> dict[str, frozenset[str]]:
    sources = _sources()
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        tree = ast.parse(path.read_text(), str(path))
        edges = graph.setdefault(module, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                is_package = path.name == "__init__.py"
                edges.update(t for t in _targets(node, module, is_package, sources) if t != module)
    return {module: frozenset(targets) for module, targets in graph.items()}


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            if cycle is not None:
                return cycle
    return None


def group_of(module: str) -> str | None:
    groups = [g for layer in LAYERS for g in layer if module == g or module.startswith(g + ".")]
    return max(groups, key=len) if groups else None


def layer_of(group: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if group in layer)


def violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Every import that goes up the declared layers or across to an independent group."""
    found = []
    for module, targets in sorted(graph.items()):
        source = group_of(module)
        for target in sorted(targets):
            to = group_of(target)
            if source is None or to is None or source == to:
                continue
            if layer_of(to) >= layer_of(source):
                how = "an independent group" if layer_of(to) == layer_of(source) else "a higher layer"
                found.append(f"{module} ({source}) imports {target} ({to}): {how}")
    return found


def test_no_module_imports_itself_back() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_packages_import_only_downwards() -> None:
    found = violations(import_graph())
    assert not found, "\n".join(found)


def test_every_module_has_a_declared_layer() -> None:
    """A new package says where it belongs: an undeclared one would escape the layering."""
    roots = set(PACKAGES)
    assert [m for m in sorted(import_graph()) if m not in roots and group_of(m) is None] == []


def test_every_declared_group_exists() -> None:
    modules = set(import_graph())
    assert [g for layer in LAYERS for g in layer if group_of(g) != g or g not in modules] == []


def test_the_checks_catch_the_cycle_the_layering_removed() -> None:
    """The engine factory importing the embeddings door again (as ``build_backend`` once did)."""
    graph = import_graph()
    graph["gateway.fleet.engines"].add("gateway.doors.embeddings")
    cycle = find_cycle(graph)
    assert cycle is not None and "gateway.fleet.engines" in cycle and "gateway.doors.embeddings" in cycle
    assert violations(graph) == [
        "gateway.fleet.engines (gateway.fleet) imports gateway.doors.embeddings (gateway.doors): a higher layer"
    ]


def test_imports_inside_functions_and_type_checking_count(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from gateway.state import AppState\n"
        "def f() -> None:\n    from gateway.app import create_app\n"
    )
    tree = ast.parse(source)
    known = {"gateway.state", "gateway.app"}
    found = {
        t for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) for t in _targets(n, "m", False, known)
    }
    assert found == known
