"""The gateway's one YAML file: pydantic models, unknown keys rejected, errors with file and line.

The schema is split by section (``server``, ``models``, ``engines``, ``rules``; ``schema`` holds
the root and its cross-section checks) apart from the loader (``loader``: YAML with line numbers,
``FILE:LINE`` errors). Every name is re-exported here, so ``from gateway.config import X`` is the
one import the rest of the code needs.
"""

from __future__ import annotations

from gateway.config.cache import CacheConfig
from gateway.config.engines import (
    ENGINES,
    BackendConfig,
    CapabilitiesConfig,
    CTranslate2Config,
    HttpEngineConfig,
    KvEventsConfig,
    LlamaCppConfig,
    LlamaServerConfig,
    MiiOpenAIConfig,
    MiiRestConfig,
    TgiConfig,
    TgiMessagesConfig,
    TlsConfig,
    TritonTrtllmConfig,
    TrtllmServeConfig,
    VLLMConfig,
)
from gateway.config.loader import ConfigError, LoadedConfig, default_config, load_config, parse_config
from gateway.config.models import EfficiencyConfig, FallbackStep, GpuConfig, ModelConfig, Name
from gateway.config.rules import (
    BreakerConfig,
    MatchConfig,
    PrefixConfig,
    Range,
    RoutingConfig,
    RuleConfig,
    WeightsConfig,
)
from gateway.config.schema import GatewayConfig
from gateway.config.server import AdminConfig, LimitsConfig, MetricsConfig, ServerConfig
from gateway.config.telemetry import TelemetryConfig

__all__ = [
    "ENGINES",
    "AdminConfig",
    "BackendConfig",
    "BreakerConfig",
    "CTranslate2Config",
    "CacheConfig",
    "CapabilitiesConfig",
    "ConfigError",
    "EfficiencyConfig",
    "FallbackStep",
    "GatewayConfig",
    "GpuConfig",
    "HttpEngineConfig",
    "KvEventsConfig",
    "LimitsConfig",
    "LlamaCppConfig",
    "LlamaServerConfig",
    "LoadedConfig",
    "MatchConfig",
    "MetricsConfig",
    "MiiOpenAIConfig",
    "MiiRestConfig",
    "ModelConfig",
    "Name",
    "PrefixConfig",
    "Range",
    "RoutingConfig",
    "RuleConfig",
    "ServerConfig",
    "TelemetryConfig",
    "TgiConfig",
    "TgiMessagesConfig",
    "TlsConfig",
    "TritonTrtllmConfig",
    "TrtllmServeConfig",
    "VLLMConfig",
    "WeightsConfig",
    "default_config",
    "load_config",
    "parse_config",
]
