"""Tracing off costs nothing: an app built without ``telemetry.otlp_endpoint`` loads none of
OpenTelemetry's SDK, exporter or protobuf modules, nor the gateway's tracing module (the same app with
an endpoint loads them, so the check can fail). FastAPI imports OpenTelemetry's API on its own; that
part is not the gateway's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = ("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.proto", "gateway.telemetry.tracing")
BUILD = """
import json, sys
from gateway.app import create_app
from gateway.config import load_config
create_app(load_config(sys.argv[1]))
print(json.dumps(sorted(m for m in sys.modules if m.startswith({ours!r}))))
"""
CONFIG = (
    "models: [{name: m, params_b: 8}]\n"
    "backends: [{name: b, engine: vllm, url: 'http://127.0.0.1:9', model: m, gpu: H100}]\n"
)


def _loaded(path: Path, config: str) -> list[str]:
    path.write_text(config)
    done = subprocess.run(
        [sys.executable, "-c", BUILD.format(ours=OURS), str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_an_app_without_an_endpoint_loads_nothing_of_tracing(tmp_path: Path) -> None:
    assert _loaded(tmp_path / "off.yaml", CONFIG) == []
    traced = _loaded(tmp_path / "on.yaml", CONFIG + "telemetry: {otlp_endpoint: 'http://127.0.0.1:9'}\n")
    assert {m.split(".")[1] for m in traced if m.startswith("opentelemetry.")} == {"sdk", "exporter", "proto"}
    assert "gateway.telemetry.tracing" in traced
