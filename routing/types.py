"""Plain data the routing policy works on: no I/O, no engine objects, no gateway imports. What it
answers is in ``routing.decisions``, the rules it applies in ``routing.rules``.

The records built on every request (``RequestFeatures``, ``BackendState``, ``FleetSnapshot``, and
``routing.decisions``' own) write out their ``__init__``: mypyc compiles a method written
in the class, while the one ``dataclass`` generates runs interpreted and sets each field through the
type's attribute lookup (``RequestFeatures``: 10,500 instructions a request against about 300, under
callgrind). Each assigns its fields, which the type checker's frozen view calls read-only: hence the
``misc`` code off in this module alone (every other module still may not assign a field), and
``tests/unit/test_values.py`` checks each such ``__init__`` against the record's fields.
"""

# mypy: disable-error-code="misc"

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from routing.catalog import MEMORY_HEADROOM, EngineEfficiency, GpuSpec
from values import value

if TYPE_CHECKING:
    from routing.kv_exact import ExactIndex
    from routing.prefix import PrefixIndex


@value(frozen=True)
class RequestFeatures:
    model: str
    prompt_tokens: int
    """Estimated from the text unless the model's tokenizer was at hand."""
    max_tokens: int | None
    stream: bool = False
    latency_budget_ms: float | None = None
    ttft_budget_ms: float | None = None
    tpot_budget_ms: float | None = None
    priority: int = 0
    tenant: str | None = None
    prefix_hash: int = 0
    """Rendezvous key of the prompt's opening (``routing.prefix.opening_key``): every turn of a
    conversation, from any gateway replica, ranks the backends the same way."""
    prefix_blocks: tuple[int, ...] = ()
    """Chained hashes of the prompt's blocks (``routing.prefix.chain``): matched against what each
    backend is expected to hold."""
    block_tokens: float = 0.0
    """Prompt tokens per block, from the request's tokens over its bytes."""
    preamble_blocks: int = 0
    """Blocks of the prompt's preamble (a chat's system messages), which many conversations share:
    cache beyond them is this conversation's own."""
    headers: tuple[tuple[str, str], ...] = ()
    """Lower-cased request headers rules may match on (never logged)."""
    gate: float = 0.0
    """A number in [0, 1) drawn at random per request: a recovering (half-open) backend admits the
    request when it falls below the backend's recovery share, so each request, not each prompt, is
    a draw."""
    key: str | None = None
    """The API key's id (gateway/tenancy), when the request presented one."""
    team: str | None = None
    """The key's team, when it has one."""
    needs: frozenset[str] = frozenset()
    """Capabilities the request uses (``backends.capabilities`` names): only backends with all of them serve it."""
    extras: frozenset[str] = frozenset()
    """Fields outside OpenAI's spec the request carries: only backends that understand them serve it."""
    top_logprobs: int = 0
    """Alternatives asked per token: only backends that give that many serve it."""
    token_ids: Sequence[int] = ()
    """The rendered prompt's token ids, when the gateway tokenized it (the model's tokenizer is at
    hand) and some backend tells exactly what it holds (``exact``): matched against that."""

    def __init__(
        self,
        model: str,
        prompt_tokens: int,
        max_tokens: int | None,
        stream: bool = False,
        latency_budget_ms: float | None = None,
        ttft_budget_ms: float | None = None,
        tpot_budget_ms: float | None = None,
        priority: int = 0,
        tenant: str | None = None,
        prefix_hash: int = 0,
        prefix_blocks: tuple[int, ...] = (),
        block_tokens: float = 0.0,
        preamble_blocks: int = 0,
        headers: tuple[tuple[str, str], ...] = (),
        gate: float = 0.0,
        key: str | None = None,
        team: str | None = None,
        needs: frozenset[str] = frozenset(),
        extras: frozenset[str] = frozenset(),
        top_logprobs: int = 0,
        token_ids: Sequence[int] = (),
    ) -> None:
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.stream = stream
        self.latency_budget_ms = latency_budget_ms
        self.ttft_budget_ms = ttft_budget_ms
        self.tpot_budget_ms = tpot_budget_ms
        self.priority = priority
        self.tenant = tenant
        self.prefix_hash = prefix_hash
        self.prefix_blocks = prefix_blocks
        self.block_tokens = block_tokens
        self.preamble_blocks = preamble_blocks
        self.headers = headers
        self.gate = gate
        self.key = key
        self.team = team
        self.needs = needs
        self.extras = extras
        self.top_logprobs = top_logprobs
        self.token_ids = token_ids

    @property
    def budgeted(self) -> bool:
        """The request states a budget (first token, whole answer or time per token)."""
        return self.ttft_budget_ms is not None or self.latency_budget_ms is not None or self.tpot_budget_ms is not None


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params_b: float
    bytes_per_param: float
    context: int
    kv_bytes_per_token: float
    weight_bytes: float = field(init=False, repr=False, compare=False)
    prefill_flop_per_token: float = field(init=False, repr=False, compare=False)
    """2 x parameters: the FLOPs a prompt token's prefill takes (``routing.estimator.prefill_ms``)."""

    def __post_init__(self) -> None:
        # Derived once here, not on every candidate of every request: routing reads them per prediction.
        object.__setattr__(self, "weight_bytes", self.params_b * 1e9 * self.bytes_per_param)
        object.__setattr__(self, "prefill_flop_per_token", 2 * self.params_b * 1e9)


@dataclass(frozen=True, slots=True)
class BackendProfile:
    """What a backend is: fixed by config."""

    name: str
    engine: str
    models: frozenset[str]
    gpu: GpuSpec
    gpu_count: int
    memory_gb: float
    """Memory for weights and KV cache: the GPUs' total, or the host's for CPU backends."""
    efficiency: EngineEfficiency
    max_concurrency: int
    cost_per_hour: float = 0.0
    pool: str | None = None
    context: int | None = None
    """The deployment's own context limit, when smaller than the model's."""
    features: frozenset[str] = frozenset()
    """Capabilities the backend honours (its adapter's, adjusted by config and the model entry)."""
    extras: frozenset[str] = frozenset()
    """Fields outside OpenAI's spec its engine understands."""
    max_top_logprobs: int = 20
    """Most alternatives per token the engine gives."""
    prefill_flops: float = field(init=False, repr=False, compare=False)
    """FLOP/s usable for prefill: its GPUs' peak at the engine's prefill MFU."""
    decode_bandwidth: float = field(init=False, repr=False, compare=False)
    """Bytes/s of memory bandwidth usable for decode: its GPUs' peak at the engine's decode MBU."""
    usable_bytes: float = field(init=False, repr=False, compare=False)
    """Memory for weights and KV cache, less the headroom engines keep."""

    def __post_init__(self) -> None:
        # Derived once per config load: routing reads them for every candidate of every request.
        gpu, efficiency = self.gpu, self.efficiency
        object.__setattr__(self, "prefill_flops", gpu.tflops * 1e12 * self.gpu_count * efficiency.prefill_mfu)
        object.__setattr__(self, "decode_bandwidth", gpu.bandwidth_gbs * 1e9 * self.gpu_count * efficiency.decode_mbu)
        object.__setattr__(self, "usable_bytes", self.memory_gb * 1e9 * MEMORY_HEADROOM)


class Breaker(enum.Enum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


@value(frozen=True)
class Observed:
    """What traffic taught about one backend: smoothed TTFT error and time per output token."""

    ttft_ratio: float = 1.0
    """Observed TTFT over predicted (queueing included), smoothed."""
    tpot_ms: float | None = None
    samples: int = 0
    out_tokens: float | None = None
    """Completion tokens per answer, smoothed: the service time of the requests queued ahead (whose
    own lengths are unknown), where an assumed 256 made a 20-token workload look 13 times slower."""


@value(frozen=True)
class BackendState:
    """One backend as routing sees it now."""

    profile: BackendProfile
    healthy: bool = True
    running: int = 0
    waiting: int = 0
    load_fresh: bool = True
    """False when the engine's metrics are stale: running/waiting are then the gateway's own count."""
    kv_cache_usage: float | None = None
    prefill_backlog_tokens: int = 0
    """Prompt tokens sent to the backend that have not produced a first token yet: the prefill work
    a new request waits behind (known for this gateway's own traffic)."""
    breaker: Breaker = Breaker.CLOSED
    recovery: float = 1.0
    """Half-open breakers let this share of traffic through, growing as requests succeed."""
    observed: Observed = field(default_factory=Observed)
    engine_slots: int | None = None
    """Requests the engine runs at once as its own gauges showed (running while others waited), when
    lower than the configured concurrency: queueing starts there."""
    prefix: PrefixIndex | None = field(default=None, compare=False)
    """The blocks this gateway expects the engine to hold (read only by routing)."""
    exact: ExactIndex | None = field(default=None, compare=False)
    """What the engine holds, exactly, from its own KV-cache events (vLLM), when in sync: it
    replaces ``prefix`` for requests whose token ids are known."""

    def __init__(
        self,
        profile: BackendProfile,
        healthy: bool = True,
        running: int = 0,
        waiting: int = 0,
        load_fresh: bool = True,
        kv_cache_usage: float | None = None,
        prefill_backlog_tokens: int = 0,
        breaker: Breaker = Breaker.CLOSED,
        recovery: float = 1.0,
        observed: Observed | None = None,
        engine_slots: int | None = None,
        prefix: PrefixIndex | None = None,
        exact: ExactIndex | None = None,
    ) -> None:
        self.profile = profile
        self.healthy = healthy
        self.running = running
        self.waiting = waiting
        self.load_fresh = load_fresh
        self.kv_cache_usage = kv_cache_usage
        self.prefill_backlog_tokens = prefill_backlog_tokens
        self.breaker = breaker
        self.recovery = recovery
        self.observed = Observed() if observed is None else observed
        self.engine_slots = engine_slots
        self.prefix = prefix
        self.exact = exact

    @property
    def name(self) -> str:
        return self.profile.name


@value(frozen=True)
class FleetSnapshot:
    backends: tuple[BackendState, ...]
    models: dict[str, ModelSpec] = field(default_factory=dict)

    def __init__(
        self,
        backends: tuple[BackendState, ...],
        models: dict[str, ModelSpec] | None = None,
    ) -> None:
        self.backends = backends
        self.models = {} if models is None else models
