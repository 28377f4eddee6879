"""Deployment files, checked offline: hadolint, compose config, the routing YAML they ship (Kubernetes: test_k8s.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

BIN = Path(sys.executable).parent


def run(*cmd: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=120)


def test_dockerfile_is_clean_under_hadolint() -> None:
    result = run(str(BIN / "hadolint"), "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_runs_as_non_root_with_a_readiness_healthcheck() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "USER 10001" in text and "/readyz" in text and text.count("FROM ") == 2


@pytest.mark.parametrize(
    ("profile", "services"),
    [
        ("gpu", {"gateway", "vllm", "tgi", "trtllm", "llamacpp", "prometheus", "grafana", "redis"}),
        ("cpu", {"gateway-cpu", "llamacpp", "prometheus", "grafana", "redis"}),
    ],
)
def test_compose_file_is_valid_for_each_profile(profile: str, services: set[str]) -> None:
    compose = str(BIN / "docker-compose")
    check = run(compose, "-f", "docker-compose.yml", "--profile", profile, "config", "--quiet")
    assert check.returncode == 0, check.stderr
    listed = run(compose, "-f", "docker-compose.yml", "--profile", profile, "config", "--services")
    assert set(listed.stdout.split()) == services


def test_gpu_services_reserve_gpus_and_cpu_profile_needs_none() -> None:
    doc = yaml.safe_load(run(str(BIN / "docker-compose"), "-f", "docker-compose.yml", "--profile", "gpu",
                             "config").stdout)  # fmt: skip
    for name in ("vllm", "tgi", "trtllm"):
        devices = doc["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
    cpu = yaml.safe_load(run(str(BIN / "docker-compose"), "-f", "docker-compose.yml", "--profile", "cpu",
                             "config").stdout)  # fmt: skip
    assert all("deploy" not in s for s in cpu["services"].values())


def config_check(path: Path) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "gateway.cli", "config", "check", str(path))


@pytest.mark.parametrize("config", ["configs/compose.yaml", "configs/compose-cpu.yaml", "configs/fleet-example.yaml"])
def test_shipped_configs_pass_config_check(config: str) -> None:
    result = config_check(ROOT / config)
    assert result.returncode == 0, result.stderr


def test_grafana_provisioning_points_at_the_dashboard_and_datasource() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/enginegate.json").read_text())
    source = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = source["datasources"][0]["uid"]
    assert dashboard["panels"] and all(p["datasource"]["uid"] == uid for p in dashboard["panels"])
    assert all(t["expr"].startswith(("sum", "rate", "histogram")) for p in dashboard["panels"] for t in p["targets"])
