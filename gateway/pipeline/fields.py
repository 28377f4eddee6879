"""What a generation request asks beyond what its model's backends honour: engine extras checked
alike on every engine, and fields dropped under ``routing.drop_unsupported``."""

from __future__ import annotations

from backends.base import GenerationRequest
from backends.capabilities import needs, without
from gateway.http.errors import ApiError
from gateway.http.exchange import Exchange
from routing.types import FleetSnapshot


def check_extras(gen: GenerationRequest) -> None:
    """Engine extras that ask for more than the answer's length allows are refused here, on every
    engine alike: ``min_tokens`` above the client's ``max_tokens``. (Without ``max_tokens`` the gateway
    sizes the answer to the backend's context, which bounds ``ignore_eos`` too, and ``min_tokens`` is
    checked against that length: ``shaping.open_sized``.)"""
    min_tokens = gen.extra.get("min_tokens")
    if min_tokens is None:
        return
    if type(min_tokens) is not int or min_tokens < 0:
        raise ApiError(400, "'min_tokens' must be a non-negative integer.", param="min_tokens", code="invalid_value")
    if gen.max_tokens is not None and min_tokens > gen.max_tokens:
        raise ApiError(
            400,
            f"'min_tokens' ({min_tokens}) must be less than or equal to 'max_tokens' ({gen.max_tokens}).",
            param="min_tokens",
            code="invalid_value",
        )


def drop_unsupported(
    ex: Exchange, gen: GenerationRequest, wanted: dict[str, str], extras: frozenset[str], snapshot: FleetSnapshot
) -> tuple[GenerationRequest, dict[str, str], frozenset[str]]:
    """``routing.drop_unsupported``: what no backend serving the model honours is dropped from the
    request and named in the ``x-enginegate-dropped`` header, instead of refused."""
    serving = [b.profile for b in snapshot.backends if gen.model in b.profile.models]
    features = frozenset().union(*(p.features for p in serving))
    understood = frozenset().union(*(p.extras for p in serving))
    dropped_features = [name for name in wanted if name not in features]
    dropped_extras = sorted(extras - understood)
    if not dropped_features and not dropped_extras:
        return gen, wanted, extras
    gen = without(gen, dropped_features, dropped_extras)
    names = sorted({wanted[name] for name in dropped_features} | set(dropped_extras))
    ex.header("x-enginegate-dropped", ",".join(names))
    return gen, needs(gen), extras - set(dropped_extras)
