"""API keys: generated here (256 random bits), shown once, stored as a SHA-256 hash beside a public id.

A key reads ``sk-eg-<id>_<secret>``: the 8-hex-digit id names the key in logs, metrics, errors and
the admin API; the secret never leaves the client after creation. A plain SHA-256 is enough: the
secret is random and long, so there is nothing to guess, and a slow password hash would cost
milliseconds of CPU on every request.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

PREFIX = "sk-eg-"
_ID_LEN = 8
_TOKEN_LEN = len(PREFIX) + _ID_LEN + 1 + 43


def new_token() -> tuple[str, str]:
    """A fresh key: (id, token)."""
    key_id = secrets.token_hex(_ID_LEN // 2)
    return key_id, f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def key_id_of(token: str) -> str | None:
    """The id part of a well-formed gateway key, else None (no secret is ever returned or logged)."""
    if len(token) != _TOKEN_LEN or not token.startswith(PREFIX) or token[len(PREFIX) + _ID_LEN] != "_":
        return None
    key_id = token[len(PREFIX) : len(PREFIX) + _ID_LEN]
    return key_id if all(c in "0123456789abcdef" for c in key_id) else None


def looks_like_key(token: str) -> bool:
    """A gateway key, as opposed to a placeholder some clients must send (``api_key="unused"``)."""
    return token.startswith(PREFIX)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One key as stored (never the token itself)."""

    id: str
    sha256: str
    name: str = ""
    team: str = ""
    models: tuple[str, ...] = ()
    rpm: int = 0
    tpm: int = 0
    concurrency: int = 0
    budget_usd: float = 0.0
    budget_period: str = "month"
    priority: str = "default"
    expires_at: float | None = None
    enabled: bool = True
    created_at: float = field(default_factory=time.time)
    revoked_at: float | None = None
    source: str = "database"
    """``database`` or ``config`` (declared in YAML by hash: read-only through the API)."""

    def matches(self, token: str) -> bool:
        return hmac.compare_digest(digest(token), self.sha256)

    def allows(self, model: str) -> bool:
        return not self.models or any(fnmatch.fnmatchcase(model, m) for m in self.models)

    def usable(self, now: float) -> str | None:
        """Why the key cannot be used now, or None."""
        if self.revoked_at is not None:
            return "revoked"
        if not self.enabled:
            return "disabled"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return None

    def public(self) -> dict[str, Any]:
        """What the admin API and the CLI show: everything but the hash."""
        return {
            "id": self.id,
            "name": self.name,
            "team": self.team,
            "models": list(self.models),
            "rpm": self.rpm,
            "tpm": self.tpm,
            "concurrency": self.concurrency,
            "budget_usd": self.budget_usd,
            "budget_period": self.budget_period,
            "priority": self.priority,
            "expires_at": self.expires_at,
            "enabled": self.enabled,
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
            "source": self.source,
        }


EDITABLE = (
    "name", "team", "models", "rpm", "tpm", "concurrency", "budget_usd", "budget_period", "priority", "expires_at",
    "enabled",
)  # fmt: skip


def updated(record: KeyRecord, changes: dict[str, Any]) -> KeyRecord:
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise ValueError(f"cannot change {', '.join(sorted(unknown))}")
    if "models" in changes:
        changes = {**changes, "models": tuple(changes["models"])}
    return replace(record, **changes)
