"""Deployment files, checked offline: hadolint, compose config, the routing YAML they ship (Kubernetes: test_k8s.py)."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.http.drain import SETTLE_S
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


IMAGE_LEAVES_OUT = {"llama", "epp", "sim", "test"}
"""Extras the image does without: llama-cpp-python builds from source, the picker's protos clash with the
OTLP exporter's (docs/epp.md), plotting and the test tools serve nobody in production."""


def test_image_carries_every_other_extra() -> None:
    """The image's build stage installs every extra but those it leaves out by name: its own configs and
    manifests use them (redis for replicas, traces, KV events), and mypyc's analysis of the compiled
    request path needs the modules they bring (without them the image's compile step failed: mypy
    found no ``redis``, ``opentelemetry``, ``zmq``, ``msgspec``)."""
    text = (ROOT / "Dockerfile").read_text()
    wheels = re.findall(r'pip wheel [^\n]*"\.\[([a-z0-9,-]+)\]"', text)
    assert len(wheels) == 1, "the build stage makes the wheels of the project with its extras, once"
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert set(wheels[0].split(",")) == extras - IMAGE_LEAVES_OUT


PROFILES = {
    "gpu": {
        "gateway-1",
        "gateway-2",
        "vllm",
        "tgi",
        "trtllm",
        "llamacpp",
        "prometheus",
        "grafana",
        "redis",
        "balancer",
    },
    "cpu": {"gateway-cpu-1", "gateway-cpu-2", "llamacpp", "prometheus", "grafana", "redis", "balancer"},
}


@functools.cache
def compose(profile: str) -> dict[str, Any]:
    result = run(str(BIN / "docker-compose"), "-f", "docker-compose.yml", "--profile", profile, "config")
    assert result.returncode == 0, result.stderr
    return dict(yaml.safe_load(result.stdout))


def gateways(profile: str) -> dict[str, dict[str, Any]]:
    """The profile's gateway replicas, by service name, with the routing YAML each one serves."""
    services = compose(profile)["services"]
    out = {}
    for name, service in services.items():
        if service.get("image") == "enginegate:latest":
            path = service["command"][service["command"].index("--config") + 1]
            out[name] = {**service, "config": yaml.safe_load((ROOT / path.removeprefix("/app/")).read_text())}
    return out


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_file_is_valid_for_each_profile(profile: str) -> None:
    compose_bin = str(BIN / "docker-compose")
    check = run(compose_bin, "-f", "docker-compose.yml", "--profile", profile, "config", "--quiet")
    assert check.returncode == 0, check.stderr
    assert set(compose(profile)["services"]) == PROFILES[profile]


def test_gpu_services_reserve_gpus_and_cpu_profile_needs_none() -> None:
    for name in ("vllm", "tgi", "trtllm"):
        devices = compose("gpu")["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
    assert all("deploy" not in s for s in compose("cpu")["services"].values())


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_replicas_share_the_redis_it_starts_behind_one_balancer(profile: str) -> None:
    services, replicas = compose(profile)["services"], gateways(profile)
    assert len(replicas) >= 2
    for name, replica in replicas.items():
        config = replica["config"]
        redis = urlsplit(config["redis"]["url"])
        assert redis.hostname in services and redis.hostname in replica["depends_on"], name
        assert config["routing"]["prefix"]["share"] is True
        assert "ports" not in replica  # reached through the balancer only
    assert [p["published"] for p in services["balancer"]["ports"]] == ["8000"]


def haproxy_servers() -> dict[str, str]:
    lines = (ROOT / "deploy/haproxy/haproxy.cfg").read_text().splitlines()
    return {w[1]: w[2] for w in (line.split() for line in lines) if w and w[0] == "server"}


def test_balancer_sends_to_every_replica_and_notices_a_drain_in_time() -> None:
    replicas = gateways("gpu") | gateways("cpu")
    assert {name: f"{name}:8000" for name in replicas} == haproxy_servers()
    text = (ROOT / "deploy/haproxy/haproxy.cfg").read_text()
    assert "option httpchk GET /readyz" in text
    checks = dict(re.findall(r"\b(inter|fall) (\d+)", text))
    noticed_s = int(checks["inter"]) * int(checks["fall"])
    for name, replica in replicas.items():
        server = replica["config"]["server"]
        # The balancer stops sending before the draining replica's listener closes...
        assert noticed_s < server["drain_delay_s"], name
        # ...and compose's SIGKILL waits for the drain (stop_grace_period, "35s").
        needed = server["drain_delay_s"] + server.get("shutdown_grace_s", 20) + SETTLE_S
        assert needed < float(replica["stop_grace_period"].removesuffix("s")), name


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (apt-get install haproxy)")
def test_balancer_config_is_valid() -> None:
    result = run("haproxy", "-c", "-f", "deploy/haproxy/haproxy.cfg")
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_scrapes_every_gateway_replica() -> None:
    scrape = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    job = next(j for j in scrape["scrape_configs"] if j["job_name"] == "enginegate")
    assert set(job["static_configs"][0]["targets"]) == set(haproxy_servers().values())


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
