"""The gateway's own OpenAPI document, from a real gateway process: valid OpenAPI 3.1, every route
listed with its request and response models, real answers matching the documented schemas, docs off
by default (and served without a CDN when on), and schemathesis fuzzing every operation from the
document: no 5xx, no hang, answers that match their schemas, in bounded time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate

from gateway.app import create_app
from gateway.config import load_config
from tests.conftest import GatewayProcess, write_config
from tests.fakes import ScriptedBackend, factory, serve_in_thread

FLEET = """
limits: {max_tokens: 16}
models:
  - {name: enginegate-demo, gguf: "{GGUF}"}
backends:
  - {name: ct2, engine: ctranslate2, model: enginegate-demo}
"""
# What docs/api.md promises; the document may list more, never less.
ROUTES = {
    ("post", "/v1/chat/completions"),
    ("post", "/v1/completions"),
    ("post", "/v1/responses"),
    ("post", "/admin/config/diff"),
    ("post", "/v1/messages"),
    ("post", "/v1/messages/count_tokens"),
    ("post", "/v1/embeddings"),
    ("get", "/v1/models"),
    ("get", "/v1/models/{model}"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("post", "/admin/reload"),
    ("post", "/admin/route/explain"),
    ("get", "/admin/fleet"),
    ("get", "/admin/splits"),
    ("get", "/admin/decisions"),
    ("post", "/admin/keys"),
    ("get", "/admin/keys"),
    ("get", "/admin/keys/{key_id}"),
    ("patch", "/admin/keys/{key_id}"),
    ("delete", "/admin/keys/{key_id}"),
    ("get", "/admin/keys/{key_id}/usage"),
}
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(write_config(tmp_path_factory.mktemp("openapi") / "fleet.yaml", FLEET), cache_dir)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def doc(gw: GatewayProcess) -> dict[str, Any]:
    r = httpx.get(f"{gw.base_url}/openapi.json", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    out: dict[str, Any] = r.json()
    return out


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1")
    validate(doc)  # raises on any violation of the OpenAPI 3.1 schema, dangling $refs included


def test_every_route_is_listed_with_its_models(doc: dict[str, Any], tmp_path: Path) -> None:
    listed = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert listed >= ROUTES
    for method, path in listed:
        op = doc["paths"][path][method]
        ok = op["responses"][str(201 if (method, path) == ("post", "/admin/keys") else 200)]
        content = ok["content"]
        assert "application/json" in content or path == "/metrics", (method, path)
        if "application/json" in content:
            assert content["application/json"]["schema"], (method, path)
        assert "$ref" in op["responses"]["default"]["content"]["application/json"]["schema"]
        if method in ("post", "patch") and path != "/admin/reload":
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.split("/")[-1] in doc["components"]["schemas"], (method, path)
        for name in re.findall(r"{(\w+)}", path):
            assert any(p["name"] == name and p["in"] == "path" for p in op["parameters"])
    streams = [p for p, ops in doc["paths"].items() if "text/event-stream" in str(ops)]
    assert sorted(streams) == ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"]
    # Every route the app serves is in the document (a route added without a model would be missing).
    fake = ScriptedBackend("ct2", "enginegate-demo")
    app: Any = create_app(load_config(write_config(tmp_path / "c.yaml", FLEET)), factory({"ct2": fake}))
    served = {
        (method.lower(), route.path_format)
        for route in app.app.routes
        for method in (getattr(route, "methods", None) or ())
        if method != "HEAD" and getattr(route, "include_in_schema", True) and route.path_format != "/openapi.json"
    }
    assert served == listed


def _check(doc: dict[str, Any], path: str, method: str, status: int, answer: Any) -> None:
    responses = doc["paths"][path][method]["responses"]
    schema = (responses.get(str(status)) or responses["default"])["content"]["application/json"]["schema"]
    jsonschema.validate(answer, {**schema, "components": doc["components"]})


def test_real_answers_match_the_documented_schemas(gw: GatewayProcess, doc: dict[str, Any]) -> None:
    base = gw.base_url
    calls: list[tuple[str, str, dict[str, Any] | None, int]] = [
        ("/v1/chat/completions", "post", {"model": "enginegate-demo", "messages": HELLO, "max_tokens": 4}, 200),
        ("/v1/completions", "post", {"model": "enginegate-demo", "prompt": "Hi", "max_tokens": 4}, 200),
        ("/v1/responses", "post", {"model": "enginegate-demo", "input": "Hello", "max_output_tokens": 4}, 200),
        ("/v1/messages", "post", {"model": "enginegate-demo", "messages": HELLO, "max_tokens": 4}, 200),
        ("/v1/messages", "post", {"model": "enginegate-demo", "messages": HELLO}, 400),
        ("/v1/responses", "post", {"model": "nope", "input": "Hello"}, 404),
        ("/v1/models", "get", None, 200),
        ("/v1/models/{model}", "get", None, 200),
        ("/healthz", "get", None, 200),
        ("/readyz", "get", None, 200),
        ("/admin/fleet", "get", None, 403),
    ]
    for path, method, body, status in calls:
        url = base + path.replace("{model}", "enginegate-demo")
        r = httpx.request(method, url, json=body, timeout=30)
        assert r.status_code == status, (path, r.text)
        _check(doc, path, method, status, r.json())
    assert httpx.get(f"{base}/metrics").headers["content-type"].startswith("text/plain")


def test_docs_are_off_by_default_and_never_load_from_the_internet(gw: GatewayProcess, tmp_path: Path) -> None:
    assert httpx.get(f"{gw.base_url}/docs").status_code == 404
    config = write_config(
        tmp_path / "docs.yaml",
        """
server: {docs: true}
models: [{name: m}]
backends: [{name: a, engine: vllm, model: m, url: "http://127.0.0.1:9"}]
""",
    )
    with serve_in_thread(create_app(load_config(config), factory({"a": ScriptedBackend("a", "m")}))) as base:
        page = httpx.get(f"{base}/docs")
        assert page.status_code == 200 and "swagger" in page.text.lower()
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: ?'([^']+)'""", page.text)
        assets = [u for pair in urls for u in pair if u]
        assert assets and all(u.startswith("/") for u in assets), assets  # nothing from another host
        for asset in assets:
            assert httpx.get(base + asset).status_code == 200, asset


def _fuzz(gw: GatewayProcess, tmp_path: Path, schema: str, *extra: str) -> str:
    """schemathesis from ``schema`` against ``gw``: the run's output; fails on any failed check."""
    checks = "not_a_server_error,response_schema_conformance,content_type_conformance"
    cmd = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        schema,
        f"--url={gw.base_url}",
        f"--checks={checks}",
        "--max-examples=25",
        "--max-time=60",  # the run's whole budget
        "--request-timeout=10",  # a hang is a failure
        "--seed=1",
        "--workers=1",
        "--phases=coverage,fuzzing",
        "--no-color",
        *extra,
    ]
    run = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240, env={**os.environ, "NO_COLOR": "1"}
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    generated = re.search(r"(\d+) generated, (\d+) passed", out)
    assert generated is not None and int(generated[1]) >= 500 and generated[1] == generated[2], out[-3000:]
    assert gw.alive() and httpx.get(f"{gw.base_url}/readyz").status_code == 200
    return out


def test_fuzzing_from_the_document_finds_no_server_error_and_no_hang(gw: GatewayProcess, tmp_path: Path) -> None:
    _fuzz(gw, tmp_path, f"{gw.base_url}/openapi.json")


def test_fuzzing_real_generations_finds_no_server_error(
    gw: GatewayProcess, doc: dict[str, Any], tmp_path: Path
) -> None:
    """The same, with every body naming the served model: generation runs with fuzzed parameters."""
    real = json.loads(json.dumps(doc))
    for name in ("ChatBody", "CompletionBody", "ResponsesBody", "MessagesBody"):
        real["components"]["schemas"][name]["properties"]["model"] = {"const": "enginegate-demo"}
    path = tmp_path / "real.json"
    path.write_text(json.dumps(real))
    _fuzz(gw, tmp_path, str(path), "--include-path-regex=^/v1/")
