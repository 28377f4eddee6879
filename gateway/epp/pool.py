"""The endpoints a picker chooses from: the config's backends, each one's url an ``ip:port`` endpoint.

In picker mode the proxy carries the client's body to the endpoint unchanged, so only engines whose
adapter speaks OpenAI's own routes can be endpoints, under the model name the client used, at the
root of their url. Everything else is refused when the config is read, with the backend named.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.config import CTranslate2Config, LlamaCppConfig, LoadedConfig
from gateway.fleet.engines import speaks_openai


def endpoint_of(url: str) -> str:
    """``host:port`` of an engine url (the scheme's port when it names none; IPv6 in brackets)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def problems(loaded: LoadedConfig) -> list[str]:
    """Why this config's backends cannot be a picker's endpoints (empty when they can)."""
    found: list[str] = []
    seen: dict[tuple[str, str], str] = {}
    where = f"{loaded.path}: enginegate epp"
    if loaded.config.auth.enabled:
        found.append(f"{where}: auth: keys are not enforced in picker mode (the proxy authenticates); remove them")
    targets = {b.name for b in loaded.config.backends} | {b.pool for b in loaded.config.backends if b.pool}
    for rule in loaded.config.routing.rules:
        for arm in rule.split:
            if arm.to not in targets:  # an arm naming a model: the body would reach it with another model's name
                found.append(f"{where}: rule {rule.name}: split arm {arm.to} names a model; picker mode forwards "
                             "the client's body as it is, so arms name backends or pools")  # fmt: skip
    for cfg in loaded.config.backends:
        if isinstance(cfg, CTranslate2Config | LlamaCppConfig):
            found.append(f"{where}: backend {cfg.name}: engine {cfg.engine} runs in process, it has no endpoint")
            continue
        if not speaks_openai(cfg.engine):
            found.append(
                f"{where}: backend {cfg.name}: engine {cfg.engine} does not speak OpenAI's routes; the proxy "
                "forwards the client's body as it is"
            )
        if loaded.model(cfg.model).kind == "embed":
            found.append(f"{where}: backend {cfg.name}: embedding models are not routed in picker mode")
        if cfg.served_model not in (None, cfg.model):
            found.append(
                f"{where}: backend {cfg.name}: served_model {cfg.served_model} differs from model {cfg.model}; "
                "the body reaches the engine with the client's model name"
            )
        if urlsplit(cfg.url).path not in ("", "/"):
            found.append(f"{where}: backend {cfg.name}: url {cfg.url} has a path; an endpoint is host:port only")
        key = (endpoint_of(cfg.url), cfg.model)
        if key in seen:
            found.append(f"{where}: backends {seen[key]} and {cfg.name} are the same endpoint for model {cfg.model}")
        seen.setdefault(key, cfg.name)
    return found


@dataclass(frozen=True)
class Pool:
    """Backend names to endpoints and back (an endpoint serving several models is several backends)."""

    endpoints: dict[str, str]
    """Backend name -> ``host:port``."""
    backends: dict[tuple[str, str], str]
    """(``host:port``, model) -> backend name."""

    @classmethod
    def of(cls, loaded: LoadedConfig) -> Pool:
        endpoints = {
            b.name: endpoint_of(b.url)
            for b in loaded.config.backends
            if not isinstance(b, CTranslate2Config | LlamaCppConfig)
        }
        models = {b.name: b.model for b in loaded.config.backends}
        return cls(endpoints, {(endpoint, models[name]): name for name, endpoint in endpoints.items()})

    def backend(self, endpoint: str, model: str) -> str | None:
        return self.backends.get((endpoint, model))
