"""The Kubernetes manifests as ``kubectl kustomize`` renders them: schemas, the routing YAML inside, and
the pieces that must agree with each other and with the gateway (ports, labels, drain timing)."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.http.drain import SETTLE_S
from tests.conftest import ROOT

BIN = Path(sys.executable).parent
KUBECTL = shutil.which("kubectl")
OVERLAYS = ["deploy/k8s/gateway/single", "deploy/k8s/gateway/ha"]
SCHEMAS = ["1.30.0", None]
"""The oldest Kubernetes the manifests need (the kubelet's own preStop sleep), and the newest
schema kubernetes-validate bundles."""

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed: it renders the kustomize overlays (kubectl kustomize)"
)


@functools.cache
def render(path: str) -> tuple[dict[str, Any], ...]:
    assert KUBECTL is not None
    result = subprocess.run([KUBECTL, "kustomize", str(ROOT / path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def objects(path: str) -> dict[str, dict[str, Any]]:
    """Rendered objects by ``Kind/name``; the generated ConfigMap under its name without the hash."""
    out = {}
    for d in render(path):
        name = d["metadata"]["name"]
        if d["kind"] == "ConfigMap" and name.startswith("enginegate-config-"):
            name = "enginegate-config"
        out[f"{d['kind']}/{name}"] = d
    return out


def gateway_pod(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = objects(path)["Deployment/enginegate"]["spec"]["template"]
    return pod, pod["spec"]["containers"][0]


def routing_yaml(path: str) -> str:
    return str(objects(path)["ConfigMap/enginegate-config"]["data"]["config.yaml"])


def config_of(path: str) -> dict[str, Any]:
    return dict(yaml.safe_load(routing_yaml(path)))


@pytest.mark.parametrize("version", SCHEMAS)
@pytest.mark.parametrize("path", [*OVERLAYS, "deploy/k8s/engines"])
def test_overlays_render_and_validate_strictly(path: str, version: str | None, tmp_path: Path) -> None:
    docs = render(path)
    # The ServiceMonitor is a CRD without a bundled schema: test_gateway_manifests_fit_together checks it.
    checked = [d for d in docs if d["apiVersion"] != "monitoring.coreos.com/v1"]
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(checked))
    command = [str(BIN / "kubernetes-validate"), "--strict", "--quiet", str(rendered)]
    if version is not None:
        command[1:1] = ["--kubernetes-version", version]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(d["metadata"]["namespace"] for d in docs)


@pytest.mark.parametrize("path", OVERLAYS)
def test_routing_yaml_in_the_configmap_passes_config_check(path: str, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(routing_yaml(path))
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "config", "check", str(config)],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    # and every backend URL names a Service of the engine base
    engines = {n.split("/")[1] for n in objects("deploy/k8s/engines") if n.startswith("Service/")}
    for backend in config_of(path)["backends"]:
        assert str(urlsplit(backend["url"]).hostname).split(".")[0] in engines, backend["name"]


def test_both_overlays_route_the_same_fleet() -> None:
    single, ha = (config_of(p) for p in OVERLAYS)
    for section in ("models", "backends"):
        assert single[section] == ha[section], section
    assert single["routing"]["rules"] == ha["routing"]["rules"]


@pytest.mark.parametrize("path", OVERLAYS)
def test_gateway_manifests_fit_together(path: str) -> None:
    objs = objects(path)
    service = objs["Service/enginegate"]
    pod, container = gateway_pod(path)
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == config_of(path)["server"]["port"]
    monitor = objs["ServiceMonitor/enginegate"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == objs["ConfigMap/enginegate-config"]["metadata"]["name"]
    assert container["args"][:2] == ["--config", "/etc/enginegate/config.yaml"]
    # One process per pod: admin.port needs it (the CLI refuses it with more workers).
    assert container["args"][container["args"].index("--workers") + 1] == "1"


@pytest.mark.parametrize("path", OVERLAYS)
def test_a_stopping_pod_drains_within_its_termination_grace(path: str) -> None:
    """The kubelet's SIGKILL comes terminationGracePeriodSeconds after the pod starts stopping, preStop
    included; the gateway needs drain_delay_s and shutdown_grace_s after SIGTERM, then SETTLE_S for the
    requests it ended to say so (gateway/drain.py), then the listener's last tick."""
    pod, container = gateway_pod(path)
    server = config_of(path)["server"]
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    needed = pre_stop + server["drain_delay_s"] + server["shutdown_grace_s"] + SETTLE_S + 0.1
    assert needed + 5 <= pod["spec"]["terminationGracePeriodSeconds"], needed
    # A load balancer must notice the pod leaving: some delay before the listener closes.
    assert pre_stop > 0 and server["drain_delay_s"] > 0


def service_host(url: str, objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The rendered Service a URL points at (same namespace), with the URL's port among its ports."""
    parts = urlsplit(url)
    service = objs[f"Service/{parts.hostname}"]
    assert parts.port in {p["port"] for p in service["spec"]["ports"]}, url
    return service


def test_ha_shares_limits_keys_and_prefix_homes_through_its_services() -> None:
    path = "deploy/k8s/gateway/ha"
    objs, config = objects(path), config_of(path)
    assert config["routing"]["prefix"]["share"] is True
    assert config["auth"]["database"].startswith("postgresql://")
    redis, postgres = service_host(config["redis"]["url"], objs), service_host(config["auth"]["database"], objs)
    for service in (redis, postgres):
        workload = objs[f"StatefulSet/{service['metadata']['name']}"]
        assert service["spec"]["selector"].items() <= workload["spec"]["template"]["metadata"]["labels"].items()
    # The database password reaches the gateway from the Secret the database uses, never the ConfigMap.
    _, container = gateway_pod(path)
    env = {e["name"]: e for e in container["env"]}
    database = objs["StatefulSet/enginegate-postgres"]["spec"]["template"]["spec"]["containers"][0]
    db_env = {e["name"]: e for e in database["env"]}
    assert env["PGPASSWORD"]["valueFrom"] == db_env["POSTGRES_PASSWORD"]["valueFrom"]
    assert urlsplit(config["auth"]["database"]).password is None
    # Only gateway pods may reach them.
    pod, _ = gateway_pod(path)
    for name in ("enginegate-redis", "enginegate-postgres"):
        policy = objs[f"NetworkPolicy/{name}"]["spec"]
        assert policy["podSelector"]["matchLabels"] == objs[f"Service/{name}"]["spec"]["selector"]
        allowed = policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
        assert allowed.items() <= pod["metadata"]["labels"].items()


def test_ha_serves_admin_apart_on_its_own_service() -> None:
    path = "deploy/k8s/gateway/ha"
    objs = objects(path)
    _, container = gateway_pod(path)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["admin"] == config_of(path)["admin"]["port"] != ports["http"]
    admin = objs["Service/enginegate-admin"]["spec"]
    assert [p["targetPort"] for p in admin["ports"]] == ["admin"]
    assert "admin" not in {p["targetPort"] for p in objs["Service/enginegate"]["spec"]["ports"]}


def test_ha_scales_spreads_and_survives_disruptions() -> None:
    objs = objects("deploy/k8s/gateway/ha")
    deployment = objs["Deployment/enginegate"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    hpa, pdb = objs["HorizontalPodAutoscaler/enginegate"]["spec"], objs["PodDisruptionBudget/enginegate"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "enginegate"}
    assert "replicas" not in deployment["spec"]  # the HPA's to set
    assert hpa["minReplicas"] >= 2
    # A voluntary disruption never takes every replica.
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["maxUnavailable"] < hpa["minReplicas"]
    # CPU utilisation is measured against the request: there must be one.
    assert hpa["metrics"][0]["resource"]["name"] == "cpu"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    assert all(c["labelSelector"]["matchLabels"].items() <= labels.items() for c in spread)


def test_single_runs_one_replica_and_nothing_else() -> None:
    objs = objects("deploy/k8s/gateway/single")
    assert objs["Deployment/enginegate"]["spec"]["replicas"] == 1
    assert not {n.split("/")[0] for n in objs} & {"StatefulSet", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
    config = config_of("deploy/k8s/gateway/single")
    assert "redis" not in config and "auth" not in config


def test_engine_deployments_request_gpus_where_they_need_them() -> None:
    gpus = {
        name.split("/")[1]: d["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"].get(
            "nvidia.com/gpu", 0
        )
        for name, d in objects("deploy/k8s/engines").items()
        if name.startswith("Deployment/")
    }
    assert gpus == {"vllm": 1, "vllm-70b": 4, "tgi": 1, "trtllm": 1, "llamacpp": 0}


def test_envoy_ai_gateway_recipe_sends_the_models_to_the_ha_gateway() -> None:
    """deploy/envoy-ai-gateway: its references resolve, it names the ha Service and its models, and
    its limits leave enginegate's own in charge (whole answers, whole bodies)."""
    edge = {f"{d['kind']}/{d['metadata']['name']}": d for d in render("deploy/envoy-ai-gateway")}
    ha, config = objects("deploy/k8s/gateway/ha"), config_of("deploy/k8s/gateway/ha")
    route = edge["AIGatewayRoute/enginegate"]["spec"]
    [rule] = route["rules"]
    models = {h["value"] for m in rule["matches"] for h in m["headers"] if h["name"] == "x-ai-eg-model"}
    assert models == {m["name"] for m in config["models"]}
    [ref] = rule["backendRefs"]
    backend = edge[f"AIServiceBackend/{ref['name']}"]["spec"]
    assert backend["schema"]["name"] == "OpenAI"
    [endpoint] = edge[f"Backend/{backend['backendRef']['name']}"]["spec"]["endpoints"]
    service = ha["Service/enginegate"]
    assert endpoint["fqdn"]["hostname"] == f"enginegate.{service['metadata']['namespace']}.svc.cluster.local"
    assert endpoint["fqdn"]["port"] in {p["port"] for p in service["spec"]["ports"]}
    policy = edge["BackendSecurityPolicy/enginegate-key"]["spec"]
    assert policy["targetRefs"][0]["name"] == ref["name"] and config["auth"]["required"]
    # Envoy must not end an answer enginegate still allows (routing.answer_timeout_s, default 600 s)...
    answer_s = config["routing"].get("answer_timeout_s", 600)
    assert float(rule["timeouts"]["request"].removesuffix("s")) > answer_s
    # ...nor refuse a body enginegate takes (limits.max_body_bytes, default 4 MiB).
    buffer = edge["ClientTrafficPolicy/enginegate-edge"]["spec"]["connection"]["bufferLimit"]
    assert int(buffer.removesuffix("Mi")) * 2**20 >= config.get("limits", {}).get("max_body_bytes", 4 * 2**20)
    # The per-user token limits read a cost the route records.
    costs = {c["metadataKey"] for c in route["llmRequestCosts"]}
    rules = edge["BackendTrafficPolicy/enginegate-edge-token-limits"]["spec"]["rateLimit"]["global"]["rules"]
    assert {r["cost"]["response"]["metadata"]["key"] for r in rules} <= costs
