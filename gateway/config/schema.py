"""The root of the config file, and the checks that reach across its sections."""

from __future__ import annotations

import importlib.util

from pydantic import Field, model_validator

from gateway.config import fallbacks
from gateway.config.cache import CacheConfig
from gateway.config.engines import ENGINES, BackendConfig, CTranslate2Config, LlamaCppConfig
from gateway.config.models import EfficiencyConfig, GpuConfig, ModelConfig
from gateway.config.rules import RoutingConfig
from gateway.config.server import AdminConfig, LimitsConfig, MetricsConfig, ServerConfig
from gateway.config.shadow import ShadowConfig, shadow_problems
from gateway.config.splits import split_problems
from gateway.config.telemetry import TelemetryConfig
from gateway.strict import Frozen
from gateway.tenancy.settings import AuthConfig, RedisConfig


class GatewayConfig(Frozen):
    server: ServerConfig = ServerConfig()
    """The listener: address, connection limits, browser access, shutdown."""
    limits: LimitsConfig = LimitsConfig()
    """Bounds on every request's size, and the health poll."""
    routing: RoutingConfig = RoutingConfig()
    """How a request picks its backend: attempts, deadlines, breakers, weights, rules."""
    admin: AdminConfig = AdminConfig()
    """The ``/admin`` API: its key, its port, the lockout of wrong keys."""
    metrics: MetricsConfig = MetricsConfig()
    """Access to ``/metrics``."""
    telemetry: TelemetryConfig = TelemetryConfig()
    """OpenTelemetry traces of every request (off unless ``otlp_endpoint`` is set)."""
    auth: AuthConfig = AuthConfig()
    """API keys: whether they are required, where they live, their limits."""
    redis: RedisConfig = RedisConfig()
    """The Redis that replicas share limits, budgets and prefix blocks through."""
    cache: CacheConfig = CacheConfig()
    """The response cache: repeated deterministic requests answered without an engine (off by default)."""
    shadow: ShadowConfig = ShadowConfig()
    """Where shadow traffic's comparisons go (rules' ``shadow:`` mirror requests to a candidate)."""
    gpus: list[GpuConfig] = []
    """GPUs beyond the built-in catalog (A10G, L4, A100-40GB, A100-80GB, H100, H200), or replacing an entry."""
    engine_efficiency: dict[str, EfficiencyConfig] = {}
    """Per engine (``vllm``, ``llama_cpp``...): how close it comes to the hardware, replacing the
    built-in figures the routing estimates use."""
    models: list[ModelConfig] = Field(min_length=1)
    """The models the gateway serves, by the name clients send."""
    backends: list[BackendConfig] = Field(min_length=1)
    """The engines that serve them: one entry per deployment, its keys depending on ``engine:``."""

    @model_validator(mode="after")
    def _references(self) -> GatewayConfig:
        errors = []
        for kind, items in (("models", self.models), ("backends", self.backends)):
            seen: set[str] = set()
            for i, item in enumerate(items):
                if item.name in seen:
                    errors.append(f"{kind}[{i}].name: duplicate name {item.name!r}")
                seen.add(item.name)
        models = {m.name: m for m in self.models}
        for i, b in enumerate(self.backends):
            model = models.get(b.model)
            if model is None:
                errors.append(f"backends[{i}].model: unknown model {b.model!r} (known: {', '.join(models)})")
            elif model.gguf is None and isinstance(b, CTranslate2Config | LlamaCppConfig):
                errors.append(f"backends[{i}].model: {b.engine} runs in process and needs models[].gguf")
        from routing.catalog import GPUS

        gpus = set(GPUS) | {g.name for g in self.gpus}
        names = {b.name for b in self.backends} | {b.pool for b in self.backends if b.pool}
        for i, b in enumerate(self.backends):
            if b.gpu not in gpus:
                errors.append(f"backends[{i}].gpu: unknown GPU {b.gpu!r} (known: {', '.join(sorted(gpus))})")
        for i, r in enumerate(self.routing.rules):
            for key in ("prefer", "avoid", "require"):
                for target in getattr(r, key):
                    if target not in names:
                        errors.append(f"routing.rules[{i}].{key}: {target!r} is neither a backend nor a pool")
        splits = [(r.name, r.match.models, r.split) for r in self.routing.rules]
        errors += split_problems(splits, self.models, self.backends)
        errors += shadow_problems(self.routing.rules, names, models)
        for engine in self.engine_efficiency:
            if engine not in ENGINES:
                errors.append(f"engine_efficiency.{engine}: unknown engine (known: {', '.join(ENGINES)})")
        for i, b in enumerate(self.backends):
            if getattr(b, "kv_events", None) is None:
                continue
            if not _kv_events_installed():
                errors.append(f"backends[{i}].kv_events: needs pyzmq and msgspec (pip install 'enginegate[kv-events]')")
            if b.model in models and models[b.model].gguf is None:
                errors.append(
                    f"backends[{i}].kv_events: model {b.model!r} has no gguf: the gateway needs its tokenizer "
                    "to match prompts against the engine's token blocks"
                )
        errors += fallbacks.problems(self.models)
        if self.telemetry.otlp_endpoint is not None and (missing := _otel_missing()) is not None:
            errors.append(f"telemetry.otlp_endpoint: {missing}")
        if self.routing.prefix.share and not self.redis.url:
            errors.append("routing.prefix.share: needs redis.url (replicas share prefix blocks through its pub/sub)")
        if self.cache.enabled and self.cache.store == "redis" and not self.redis.url:
            errors.append("cache.store: 'redis' needs redis.url")
        if errors:
            raise ValueError("; ".join(errors))
        return self


def _kv_events_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("zmq", "msgspec"))


def _otel_missing() -> str | None:
    """Why traces cannot be exported here, or None. Asked only when an endpoint is set: the exporter is
    imported, as the gateway will import it, so a broken install is found here and not at start."""
    names = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
    if not all(importlib.util.find_spec(name) is not None for name in names):
        return "needs opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http (pip install 'enginegate[otel]')"
    try:
        importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    except ImportError as exc:  # xds-protos (the epp extra) installed after opentelemetry-proto replaces its files
        return (
            f"the OTLP exporter does not import ({exc}): with xds-protos installed too, reinstall "
            "opentelemetry-proto last (pip install --force-reinstall --no-deps opentelemetry-proto)"
        )
    return None
