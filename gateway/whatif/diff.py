"""The structural difference of two configs: every setting added, removed or changed, by name.

The loaded pydantic models are compared field by field (never the YAML text, so moving a key or
rewriting a flow mapping changes nothing). Lists of named entries (models, backends, rules, GPUs)
are matched by ``name``, so a backend moved in the file is not a change, while rules moved are (their
order decides which matches first): a ``reordered`` change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel
from pydantic_core import to_jsonable_python


@dataclass(frozen=True, slots=True)
class Change:
    path: str
    """Where, as the config reference names it: ``backends[vllm-a].cost_per_hour``, ``routing.prefix.load_bound``."""
    kind: str
    """``added``, ``removed``, ``changed`` or ``reordered``."""
    old: Any = None
    new: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "old": self.old, "new": self.new}


def diff(old: BaseModel, new: BaseModel) -> list[Change]:
    """Every difference between two configs (``GatewayConfig``), in the order of the schema."""
    out: list[Change] = []
    _models(old, new, "", out)
    return out


ORDERED = frozenset({"routing.rules"})
"""Named lists whose order means something: the first rule that matches applies."""
SECRET_KEYS = frozenset({"sha256"})
"""Fields whose values a diff never shows (an API key's hash)."""


def _json(value: Any) -> Any:
    return _redact(to_jsonable_python(value))


def _redact(value: Any) -> Any:
    """``value`` without secrets: hashed keys hidden, a URL's password masked (``redis://:pw@host``)."""
    if isinstance(value, dict):
        return {k: "***" if k in SECRET_KEYS else _redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    if isinstance(value, str) and "://" in value and "@" in value:
        parts = urlsplit(value)
        if parts.password:
            netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
            return urlunsplit(parts._replace(netloc=netloc))
    return value


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _models(old: BaseModel, new: BaseModel, prefix: str, out: list[Change]) -> None:
    fields = [*type(old).model_fields, *(f for f in type(new).model_fields if f not in type(old).model_fields)]
    for name in fields:
        path = _join(prefix, name)
        if name not in type(new).model_fields:
            out.append(Change(path, "removed", _json(getattr(old, name))))
        elif name not in type(old).model_fields:
            out.append(Change(path, "added", None, _json(getattr(new, name))))
        else:
            _compare(getattr(old, name), getattr(new, name), path, out)


def _named(items: Any) -> bool:
    """A list of entries with distinct, non-empty names (API keys may have none: compared as a whole)."""
    if not isinstance(items, list):
        return False
    names = [getattr(i, "name", None) if isinstance(i, BaseModel) else None for i in items]
    return all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names)


def _compare(old: Any, new: Any, path: str, out: list[Change]) -> None:
    if old == new:
        return
    if isinstance(old, BaseModel) and isinstance(new, BaseModel):
        _models(old, new, path, out)
    elif _named(old) and _named(new) and (old or new):
        _lists(old, new, path, out)
    elif isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(k for k in new if k not in old)]:
            where = f"{path}.{key}"
            if key not in new:
                out.append(Change(where, "removed", _json(old[key])))
            elif key not in old:
                out.append(Change(where, "added", None, _json(new[key])))
            else:
                _compare(old[key], new[key], where, out)
    elif path.rpartition(".")[2] in SECRET_KEYS:
        out.append(Change(path, "changed", "***", "***"))
    else:
        out.append(Change(path, "changed", _json(old), _json(new)))


def _lists(old: Sequence[Any], new: Sequence[Any], path: str, out: list[Change]) -> None:
    before = {i.name: i for i in old}
    after = {i.name: i for i in new}
    for name, item in before.items():
        if name not in after:
            out.append(Change(f"{path}[{name}]", "removed", _json(item)))
    for name, item in after.items():
        if name not in before:
            out.append(Change(f"{path}[{name}]", "added", None, _json(item)))
        else:
            _compare(before[name], item, f"{path}[{name}]", out)
    kept_before = [n for n in before if n in after]
    kept_after = [n for n in after if n in before]
    if path in ORDERED and kept_before != kept_after:
        out.append(Change(path, "reordered", kept_before, kept_after))


def summary(changes: Sequence[Change]) -> dict[str, list[str]]:
    """The named entries (``backends[x]``, ``models[y]``, ``routing.rules[z]``) added, removed and changed."""
    out: dict[str, list[str]] = {"added": [], "removed": [], "changed": []}
    for c in changes:
        head, bracket, rest = c.path.partition("]")
        if not bracket:
            continue
        entry = head + "]"
        kind = c.kind if not rest and c.kind in ("added", "removed") else "changed"
        if entry not in out[kind]:
            out[kind].append(entry)
    return out
