"""The one strict base of every pydantic model at the gateway's edges: request bodies and config.

Unknown keys are refused (a typo is an error, never ignored) and nothing is coerced (``"1"`` is not
an integer). Config models are also frozen: one config is read by every request at once.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A request body or config section: unknown keys refused, no coercion."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Frozen(Strict):
    """A config section: strict and immutable once validated."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
