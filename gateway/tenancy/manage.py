"""Key management shared by the CLI (against the database directly) and the admin API."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from gateway.tenancy.keys import EDITABLE, KeyRecord, digest, new_token, updated
from gateway.tenancy.settings import KeyLimits
from gateway.tenancy.store import DuplicateKey, KeyStore, UsageRow


class BadKeySpec(ValueError):
    """Key fields that do not validate (the message names them)."""


def validate(fields: dict[str, Any], classes: dict[str, int] | None = None) -> KeyLimits:
    try:
        limits = KeyLimits.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise BadKeySpec(problems) from None
    if classes is not None and limits.priority not in classes:
        raise BadKeySpec(f"priority: unknown class {limits.priority!r} (known: {', '.join(classes)})")
    return limits


async def create(store: KeyStore, limits: KeyLimits) -> tuple[KeyRecord, str]:
    """A new key: its record and the token, which is shown once and never stored."""
    for _ in range(8):  # 32-bit ids: a collision is rare, and then another id is drawn
        key_id, token = new_token()
        fields = limits.model_dump()
        fields["models"] = tuple(fields["models"])
        record = KeyRecord(id=key_id, sha256=digest(token), created_at=time.time(), **fields)
        try:
            await store.insert(record)
        except DuplicateKey:
            continue
        return record, token
    raise RuntimeError("could not draw an unused key id")


async def update(
    store: KeyStore, key_id: str, changes: dict[str, Any], classes: dict[str, int] | None = None
) -> KeyRecord | None:
    record = await store.get(key_id)
    if record is None:
        return None
    merged = {k: v for k, v in record.public().items() if k in EDITABLE} | changes
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise BadKeySpec(f"cannot change {', '.join(sorted(unknown))} (editable: {', '.join(EDITABLE)})")
    validate(merged, classes)
    new = updated(record, changes)
    await store.update(new)
    return new


async def revoke(store: KeyStore, key_id: str) -> KeyRecord | None:
    record = await store.get(key_id)
    if record is None:
        return None
    if record.revoked_at is None:
        record = replace(record, revoked_at=time.time(), enabled=False)
        await store.update(record)
    return record


def summarize(rows: list[UsageRow]) -> dict[str, Any]:
    """Requests, tokens and spend in total, by day and by model."""

    def empty() -> dict[str, Any]:
        return {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "cost_usd": 0.0}

    total = empty()
    days: dict[str, dict[str, Any]] = {}
    models: dict[str, dict[str, Any]] = {}
    for r in rows:
        for bucket in (total, days.setdefault(r.day, empty()), models.setdefault(r.model, empty())):
            bucket["requests"] += r.requests
            bucket["prompt_tokens"] += r.prompt_tokens
            bucket["completion_tokens"] += r.completion_tokens
            bucket["cached_tokens"] += r.cached_tokens
            bucket["cost_usd"] = round(bucket["cost_usd"] + r.cost_usd, 9)
    return {"total": total, "by_day": days, "by_model": models}
