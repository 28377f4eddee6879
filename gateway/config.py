"""The gateway's one YAML file: pydantic models, unknown keys rejected, errors with file and line.

``load_config(path)`` is the only way in: it parses YAML keeping each key's
line, validates, resolves paths relative to the file and checks that model
files exist, and raises ``ConfigError`` listing every problem as
``FILE:LINE: key.path: message``.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from backends.gguf_file import GgufCache
from gateway.strict import Frozen
from gateway.tenancy.settings import AuthConfig, RedisConfig
from routing.features import RULE_HEADERS
from routing.prefix import DEFAULT_BLOCK_TOKENS

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$")]


class ServerConfig(Frozen):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    cache_dir: str | None = None
    """Where models derived from GGUF files are kept; default: $XDG_CACHE_HOME/enginegate."""
    # Connection limits (read at start; gateway/http/protocol.py enforces them).
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    """Request line and headers together; beyond it 431."""
    max_headers: int = Field(default=100, ge=8)
    max_url_bytes: int = Field(default=8192, ge=256)
    """Beyond it 414."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """From a request's first byte to the end of its headers (slowloris); then 408."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """Time to receive a request body, extended by one second per ``body_min_rate_bytes_s`` received."""
    body_min_rate_bytes_s: int = Field(default=16 * 1024, ge=1)
    keep_alive_timeout_s: float = Field(default=5.0, gt=0)
    """An idle connection (none in flight, new or between requests) is closed after this."""
    max_connections: int = Field(default=1000, ge=1)
    """Open client connections; beyond it new ones get a fast 503 with Retry-After (idle ones are
    closed first to make room; health probes get a few extra connections)."""
    max_output_buffer_bytes: int = Field(default=256 * 1024, ge=4096)
    """What the gateway holds for a client that reads slowly before it stops writing to it."""
    write_timeout_s: float = Field(default=30.0, gt=0)
    """A client that accepts nothing for this long, its output buffer full, is treated as gone."""
    allowed_hosts: list[str] | None = None
    """``Host`` names accepted (port ignored; ``*.example.com`` matches subdomains; ``["*"]``: all).
    Default: on a loopback address only localhost, 127.0.0.1 and [::1] (DNS rebinding), else all."""
    cors_origins: list[str] = []
    """Browser origins allowed by CORS (``["*"]``: any); default none: no CORS headers, preflight refused."""
    drain_delay_s: float = Field(default=0.0, ge=0)
    """On SIGTERM /readyz turns 503 at once; new connections are still served this long (so load
    balancers notice) before the listener closes."""
    shutdown_grace_s: float = Field(default=20.0, gt=0)
    """Then requests in flight get this long; streams still open get an error event and [DONE]."""
    docs: bool = False
    """Interactive API docs at ``/docs`` (Swagger UI served from the ``docs`` extra, never a CDN);
    ``/openapi.json`` is always served."""
    backend_headers: bool = True
    """Answers name the backend that served them (``x-enginegate-backend``) and the routing rule that
    matched (``x-enginegate-rule``), for operators; false keeps the fleet's names from clients (error
    messages never carry them)."""
    trusted_proxies: list[str] = []
    """Addresses or CIDRs of the proxies in front of the gateway: only a request from one of them has
    its ``X-Forwarded-For`` read (the right-most address no trusted proxy holds is the client, for the
    admin lockout and the logs). Default none: the connection's peer is the client."""

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        bad = []
        for cidr in value:
            try:
                ipaddress.ip_network(cidr.strip(), strict=False)  # as gateway.http.peers reads them
            except ValueError:
                bad.append(cidr)
        if bad:
            raise ValueError(f"not an address or CIDR: {', '.join(map(repr, bad))}")
        return value


class LimitsConfig(Frozen):
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_messages: int = Field(default=1024, ge=1)
    max_stop_chars: int = Field(default=1024, ge=1)
    """Longest stop string a request may send (at most 4, as OpenAI allows)."""
    max_tokens: int = Field(default=32768, ge=1)
    """Largest ``max_tokens`` a client may ask for."""
    health_interval_s: float = Field(default=5.0, gt=0)


class ModelConfig(Frozen):
    name: Name
    gguf: str | None = None
    """A llama GGUF file (relative to this config file); the in-process engines load it."""
    params_b: float | None = Field(default=None, gt=0)
    """Billions of parameters; read from the GGUF when there is one."""
    dtype: Literal[
        "fp32", "fp16", "bf16", "fp8", "int8", "int4", "awq", "gptq", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0"
    ] = "bf16"
    context: int | None = Field(default=None, ge=1)
    kv_bytes_per_token: float | None = Field(default=None, gt=0)
    """KV-cache bytes per token; default: from the GGUF, else an estimate from the parameter count."""
    chat_template: str | None = None
    """Jinja chat template for engines that take raw text; default: the GGUF's, else ChatML."""
    vision: bool = False
    """The model takes images (``image_url`` content parts), on backends whose engine passes them on."""
    tool_parser: Literal["hermes", "llama3_json", "mistral"] | None = None
    """How the model writes tool calls in text: engines that take raw text (TGI native, Triton, MII
    REST, the in-process engines) serve ``tools`` for this model only with it; the gateway renders
    the tools with the chat template and parses the calls."""
    kind: Literal["generate", "embed"] = "generate"
    """What the model does: generate text (chat, completions, responses, messages) or embed it
    (``/v1/embeddings``); each kind of request goes only to models of its kind."""
    matryoshka: bool = False
    """An embedding model whose vectors keep their meaning cut to their first ``dimensions`` (then
    normalized again); without it ``dimensions`` other than the model's own size is refused."""
    price_per_mtok_in: float = Field(default=0.0, ge=0)
    """Dollars per million prompt tokens, charged to API keys' budgets (gateway/tenancy)."""
    price_per_mtok_out: float = Field(default=0.0, ge=0)
    price_per_mtok_cached: float | None = Field(default=None, ge=0)
    """Prompt tokens the engine served from its prefix cache; default: half of ``price_per_mtok_in``."""


class CapabilitiesConfig(Frozen):
    """Adjusts what the adapter says its engine honours, for engines launched with or without the
    flags a capability needs (vLLM's ``--enable-auto-tool-choice``, trtllm-serve's guided decoding)."""

    enable: list[str] = []
    """Capability names (``tools``, ``json_schema``... see the README) or extra request fields the engine takes."""
    disable: list[str] = []

    @model_validator(mode="after")
    def _known(self) -> CapabilitiesConfig:
        from backends.capabilities import FEATURES, KNOWN_EXTRAS

        unknown = sorted(set(self.enable + self.disable) - FEATURES - KNOWN_EXTRAS)
        if unknown:
            raise ValueError(
                f"unknown capabilities {', '.join(unknown)} (known: {', '.join(sorted(FEATURES))}, "
                "or an engine's extra field such as top_k)"
            )
        return self


class _Placement(Frozen):
    """Where a backend runs and what it costs: the routing estimates start from these."""

    gpu: str = "CPU"
    """A GPU from the catalog (A10G, L4, A100-40GB, A100-80GB, H100, H200, or gpus: below), or CPU."""
    gpu_count: int = Field(default=1, ge=1, le=64)
    memory_gb: float | None = Field(default=None, gt=0)
    """Memory for weights and KV cache; default: the GPUs' total (CPU backends: 16)."""
    cost_per_hour: float = Field(default=0.0, ge=0)
    pool: Name | None = None
    capabilities: CapabilitiesConfig = CapabilitiesConfig()


class CTranslate2Config(_Placement):
    name: Name
    engine: Literal["ctranslate2"]
    model: Name
    threads: int = Field(default=1, ge=1, le=256)
    max_concurrency: int = Field(default=4, ge=1, le=1024)
    max_queue: int = Field(default=64, ge=0)


class LlamaCppConfig(_Placement):
    name: Name
    engine: Literal["llama_cpp"]
    model: Name
    threads: int = Field(default=1, ge=1, le=256)
    n_ctx: int | None = Field(default=None, ge=16)
    max_queue: int = Field(default=64, ge=0)


class TlsConfig(Frozen):
    """Client TLS for an https engine; paths are relative to this file."""

    ca_file: str | None = None
    """PEM bundle of the CAs that sign the engine's certificate; default: the system's store."""
    verify: bool = True
    """False: accept any certificate and host name (a test setup, never production)."""
    cert_file: str | None = None
    """PEM client certificate, for engines (or load balancers) that require one."""
    key_file: str | None = None
    """Its private key, when it is not in ``cert_file``."""

    @model_validator(mode="after")
    def _consistent(self) -> TlsConfig:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file needs cert_file")
        if not self.verify and self.ca_file is not None:
            raise ValueError("ca_file is unused with verify: false")
        return self


class _HttpEngine(_Placement):
    """An engine deployment reached over HTTP."""

    name: Name
    model: Name
    url: Annotated[str, Field(pattern=r"^https?://[^\s/]+")]
    served_model: str | None = None
    """The model name the engine knows; default: ``model``."""
    api_key_env: str | None = None
    """Environment variable holding the engine's API key (keys never live in this file)."""
    connect_timeout_s: float = Field(default=2.0, gt=0)
    response_timeout_s: float | None = Field(default=None, gt=0)
    """From the request written to the response's status and headers; default: ``read_timeout_s``."""
    read_timeout_s: float = Field(default=600.0, gt=0)
    """Longest silence between two pieces of a response's body."""
    idle_timeout_s: float = Field(default=4.0, gt=0)
    """Idle connections are reused only this long; keep it below the engine's keep-alive (uvicorn: 5 s)."""
    tls: TlsConfig | None = None
    max_concurrency: int = Field(default=256, ge=1)
    default_max_tokens: int = Field(default=256, ge=1)
    """For engines that need a token limit when the client sets none (TGI native, Triton, MII REST)."""

    @model_validator(mode="after")
    def _tls_is_for_https(self) -> _HttpEngine:
        if self.tls is not None and not self.url.startswith("https://"):
            raise ValueError("tls needs an https:// url")
        return self


class KvEventsConfig(Frozen):
    """Where a vLLM publishes its KV-cache events (``--kv-events-config``, publisher ``zmq``)."""

    endpoint: Annotated[str, Field(pattern=r"^tcp://[^\s/]+:\d+$")]
    """vLLM's ``endpoint`` as this gateway reaches it: ``tcp://host:port`` (vLLM binds ``tcp://*:port``)."""
    replay_endpoint: Annotated[str, Field(pattern=r"^tcp://[^\s/]+:\d+$")] | None = None
    """vLLM's ``replay_endpoint``: events missed in a gap are asked again there (else the index restarts)."""
    topic: str = ""
    """vLLM's ``topic`` (its default is empty)."""


class VLLMConfig(_HttpEngine):
    engine: Literal["vllm"]
    kv_events: KvEventsConfig | None = None
    """Precise prefix routing: the gateway subscribes to the engine's KV-cache events and knows which
    prompt blocks it holds (needs ``pip install enginegate[kv-events]`` and the model's tokenizer,
    ``models[].gguf``, to match prompts: the config is refused without either)."""


class TrtllmServeConfig(_HttpEngine):
    engine: Literal["trtllm_serve"]
    tool_parser: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")] | None = None
    """The server's ``--tool_parser`` (e.g. ``qwen3``), when it was launched with one: it then answers
    with ``tool_calls``. Without it the call markup comes back as text and the gateway parses it with
    the model's ``tool_parser`` (a model without one is served no ``tools``)."""


class TritonTrtllmConfig(_HttpEngine):
    engine: Literal["triton_trtllm"]
    triton_model: str = "ensemble"
    text_output: Literal["whole", "cumulative", "per_token"] = "whole"
    """How the model streams text: ``whole`` (the ensemble: answers not streamed to the client come
    whole and exact; streamed ones come from the ensemble's per-token stream, each token decoded alone,
    which loses SentencePiece word spaces, or whole where the deployment cannot stream), ``cumulative``
    (``tensorrt_llm_bls`` with ``accumulate_tokens: true``: streamed and exact) or ``per_token`` (the
    ensemble streamed for every request)."""


class TgiConfig(_HttpEngine):
    engine: Literal["tgi"]


class TgiMessagesConfig(_HttpEngine):
    engine: Literal["tgi_messages"]


class MiiRestConfig(_HttpEngine):
    engine: Literal["mii_rest"]
    deployment: Name
    stop_round_tokens: int = Field(default=16, ge=0)
    """A request with stop strings is generated in rounds of this many tokens, then twice as many each
    round, so the engine stops soon after a stop string (MII's REST API has no usable ``stop`` and no
    stream); 0: one request, the engine generating to its end while the gateway cuts the text."""


class MiiOpenAIConfig(_HttpEngine):
    engine: Literal["mii_openai"]


class LlamaServerConfig(_HttpEngine):
    engine: Literal["llama_server"]


HttpEngineConfig = (
    VLLMConfig
    | TrtllmServeConfig
    | TritonTrtllmConfig
    | TgiConfig
    | TgiMessagesConfig
    | MiiRestConfig
    | MiiOpenAIConfig
    | LlamaServerConfig
)
BackendConfig = Annotated[CTranslate2Config | LlamaCppConfig | HttpEngineConfig, Field(discriminator="engine")]
ENGINES = (
    "ctranslate2", "llama_cpp", "vllm", "trtllm_serve", "triton_trtllm", "tgi", "tgi_messages", "mii_rest",
    "mii_openai", "llama_server",
)  # fmt: skip


class Range(Frozen):
    min: float | None = Field(default=None, ge=0)
    max: float | None = Field(default=None, ge=0)


class MatchConfig(Frozen):
    models: list[str] = []
    """Glob patterns of model names."""
    ttft_budget_ms: Range = Range()
    latency_budget_ms: Range = Range()
    tenants: list[str] = []
    """Matched against the x-tenant header."""
    keys: list[str] = []
    """API key ids (gateway/tenancy); a request without a key matches no such rule."""
    teams: list[str] = []
    """Teams of API keys."""
    headers: dict[str, str] = {}
    """Exact values of x-tenant, x-priority, x-enginegate-pool or x-enginegate-class."""

    @model_validator(mode="after")
    def _known_headers(self) -> MatchConfig:
        unknown = sorted(h for h in self.headers if h.lower() not in RULE_HEADERS)
        if unknown:  # never read, the rule would silently never match
            raise ValueError(f"headers {', '.join(unknown)} cannot be matched (only {', '.join(RULE_HEADERS)})")
        if any(h != h.lower() for h in self.headers):
            raise ValueError("header names in match.headers must be lower case")
        return self


class RuleConfig(Frozen):
    name: Name
    match: MatchConfig = MatchConfig()
    prefer: list[Name] = []
    avoid: list[Name] = []
    require: list[Name] = []
    max_attempts: int | None = Field(default=None, ge=1, le=16)
    hedging: bool | None = None
    mode: Literal["best_effort", "strict"] | None = None
    default_ttft_budget_ms: float | None = Field(default=None, gt=0)
    default_latency_budget_ms: float | None = Field(default=None, gt=0)


class WeightsConfig(Frozen):
    budget: float = Field(default=1.0, ge=0)
    cost: float = Field(default=0.2, ge=0)
    load: float = Field(default=1.5, ge=0)
    affinity: float = Field(default=0.1, ge=0)


class BreakerConfig(Frozen):
    threshold: int = Field(default=5, ge=1)
    """Consecutive engine failures that open a backend's breaker."""
    cooldown_s: float = Field(default=1.0, gt=0)
    """Open this long before the first probes; doubles with each failed recovery."""
    max_cooldown_s: float = Field(default=30.0, gt=0)


class PrefixConfig(Frozen):
    block_tokens: int = Field(default=DEFAULT_BLOCK_TOKENS, ge=4, le=4096)
    """Prompt blocks the prefix index keeps per backend, in tokens (cut as ``4 x block_tokens`` bytes
    of the prompt's text: the gateway tokenizes nothing for them). 64 is TensorRT-LLM's KV page and
    four of vLLM's blocks; every replica must use the same size."""
    share: bool = False
    """Replicas tell each other where they sent each prompt's blocks, through ``redis.url``'s pub/sub,
    so a conversation whose turns reach different replicas still finds its history."""


class RoutingConfig(Frozen):
    max_attempts: int = Field(default=3, ge=1, le=16)
    first_token_timeout_s: float = Field(default=60.0, gt=0)
    """A streaming engine's first content token must arrive within this, or the next backend is tried."""
    answer_timeout_s: float = Field(default=600.0, gt=0)
    """Whole answers (non-streaming requests, whose commit point is the complete answer, and engines
    that answer at once such as MII REST) must be complete within this."""
    breaker: BreakerConfig = BreakerConfig()
    max_queue_wait_s: float = Field(default=20.0, gt=0)
    """Admission control: a request is not queued where it is predicted to wait longer than this
    (twice for positive ``x-priority``, half for negative); when no backend can take it, 503 with
    Retry-After from the predicted wait, instead of a timeout a minute later."""
    mode: Literal["best_effort", "strict"] = "best_effort"
    """strict: a request no backend can serve within its budget gets 429 with Retry-After."""
    hedging: bool = False
    weights: WeightsConfig = WeightsConfig()
    stale_after_s: float = Field(default=15.0, gt=0)
    """Engine load older than this is ignored in favour of the gateway's own in-flight count."""
    rules: list[RuleConfig] = []
    prefix: PrefixConfig = PrefixConfig()
    drop_unsupported: bool = False
    """A request field no backend serving the model can honour is dropped (and named in the
    ``x-enginegate-dropped`` response header) instead of refused with 400."""


class GpuConfig(Frozen):
    name: Name
    memory_gb: float = Field(gt=0)
    bandwidth_gbs: float = Field(gt=0)
    tflops: float = Field(gt=0)


class EfficiencyConfig(Frozen):
    prefill_mfu: float = Field(gt=0, le=1)
    decode_mbu: float = Field(gt=0, le=1)
    overhead_ms: float = Field(ge=0)


class AdminConfig(Frozen):
    api_key_env: str | None = None
    """Environment variable holding the admin key; without it the /admin endpoints are off."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """Serve /admin on this port only (``enginegate serve`` listens there too); the API port answers 404."""
    max_failures: int = Field(default=5, ge=1)
    """Wrong admin keys from one address before it is locked out (429 with Retry-After)."""
    lockout_s: float = Field(default=30.0, gt=0)
    """The first lockout; each failure while locked out doubles it, up to an hour."""


class MetricsConfig(Frozen):
    api_key_env: str | None = None
    """Environment variable holding the key ``/metrics`` asks for (``Authorization: Bearer <key>``);
    without it the admin key is asked for instead, when ``/metrics`` is protected."""
    protected: bool | None = None
    """Whether ``/metrics`` needs that key; default: when ``metrics.api_key_env`` is set or
    ``auth.required`` is on (the per-team series tell who spends what)."""


class GatewayConfig(Frozen):
    server: ServerConfig = ServerConfig()
    limits: LimitsConfig = LimitsConfig()
    routing: RoutingConfig = RoutingConfig()
    admin: AdminConfig = AdminConfig()
    metrics: MetricsConfig = MetricsConfig()
    auth: AuthConfig = AuthConfig()
    redis: RedisConfig = RedisConfig()
    gpus: list[GpuConfig] = []
    engine_efficiency: dict[str, EfficiencyConfig] = {}
    models: list[ModelConfig] = Field(min_length=1)
    backends: list[BackendConfig] = Field(min_length=1)

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
        if self.routing.prefix.share and not self.redis.url:
            errors.append("routing.prefix.share: needs redis.url (replicas share prefix blocks through its pub/sub)")
        if errors:
            raise ValueError("; ".join(errors))
        return self


def _kv_events_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("zmq", "msgspec"))


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config and the file it came from (relative paths resolve against it)."""

    config: GatewayConfig
    path: Path
    ggufs: GgufCache = field(default_factory=GgufCache, compare=False, repr=False)
    """GGUF files parsed once, shared by every reader of this config and carried across reloads."""

    def resolve(self, relative: str) -> Path:
        p = Path(os.path.expanduser(relative))
        return p if p.is_absolute() else (self.path.parent / p).resolve()

    @property
    def cache_dir(self) -> Path:
        if self.config.server.cache_dir:
            return self.resolve(self.config.server.cache_dir)
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "enginegate"

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
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = f"unknown key {loc[-1]!r}"
            elif err["type"] == "union_tag_invalid":
                loc = (*loc, "engine")
                ctx = err.get("ctx", {})
                msg = f"unknown engine {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
            elif err["type"] == "value_error" and not loc:
                # Cross-field checks name their own key paths: "backends[0].gpu: ...; routing.rules[1]...: ..."
                for part in msg.removeprefix("Value error, ").split("; "):
                    path, _, text = part.partition(": ")
                    where = _parse_path(path)
                    problems.append(f"{source}:{_line(lines, where)}: {path}: {text}")
                continue
            elif err["type"] == "value_error":
                msg = msg.removeprefix("Value error, ")
            problems.append(f"{source}:{_line(lines, loc)}: {_dotted(loc)}: {msg}")
        raise ConfigError(problems) from exc


def default_config() -> Path:
    """$ENGINEGATE_CONFIG, else the repository's embedded default next to this package."""
    env = os.environ.get("ENGINEGATE_CONFIG")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


def load_config(path: str | Path, ggufs: GgufCache | None = None) -> LoadedConfig:
    """``ggufs``: the running config's parsed GGUF files, so a reload reads only files that changed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    config, lines = parse_config(text, str(path))
    loaded = LoadedConfig(config, path.resolve(), ggufs or GgufCache())
    problems = []
    for i, m in enumerate(config.models):
        if m.gguf is not None and not loaded.resolve(m.gguf).is_file():
            loc = ("models", i, "gguf")
            problems.append(f"{path}:{_line(lines, loc)}: {_dotted(loc)}: no such file: {loaded.resolve(m.gguf)}")
    if problems:
        raise ConfigError(problems)
    return loaded
