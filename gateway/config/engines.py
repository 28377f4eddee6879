"""The ``backends:`` section: one tagged variant per engine (``engine:``), placement and transport keys."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gateway.config.models import Name
from gateway.strict import HTTP_URL, WORD, ZMQ_TCP, Frozen


class CapabilitiesConfig(Frozen):
    """Adjusts what the adapter says its engine honours, for engines launched with or without the
    flags a capability needs (vLLM's ``--enable-auto-tool-choice``, trtllm-serve's guided decoding)."""

    enable: list[str] = []
    """Capability names (``tools``, ``json_schema``...: the capability matrix in docs/engines.md) or
    extra request fields the engine takes (``top_k``...)."""
    disable: list[str] = []
    """Capability names the engine does not honour as deployed: requests that need them go to other
    backends (or are refused with 400)."""

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
    """GPUs the engine runs on (tensor parallel): memory, bandwidth and FLOPS add up in the estimates."""
    memory_gb: float | None = Field(default=None, gt=0)
    """Memory for weights and KV cache; default: the GPUs' total (CPU backends: 16)."""
    cost_per_hour: float = Field(default=0.0, ge=0)
    """What the backend costs per hour in any currency; the routing's ``cost`` weight prefers the
    cheaper capacity. 0: free (every backend equal on cost)."""
    pool: Name | None = None
    """A group name shared by several backends: routing rules' ``prefer``, ``avoid`` and ``require``
    can name it in place of each backend."""
    capabilities: CapabilitiesConfig = CapabilitiesConfig()
    """Adjusts what the adapter says its engine honours (``enable``, ``disable``)."""


class CTranslate2Config(_Placement):
    """CTranslate2 in this process, on the CPU, from the model's GGUF (converted once into ``server.cache_dir``)."""

    name: Name
    """The backend's name (unique): in logs, metrics, ``x-enginegate-backend`` and routing rules."""
    engine: Literal["ctranslate2"]
    model: Name
    """The ``models[].name`` this backend serves (it needs that model's ``gguf``)."""
    threads: int = Field(default=1, ge=1, le=256)
    """CPU threads CTranslate2 computes with (its ``intra_threads``)."""
    max_concurrency: int = Field(default=4, ge=1, le=1024)
    """Requests generated at once (worker threads)."""
    max_queue: int = Field(default=64, ge=0)
    """Requests waiting for a worker; beyond it the backend answers overloaded and the next one is tried."""


class LlamaCppConfig(_Placement):
    """llama.cpp in this process (llama-cpp-python), on the CPU, from the model's GGUF."""

    name: Name
    """The backend's name (unique): in logs, metrics, ``x-enginegate-backend`` and routing rules."""
    engine: Literal["llama_cpp"]
    model: Name
    """The ``models[].name`` this backend serves (it needs that model's ``gguf``)."""
    threads: int = Field(default=1, ge=1, le=256)
    """CPU threads llama.cpp computes with."""
    n_ctx: int | None = Field(default=None, ge=16)
    """Context window in tokens the model is loaded with (at most the GGUF's); default: the GGUF's."""
    max_queue: int = Field(default=64, ge=0)
    """Requests waiting while one generates (llama.cpp runs one at a time); beyond it the backend
    answers overloaded and the next one is tried."""


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
    """The backend's name (unique): in logs, metrics, ``x-enginegate-backend`` and routing rules."""
    model: Name
    """The ``models[].name`` this backend serves."""
    url: Annotated[str, Field(pattern=HTTP_URL)]
    """The engine's base URL (``http://host:port``, or ``https://`` with ``tls``), without the API path."""
    served_model: str | None = None
    """The model name the engine knows; default: ``model``."""
    api_key_env: str | None = None
    """Environment variable holding the engine's API key (keys never live in this file)."""
    connect_timeout_s: float = Field(default=2.0, gt=0)
    """Seconds to open a connection to the engine; then the next backend is tried."""
    response_timeout_s: float | None = Field(default=None, gt=0)
    """From the request written to the response's status and headers; default: ``read_timeout_s``."""
    read_timeout_s: float = Field(default=600.0, gt=0)
    """Longest silence between two pieces of a response's body."""
    idle_timeout_s: float = Field(default=4.0, gt=0)
    """Idle connections are reused only this long; keep it below the engine's keep-alive (uvicorn: 5 s)."""
    tls: TlsConfig | None = None
    """Client TLS for an ``https://`` url; default: the system's CAs, no client certificate."""
    max_concurrency: int = Field(default=256, ge=1)
    """Connections (so requests) open to the engine at once; the routing counts load against it, or
    against the engine's own slots when it reports fewer."""
    default_max_tokens: int = Field(default=256, ge=1)
    """For engines that need a token limit when the client sets none (TGI native, Triton, MII REST)."""

    @model_validator(mode="after")
    def _tls_is_for_https(self) -> _HttpEngine:
        if self.tls is not None and not self.url.startswith("https://"):
            raise ValueError("tls needs an https:// url")
        return self


class KvEventsConfig(Frozen):
    """Where a vLLM publishes its KV-cache events (``--kv-events-config``, publisher ``zmq``)."""

    endpoint: Annotated[str, Field(pattern=ZMQ_TCP)]
    """vLLM's ``endpoint`` as this gateway reaches it: ``tcp://host:port`` (vLLM binds ``tcp://*:port``)."""
    replay_endpoint: Annotated[str, Field(pattern=ZMQ_TCP)] | None = None
    """vLLM's ``replay_endpoint``: events missed in a gap are asked again there (else the index restarts)."""
    topic: str = ""
    """vLLM's ``topic`` (its default is empty)."""


class VLLMConfig(_HttpEngine):
    """A vLLM server (``vllm serve``), through its OpenAI API."""

    engine: Literal["vllm"]
    kv_events: KvEventsConfig | None = None
    """Precise prefix routing: the gateway subscribes to the engine's KV-cache events and knows which
    prompt blocks it holds (needs ``pip install enginegate[kv-events]`` and the model's tokenizer,
    ``models[].gguf``, to match prompts: the config is refused without either)."""


class TrtllmServeConfig(_HttpEngine):
    """TensorRT-LLM's ``trtllm-serve``, through its OpenAI API."""

    engine: Literal["trtllm_serve"]
    tool_parser: Annotated[str, Field(pattern=WORD)] | None = None
    """The server's ``--tool_parser`` (e.g. ``qwen3``), when it was launched with one: it then answers
    with ``tool_calls``. Without it the call markup comes back as text and the gateway parses it with
    the model's ``tool_parser`` (a model without one is served no ``tools``)."""


class TritonTrtllmConfig(_HttpEngine):
    """TensorRT-LLM behind Triton Inference Server, through Triton's generate_stream endpoint."""

    engine: Literal["triton_trtllm"]
    triton_model: str = "ensemble"
    """The Triton model requests go to (``/v2/models/<triton_model>/generate_stream``)."""
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
    """DeepSpeed-MII's REST server (``/mii/<deployment>``)."""

    engine: Literal["mii_rest"]
    deployment: Name
    """The MII deployment name (``/mii/<deployment>``), as the REST server was started with."""
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
