"""The ``telemetry:`` section: OpenTelemetry traces (gateway/telemetry/tracing.py), off unless an
OTLP endpoint is named."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from gateway.strict import Frozen


class TelemetryConfig(Frozen):
    otlp_endpoint: str | None = None
    """Base URL of an OpenTelemetry collector's OTLP/HTTP receiver (``http://collector:4318``): spans
    go to its ``/v1/traces`` as protobuf. Default none: no tracing, and nothing of OpenTelemetry's
    SDK is loaded. Needs ``pip install 'enginegate[otel]'``; the exporter's own environment variables
    (``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_EXPORTER_OTLP_CERTIFICATE``...) apply. Read at start."""
    service_name: str = Field(default="enginegate", min_length=1)
    """The traces' ``service.name``."""
    sampling_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of requests traced, by trace id; a request that arrives with a ``traceparent`` follows
    its caller's sampling decision instead."""
    capture_content: bool = False
    """Put the prompt and the answer's text in the request's span (``gen_ai.input.messages``,
    ``gen_ai.output.messages``). Off by default: spans then hold sizes, never text."""
    export_delay_s: float = Field(default=5.0, gt=0, le=60)
    """Most time a finished span waits in the batch before it is sent (the exporter works on its own
    thread, off the event loop; what is left is sent at shutdown)."""

    @field_validator("otlp_endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+", value):
            raise ValueError(f"{value!r} is not an http:// or https:// URL (for example http://collector:4318)")
        return value
