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

    # Attribute docstrings become the fields' descriptions: `enginegate config schema` carries them.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)


# Patterns of the config's constrained strings, each with what it means to a person: a validation
# error quotes the meaning, never the regular expression.
HTTP_URL = r"^https?://[^\s/]+"
ZMQ_TCP = r"^tcp://[^\s/]+:\d+$"
NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$"
WORD = r"^[A-Za-z0-9_.-]+$"
HEX8 = r"^[0-9a-f]{8}$"
HEX64 = r"^[0-9a-f]{64}$"
PATTERN_MEANINGS: dict[str, str] = {
    HTTP_URL: "must start with http:// or https:// and then a host, e.g. http://10.0.0.5:8000",
    ZMQ_TCP: "must be tcp://HOST:PORT, e.g. tcp://10.0.0.5:5557",
    NAME: "must start with a letter or digit and hold only letters, digits and . _ : / @ -",
    WORD: "must hold only letters, digits and . _ -",
    HEX8: "must be 8 lowercase hex digits",
    HEX64: "must be 64 lowercase hex digits (a SHA-256)",
}
