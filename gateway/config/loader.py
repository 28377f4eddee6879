"""The gateway's one YAML file: parsed keeping each key's line, validated, errors with file and line.

``load_config(path)`` is the only way in: it parses YAML keeping each key's
line, validates, resolves paths relative to the file and checks that model
files exist, and raises ``ConfigError`` listing every problem as
``FILE:LINE: key.path: message``.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from backends.gguf_file import GgufCache
from gateway.config.engines import ENGINES
from gateway.config.models import ModelConfig
from gateway.config.schema import GatewayConfig
from gateway.strict import PATTERN_MEANINGS

log = logging.getLogger("enginegate.config")


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config and the file it came from (relative paths resolve against it)."""

    config: GatewayConfig
    path: Path
    ggufs: GgufCache = field(default_factory=GgufCache, compare=False, repr=False)
    """GGUF files parsed once, shared by every reader of this config and carried across reloads."""
    lines: dict[tuple[Any, ...], int] = field(default_factory=dict, compare=False, repr=False)
    """Each key path's line in the file, for checks made after validation (``where``)."""
    source: str = field(default="", compare=False, repr=False)
    """The file as it was named (problems quote it so)."""

    def resolve(self, relative: str) -> Path:
        p = Path(os.path.expanduser(relative))
        return p if p.is_absolute() else (self.path.parent / p).resolve()

    @property
    def cache_dir(self) -> Path:
        if self.config.server.cache_dir:
            return self.resolve(self.config.server.cache_dir)
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "enginegate"

    def where(self, *loc: Any) -> str:
        """``FILE:LINE: key.path`` of a key path such as ``("backends", 2, "gpu")``."""
        return f"{self.source or self.path}:{_line(self.lines, loc)}: {_dotted(loc)}"

    def model(self, name: str) -> ModelConfig:
        return next(m for m in self.config.models if m.name == name)


class ConfigError(Exception):
    """The config cannot be used; ``problems`` are ``FILE:LINE: key: message`` lines."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _to_python(node: yaml.Node, path: tuple[Any, ...], lines: dict[tuple[Any, ...], int]) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = yaml.safe_load(yaml.serialize(key_node))
            lines[(*path, key)] = key_node.start_mark.line + 1
            out[key] = _to_python(value_node, (*path, key), lines)
            lines[(*path, key)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(v, (*path, i), lines) for i, v in enumerate(node.value)]
    return yaml.safe_load(yaml.serialize(node))


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _parse_path(path: str) -> tuple[Any, ...]:
    """``backends[0].gpu`` -> ("backends", 0, "gpu")."""
    return tuple(int(i) if i else k for k, i in re.findall(r"([A-Za-z_][\w-]*)|\[(\d+)\]", path))


def _line(lines: dict[tuple[Any, ...], int], loc: tuple[Any, ...]) -> int:
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def parse_config(text: str, source: str = "<config>") -> tuple[GatewayConfig, dict[tuple[Any, ...], int]]:
    """Validate YAML text; returns the config and each key path's line number."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise ConfigError([f"{source}:{line}: invalid YAML: {getattr(exc, 'problem', None) or exc}"]) from exc
    lines: dict[tuple[Any, ...], int] = {}
    data = _to_python(root, (), lines) if root is not None else None
    if not isinstance(data, dict):
        raise ConfigError([f"{source}:1: the file must be a mapping with models: and backends:"])
    try:
        return GatewayConfig.model_validate(data), lines
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            # Tagged unions add the tag as a path element; it is not a key in the file.
            loc = tuple(p for p in err["loc"] if p not in ENGINES)
            if err["type"] == "value_error" and not loc:
                # Cross-field checks name their own key paths: "backends[0].gpu: ...; routing.rules[1]...: ..."
                for part in err["msg"].removeprefix("Value error, ").split("; "):
                    path, _, text = part.partition(": ")
                    problems.append(f"{source}:{_line(lines, _parse_path(path))}: {path}: {text}")
                continue
            loc, msg = _explained(err, loc)
            problems.append(f"{source}:{_line(lines, loc)}: {_dotted(loc)}: {msg}")
        raise ConfigError(problems) from exc


_PLAIN = {
    "missing": "required, but missing",
    "model_type": "must be a mapping (key: value lines)",
    "model_attributes_type": "must be a mapping (key: value lines)",
    "dict_type": "must be a mapping (key: value lines)",
    "list_type": "must be a list (lines starting with -)",
}


def _explained(err: ErrorDetails, loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], str]:
    """(key path, message) of one validation error in the file's words: no regular expression, no
    pydantic term (a tagged union's tag, a model type)."""
    kind, ctx, known = err["type"], err.get("ctx", {}), ", ".join(ENGINES)
    if kind == "extra_forbidden":
        return loc, f"unknown key {loc[-1]!r}"
    if kind == "union_tag_invalid":
        return (*loc, "engine"), f"unknown engine {ctx.get('tag')!r} (known engines: {known})"
    if kind == "union_tag_not_found":
        keys = [k for k in err["input"] if isinstance(k, str)] if isinstance(err["input"], dict) else []
        typo = difflib.get_close_matches("engine", keys, n=1, cutoff=0.6)
        if typo:
            return (*loc, typo[0]), f"unknown key {typo[0]!r}: did you mean 'engine'? (known engines: {known})"
        return loc, f"every backend needs engine: one of {known}"
    if kind == "string_pattern_mismatch":
        return loc, PATTERN_MEANINGS.get(str(ctx.get("pattern")), "is not in the accepted form")
    if kind in _PLAIN:
        return loc, _PLAIN[kind]
    return loc, err["msg"].removeprefix("Value error, ")


def default_config() -> Path:
    """$ENGINEGATE_CONFIG, else the repository's embedded default next to this package."""
    env = os.environ.get("ENGINEGATE_CONFIG")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "configs" / "default.yaml"


def load_config(path: str | Path, ggufs: GgufCache | None = None) -> LoadedConfig:
    """``ggufs``: the running config's parsed GGUF files, so a reload reads only files that changed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    config, lines = parse_config(text, str(path))
    loaded = LoadedConfig(config, path.resolve(), ggufs or GgufCache(), lines, str(path))
    problems = []
    for i, m in enumerate(config.models):
        if m.gguf is not None and not loaded.resolve(m.gguf).is_file():
            loc = ("models", i, "gguf")
            problems.append(f"{path}:{_line(lines, loc)}: {_dotted(loc)}: no such file: {loaded.resolve(m.gguf)}")
    if problems:
        raise ConfigError(problems)
    for line in retired(loaded):
        log.warning("%s", line)
    return loaded


def retired(loaded: LoadedConfig) -> list[str]:
    """``FILE:LINE: path: ...`` for each key that is accepted but no longer used."""
    weights = loaded.config.routing.weights
    why = "no longer used: queueing and cached prefill are in the predicted times; see routing.prefix.load_bound"
    return [
        f"{loaded.where('routing', 'weights', name)}: {why}"
        for name in ("load", "affinity")
        if getattr(weights, name) is not None
    ]
