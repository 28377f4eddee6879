"""Backends built from config: each engine kind's adapter with its settings."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable

from backends.base import Backend
from backends.capabilities import Capabilities, capabilities_of
from backends.deepspeed_mii import MiiOpenAIBackend, MiiRestBackend
from backends.http_base import HttpSettings
from backends.httpclient import tls_context
from backends.llama_server import LlamaServerBackend
from backends.openai_compat import OpenAICompatBackend
from backends.tgi import TgiBackend
from backends.tgi_messages import TgiMessagesBackend
from backends.trtllm import (
    SERVE_CAPABILITIES,
    TRITON_STREAMED_CAPABILITIES,
    TritonTrtllmBackend,
    TrtllmServeBackend,
)
from backends.vllm import VLLMBackend
from gateway.config import (
    BackendConfig,
    ConfigError,
    CTranslate2Config,
    HttpEngineConfig,
    LlamaCppConfig,
    LlamaServerConfig,
    LoadedConfig,
    MiiRestConfig,
    TgiConfig,
    TritonTrtllmConfig,
    TrtllmServeConfig,
    VLLMConfig,
)

BackendFactory = Callable[[BackendConfig, LoadedConfig], Backend]


# Engines whose adapter needs nothing beyond the common HTTP settings.
_PLAIN_HTTP: dict[str, Callable[[str, str, HttpSettings], Backend]] = {
    "vllm": VLLMBackend,
    "trtllm_serve": TrtllmServeBackend,  # built with its tool_parser in _http_backend
    "tgi": TgiBackend,
    "tgi_messages": TgiMessagesBackend,
    "mii_openai": MiiOpenAIBackend,
    "llama_server": LlamaServerBackend,
}


def declared_capabilities(engine: str) -> Capabilities:
    """What an engine kind's adapter declares for its default deployment, without starting it."""
    from backends.ctranslate2_engine import CTranslate2Backend
    from backends.llamacpp_engine import LlamaCppBackend

    classes: dict[str, object] = {
        **_PLAIN_HTTP,
        "triton_trtllm": TritonTrtllmBackend,
        "mii_rest": MiiRestBackend,
        "ctranslate2": CTranslate2Backend,
        "llama_cpp": LlamaCppBackend,
    }
    return capabilities_of(classes.get(engine))


def speaks_openai(engine: str) -> bool:
    """Whether an engine kind's adapter speaks OpenAI's own routes and bodies (``OpenAICompatBackend``):
    a body a client sent can reach that engine as it is (``enginegate epp`` forwards nothing else)."""
    adapter = _PLAIN_HTTP.get(engine)
    return isinstance(adapter, type) and issubclass(adapter, OpenAICompatBackend)


def configured_capabilities(cfg: BackendConfig) -> Capabilities:
    """What a backend's adapter declares for the deployment its settings describe, without starting it
    (for ``route explain``): trtllm-serve's ``tool_parser``, Triton's ``text_output``."""
    if isinstance(cfg, TrtllmServeConfig) and cfg.tool_parser is not None:
        return SERVE_CAPABILITIES
    if isinstance(cfg, TritonTrtllmConfig) and cfg.text_output != "whole":
        return TRITON_STREAMED_CAPABILITIES
    return declared_capabilities(cfg.engine)


def _http_settings(cfg: HttpEngineConfig, loaded: LoadedConfig) -> HttpSettings:
    model = loaded.model(cfg.model)
    template = model.chat_template
    if template is None and model.gguf is not None:
        template = loaded.ggufs.header(loaded.resolve(model.gguf)).vocab.chat_template
    api_key = None
    if cfg.api_key_env:
        api_key = os.environ.get(cfg.api_key_env)
        if api_key is None:
            raise ConfigError([f"{loaded.path}: backend {cfg.name}: environment variable {cfg.api_key_env} is not set"])
    return HttpSettings(
        url=cfg.url,
        served_model=cfg.served_model or cfg.model,
        api_key=api_key,
        connect_timeout_s=cfg.connect_timeout_s,
        response_timeout_s=cfg.response_timeout_s,
        read_timeout_s=cfg.read_timeout_s,
        idle_timeout_s=cfg.idle_timeout_s,
        ssl_context=_ssl_context(cfg, loaded),
        max_connections=cfg.max_concurrency,
        chat_template=template,
        default_max_tokens=cfg.default_max_tokens,
    )


def _ssl_context(cfg: HttpEngineConfig, loaded: LoadedConfig) -> ssl.SSLContext | None:
    """Built once here, where a bad file is a config error, rather than on a request."""
    if not cfg.url.startswith("https://"):
        return None
    tls = cfg.tls
    if tls is None:
        return tls_context()

    def path(name: str | None) -> str | None:
        return None if name is None else str(loaded.resolve(name))

    try:
        return tls_context(path(tls.ca_file), tls.verify, path(tls.cert_file), path(tls.key_file))
    except OSError as exc:  # missing files and ssl.SSLError (bad PEM, key not matching)
        raise ConfigError([f"{loaded.path}: backend {cfg.name}: tls: {exc}"]) from exc


def _http_backend(cfg: HttpEngineConfig, loaded: LoadedConfig) -> Backend:
    settings = _http_settings(cfg, loaded)
    if isinstance(cfg, TritonTrtllmConfig):
        return TritonTrtllmBackend(
            cfg.name, cfg.model, settings, triton_model=cfg.triton_model, text_output=cfg.text_output
        )
    if isinstance(cfg, MiiRestConfig):
        return MiiRestBackend(
            cfg.name, cfg.model, settings, deployment=cfg.deployment, stop_round_tokens=cfg.stop_round_tokens
        )
    if isinstance(cfg, TrtllmServeConfig):
        return TrtllmServeBackend(cfg.name, cfg.model, settings, tool_parser=cfg.tool_parser)
    return _PLAIN_HTTP[cfg.engine](cfg.name, cfg.model, settings)


def build_backend(cfg: BackendConfig, loaded: LoadedConfig) -> Backend:
    """The real engines; tests pass their own factory to ``create_app`` for contract fakes."""
    if loaded.model(cfg.model).kind == "embed":  # the engine's embedding adapter (``build_embedder``)
        http = None if isinstance(cfg, CTranslate2Config | LlamaCppConfig) else _http_settings(cfg, loaded)
        return build_embedder(cfg, loaded, http)
    if not isinstance(cfg, CTranslate2Config | LlamaCppConfig):
        return _http_backend(cfg, loaded)
    model = loaded.model(cfg.model)
    assert model.gguf is not None  # checked by config validation
    gguf = loaded.resolve(model.gguf)
    if isinstance(cfg, CTranslate2Config):
        from backends.ctranslate2_engine import CTranslate2Backend

        return CTranslate2Backend(
            cfg.name,
            model.name,
            gguf,
            loaded.cache_dir,
            threads=cfg.threads,
            max_concurrency=cfg.max_concurrency,
            max_queue=cfg.max_queue,
            ggufs=loaded.ggufs,
            tool_parser=model.tool_parser,
        )
    if isinstance(cfg, LlamaCppConfig):
        try:
            from backends.llamacpp_engine import LlamaCppBackend
        except ImportError as exc:
            raise ConfigError(
                [
                    f"{loaded.path}: backend {cfg.name}: llama.cpp is not installed "
                    f"(pip install 'enginegate[llama]'): {exc}"
                ]
            ) from exc
        return LlamaCppBackend(
            cfg.name, model.name, gguf, threads=cfg.threads, n_ctx=cfg.n_ctx, max_queue=cfg.max_queue,
            ggufs=loaded.ggufs, tool_parser=model.tool_parser or "hermes",
        )  # fmt: skip
    raise ConfigError([f"{loaded.path}: backend {cfg.name}: unknown engine"])


def build_embedder(cfg: BackendConfig, loaded: LoadedConfig, http: HttpSettings | None) -> Backend:
    """A backend of an embedding model (``kind: embed``): the engine's embedding adapter."""
    if isinstance(cfg, LlamaCppConfig):
        from backends.embed_llamacpp import LlamaCppEmbedder

        model = loaded.model(cfg.model)
        assert model.gguf is not None  # checked by config validation
        return LlamaCppEmbedder(
            cfg.name, model.name, loaded.resolve(model.gguf), threads=cfg.threads, n_ctx=cfg.n_ctx,
            max_queue=cfg.max_queue, ggufs=loaded.ggufs,
        )  # fmt: skip
    if isinstance(cfg, CTranslate2Config):  # the embedded default: the model's own token embeddings
        from backends.embed_static import StaticEmbedder

        model = loaded.model(cfg.model)
        assert model.gguf is not None  # checked by config validation
        return StaticEmbedder(cfg.name, model.name, loaded.resolve(model.gguf), loaded.ggufs)
    if http is not None and isinstance(cfg, VLLMConfig | LlamaServerConfig | TgiConfig):
        from backends.embed_http import LlamaServerEmbeddings, TeiEmbeddings, VLLMEmbeddings

        kind = {VLLMConfig: VLLMEmbeddings, LlamaServerConfig: LlamaServerEmbeddings, TgiConfig: TeiEmbeddings}
        return kind[type(cfg)](cfg.name, cfg.model, http)
    raise ConfigError(
        [
            f"{loaded.path}: backend {cfg.name}: engine {cfg.engine} cannot serve the embedding model {cfg.model} "
            "(embedding engines: ctranslate2 (static), llama_cpp, vllm, llama_server, tgi for text-embeddings-"
            "inference)"
        ]
    )
