"""The ``auth:`` and ``redis:`` config sections (validated at the edge, like the rest of gateway/config/)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gateway.strict import HEX8, HEX64, Frozen

KeyId = Annotated[str, Field(pattern=HEX8)]
DEFAULT_CLASSES = {"high": 100, "default": 0, "low": -100}


class KeyLimits(Frozen):
    """What one key may do; 0 or null: unlimited."""

    name: str = ""
    """A label for people (``enginegate keys list``); not unique."""
    team: str = ""
    """The team the key belongs to: routing rules match it (``match.teams``) and metrics count per team."""
    models: list[str] = []
    """Glob patterns of the models the key may use; empty: every model."""
    rpm: int = Field(default=0, ge=0)
    """Requests per minute (``auth.window_s``, sliding); beyond it 429 with Retry-After. 0: unlimited."""
    tpm: int = Field(default=0, ge=0)
    """Tokens per minute, prompt plus the most the request may generate (reserved up front, settled to
    what it used); beyond it 429. 0: unlimited."""
    concurrency: int = Field(default=0, ge=0)
    """Requests in flight at once; beyond it 429. 0: unlimited."""
    budget_usd: float = Field(default=0.0, ge=0)
    """Dollars the key may spend per ``budget_period`` at the models' prices; beyond it 429. 0: unlimited."""
    budget_period: Literal["day", "month"] = "month"
    """The budget's period: a calendar day or month (UTC)."""
    priority: str = "default"
    """A class of ``auth.priority_classes``: it caps the ``x-priority`` the key's requests may ask for."""
    expires_at: float | None = None
    """Unix seconds; after it the key is refused."""
    enabled: bool = True
    """False: the key is refused (401) but kept, with its usage."""


class DeclaredKey(KeyLimits):
    """A key kept in git by its hash: ``enginegate keys hash TOKEN`` prints both fields."""

    id: KeyId
    """The key's id: 8 hex digits, the part of the token after ``sk-eg-`` and before the secret."""
    sha256: Annotated[str, Field(pattern=HEX64)]
    """SHA-256 of the whole token in hex; the token itself is never written down."""


class AuthConfig(Frozen):
    required: bool = False
    """True: every /v1 request needs a valid key (401 otherwise). False (the embedded default): requests
    without a gateway key are served as today; a request that presents a gateway key (``sk-eg-...``)
    is still checked and limited."""
    database: str | None = None
    """Where keys and usage live: a SQLite file (relative to this config file; default ``keys.db``
    beside it) or a ``postgresql://`` DSN shared by replicas."""
    cache_s: float = Field(default=2.0, ge=0, le=300)
    """A key read from the database is trusted this long: a revoked or changed key takes effect on
    every replica within this (plus the time of one read)."""
    usage_flush_s: float = Field(default=2.0, gt=0, le=300)
    """Usage is written to the database in batches this often (and at shutdown)."""
    priority_classes: dict[str, int] = DEFAULT_CLASSES
    """Class name to routing priority (the ``x-priority`` scale, -1000..1000): a key's class caps the
    priority its requests may ask for."""
    window_s: float = Field(default=60.0, gt=0, le=3600)
    """The sliding window of ``rpm`` and ``tpm`` (a minute; shorter only in tests)."""
    team_metrics_limit: int = Field(default=50, ge=0, le=1000)
    """Teams with their own Prometheus series; later ones count as ``other``."""
    keys: list[DeclaredKey] = []
    """Keys declared in this file by their hash (``enginegate keys hash TOKEN``), besides those in the database."""

    @model_validator(mode="after")
    def _classes(self) -> AuthConfig:
        if "default" not in self.priority_classes:
            raise ValueError("priority_classes needs a 'default' class")
        bad = [k.id for k in self.keys if k.priority not in self.priority_classes]
        if bad:
            raise ValueError(f"keys {', '.join(bad)} name an unknown priority class")
        if any(not -1000 <= v <= 1000 for v in self.priority_classes.values()):
            raise ValueError("priority_classes values must be from -1000 to 1000")
        return self

    @property
    def enabled(self) -> bool:
        """Whether the gateway checks keys at all (otherwise not one extra instruction per request)."""
        return self.required or self.database is not None or bool(self.keys)


class RedisConfig(Frozen):
    url: str | None = None
    """``redis://host:port/db``: limits and spend exact across every replica sharing it. Without it
    the same limits hold in each process."""
    on_error: Literal["open", "closed"] = "open"
    """Redis unreachable, for the rate limits (``rpm``, ``tpm``, ``concurrency``): ``open`` keeps
    serving with this process's own counters (a limit then holds per replica: each counts what it
    admitted itself in the window, through Redis or not; a warning is logged and counted), ``closed``
    answers 503. What a replica admitted alone is written into Redis when it is back."""
    budget_on_error: Literal["open", "closed"] = "closed"
    """Redis unreachable, for keys with a dollar budget: ``closed`` (the default) answers 503
    ``budget_store_unavailable``, so spend never exceeds a budget; ``open`` lets each replica spend
    on its own counter (the budget then holds per replica, so a key may overspend up to the replicas'
    count times its budget), charged to Redis when it is back."""
    timeout_s: float = Field(default=1.0, gt=0, le=10)
    """Longest wait for one Redis call (connecting included) before the fail mode applies."""
    retry_s: float = Field(default=1.0, gt=0, le=60)
    """After a failure Redis is tried again this much later (requests meanwhile use the fail mode)."""
