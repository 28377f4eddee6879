"""The README and the docs site say what the code does: quickstart first, every config key and every
metric documented, every link pointing at a page that exists. (``make docs`` builds the site strictly:
broken links and anchors inside docs/, and pages left out of the navigation, fail there.)"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from gateway.strict import Frozen
from tools import config_reference

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_command_quickstart() -> None:
    sections = re.findall(r"^## (.+)$", README, flags=re.M)
    assert sections[0] == "Quickstart"
    quickstart = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    first_block = quickstart.split("```sh\n", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in first_block.splitlines()] == [["make", "serve"], ["make", "test"]]


def test_readme_stays_short() -> None:
    assert len(README.splitlines()) <= 200, "topics belong in docs/, one page each"


def test_readme_links_point_at_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into docs/"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert missing == []


def _nav_pages(nav: Any) -> Iterator[str]:
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from _nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_pages(value)


def test_every_page_is_in_the_navigation_and_every_entry_exists() -> None:
    # mkdocs.yml has no custom tags, so the safe loader reads it.
    nav = set(_nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    results = {f"benchmarks/results/{p.name}" for p in config_reference.RESULTS.glob("*.md")}
    assert nav == pages | results


def _schema_keys(node: dict[str, Any], defs: dict[str, Any], prefix: str) -> Iterator[str]:
    """Every key path in the JSON schema, spelt as the reference spells it (``a.b``, ``a[].b``, ``a.<name>.b``)."""
    if "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[1]]
    for variant in node.get("anyOf", []) + node.get("oneOf", []):
        yield from _schema_keys(variant, defs, prefix)
    for name, sub in node.get("properties", {}).items():
        key = f"{prefix}.{name}" if prefix else name
        yield key
        yield from _schema_keys(sub, defs, key)
    if isinstance(node.get("items"), dict):
        yield from _schema_keys(node["items"], defs, f"{prefix}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _schema_keys(node["additionalProperties"], defs, f"{prefix}.<name>")


def test_the_reference_documents_every_key_of_the_schema_and_no_other() -> None:
    schema = config_reference.root_model().model_json_schema()
    keys = set(_schema_keys(schema, schema.get("$defs", {}), ""))
    reference = config_reference.markdown()
    rows = set(re.findall(r"^\| `([^`]+)` \|", reference, flags=re.M))
    headings = set(re.findall(r"^## `([^`]+)`", reference, flags=re.M))
    assert keys - rows - headings == set()
    assert rows - keys == set()
    assert "backends[].kv_events.replay_endpoint" in keys  # the walk reaches into tagged variants


def test_the_reference_carries_the_fields_docstrings() -> None:
    rows = {r.key: r for s in config_reference.sections() for r in s.rows}
    timeout = rows["routing.first_token_timeout_s"]
    assert timeout.type == "number, > 0"
    assert timeout.default == "`60.0`"
    assert timeout.description.startswith("A streaming engine's first content token must arrive within this")
    assert rows["auth.required"].description.startswith("True: every /v1 request needs a valid key")  # a base module
    assert rows["backends[].gpu"].description.startswith("A GPU from the catalog")  # declared in a base class
    assert rows["models"].default == "required"


def _undocumented(root: type[BaseModel] | None = None) -> list[str]:
    return [r.key for s in config_reference.sections(root) for r in s.rows if not r.description]


def test_every_key_of_the_schema_has_a_description() -> None:
    """Every row of the reference (so every key: the test above) says what it does."""
    assert _undocumented() == []
    rows = {r.key: r for s in config_reference.sections() for r in s.rows}
    assert rows["backends"].description.startswith("The engines that serve them")  # the tagged list's own row
    assert rows["auth.keys[].rpm"].description.startswith("Requests per minute")  # a base model in tenancy


def test_an_undocumented_key_is_found() -> None:
    """The check above can fail: a field without a docstring or description, however deep."""

    class Inner(Frozen):
        documented: int = 1
        """Says what it does."""
        bare: int = 2

    class Root(Frozen):
        inner: Inner = Inner()
        """A section."""
        described: int = Field(default=0, description="Said in the field.")

    assert _undocumented(Root) == ["inner.bare"]


def test_the_reference_page_keeps_its_marker() -> None:
    assert config_reference.MARKER in (DOCS / config_reference.REFERENCE_PAGE).read_text()


_REGISTERED = re.compile(r"\b(?:Counter|Gauge|Histogram|gauge)\(\s*\"(enginegate_[a-z_]+)\"")


def test_operations_lists_every_metric_the_gateway_registers() -> None:
    registered = {m for path in (ROOT / "gateway").rglob("*.py") for m in _REGISTERED.findall(path.read_text())}
    assert len(registered) > 20, "the pattern finds the gateway's metrics"
    documented = set(re.findall(r"^\| `(enginegate_[a-z_]+)` \|", (DOCS / "operations.md").read_text(), flags=re.M))
    # Counters are exposed with _total; the code names them without it.
    assert {m.removesuffix("_total") for m in documented} == registered
