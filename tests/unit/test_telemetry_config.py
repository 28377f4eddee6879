"""The ``telemetry:`` section: a bad endpoint or ratio is a FILE:LINE error (in words, never a regex),
and an endpoint without the OpenTelemetry packages installed says what to install (instead of failing
when the app starts)."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import pytest

from gateway.config import ConfigError, parse_config

HEAD = (
    "models: [{name: m, params_b: 8}]\n"
    "backends: [{name: b, engine: vllm, url: 'http://127.0.0.1:9', model: m, gpu: H100}]\n"
)


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.yaml")
    return info.value.problems


def test_bad_telemetry_values_name_their_line() -> None:
    found = _problems(HEAD + "telemetry:\n  otlp_endpoint: collector:4318\n")
    assert found == [
        "t.yaml:4: telemetry.otlp_endpoint: 'collector:4318' is not an http:// or https:// URL "
        "(for example http://collector:4318)"
    ]
    found = _problems(HEAD + "telemetry: {otlp_endpoint: 'http://c:4318', sampling_ratio: 2}\n")
    assert len(found) == 1 and "telemetry.sampling_ratio" in found[0], found
    config, _ = parse_config(HEAD + "telemetry: {otlp_endpoint: 'http://c:4318', sampling_ratio: 0.5}\n", "t.yaml")
    assert config.telemetry.otlp_endpoint == "http://c:4318" and not config.telemetry.capture_content


def test_an_endpoint_without_the_packages_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if "opentelemetry" in name else real(name))
    found = _problems(HEAD + "telemetry: {otlp_endpoint: 'http://c:4318'}\n")
    assert len(found) == 1 and "pip install 'enginegate[otel]'" in found[0], found
    parse_config(HEAD, "t.yaml")  # without an endpoint nothing is asked of them


def test_an_exporter_that_does_not_import_is_a_config_error_that_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """xds-protos (the epp extra) installed after opentelemetry-proto replaces its generated files with
    older ones, and the exporter's import fails (a fresh venv met this): said at config time, not at start."""
    real = importlib.import_module

    def broken(name: str, *args: Any) -> Any:
        if name.startswith("opentelemetry.exporter"):
            raise ImportError("cannot import name 'InstrumentationScope'")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", broken)
    found = _problems(HEAD + "telemetry: {otlp_endpoint: 'http://c:4318'}\n")
    assert len(found) == 1 and "InstrumentationScope" in found[0] and "opentelemetry-proto" in found[0], found
