"""What-if over the log ``enginegate serve`` really writes: a gateway process on two fake vLLM engines
takes chat requests through the official ``openai`` client, and ``enginegate config diff --replay`` on its
captured output (stdout and stderr together, as an operator pipes it) finds every request, moves the
ones that went to a removed backend, and never saw a prompt (issue 25, item 2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.cli import main
from tests.conftest import GatewayProcess, write_config
from tests.contract import fake_vllm
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread

SECRET = "the-prompt-that-must-never-be-logged"
CONFIG = """
models: [{name: enginegate-demo, gguf: "{GGUF}"}]
backends:
  - {name: vllm-a, engine: vllm, url: "%s", model: enginegate-demo, gpu: H100, cost_per_hour: 4.0}
  - {name: vllm-b, engine: vllm, url: "%s", model: enginegate-demo, gpu: H100, cost_per_hour: 4.0}
"""


@pytest.fixture(scope="module")
def engines(cache_dir: Path) -> Iterator[tuple[str, str]]:
    engine = TinyEngine(cache_dir)
    with ExitStack() as stack:
        a, b = (stack.enter_context(serve_in_thread(fake_vllm.create_app(engine), "/health")) for _ in range(2))
        yield a, b


def test_config_diff_replays_what_serve_logged(
    tmp_path: Path, cache_dir: Path, engines: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    old = write_config(tmp_path / "running.yaml", CONFIG % engines)
    gateway = GatewayProcess(old, cache_dir)
    try:
        client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)
        for i in range(12):
            client.chat.completions.create(
                model="enginegate-demo", max_tokens=4,
                messages=[{"role": "user", "content": f"{SECRET} {i} " + "word " * (10 * i)}],
                extra_headers={"x-ttft-budget-ms": "2000", "x-tenant": "acme"} if i % 2 else {},
            )  # fmt: skip
    finally:
        gateway.stop()
    log = gateway.log.read_text()
    assert SECRET not in log
    served = [json.loads(line) for line in log.splitlines() if '"msg":"request"' in line.replace(" ", "")]
    assert len(served) == 12
    new = write_config(tmp_path / "new.yaml", (CONFIG % engines).split("  - {name: vllm-b")[0])
    assert main(["config", "diff", str(old), str(new), "--replay", str(gateway.log), "--json", "--load", "1"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert [(c["kind"], c["path"]) for c in doc["diff"]] == [("removed", "backends[vllm-b]")]
    moves = doc["moves"]
    assert moves["requests"] == 12
    assert all(m["to"] == "vllm-a" for m in moves["from_to"])  # one backend left: everything goes there
    # The replay ranks on an idle fleet (the live gateway ranked on its own load and prompt affinity): each
    # request the replay places on vllm-b under the old config moves, and no other.
    assert moves["moved"] == sum(m["count"] for m in moves["from_to"] if m["from"] == "vllm-b")
    assert {(row["config"], row["scale"]) for row in doc["table"]} == {("old", 1.0), ("new", 1.0)}
    assert [row["gpu_usd_per_hour"] for row in doc["table"]] == [8.0, 4.0]
    tenants = [entry.get("tenant") for entry in served]
    assert tenants.count("acme") == 6 and all(entry["est_prompt_tokens"] > 0 for entry in served)


def test_the_admin_diff_takes_a_config_file_as_yaml_through_the_real_server(
    tmp_path: Path, cache_dir: Path, engines: tuple[str, str]
) -> None:
    """The connection layer refuses bodies that are not JSON before any app code runs; the what-if
    route takes a config as the YAML file it is (``curl --data-binary @new.yaml``), and only it does."""
    text = CONFIG % engines + "admin: {api_key_env: EG_WHATIF_ADMIN}\n"
    gateway = GatewayProcess(write_config(tmp_path / "running.yaml", text), cache_dir, env={"EG_WHATIF_ADMIN": "k"})
    try:
        smaller = write_config(tmp_path / "new.yaml", text.replace(text.split("\n")[4] + "\n", "")).read_text()
        auth = {"authorization": "Bearer k"}
        for ctype in ("application/yaml", "text/yaml"):
            resp = httpx.post(f"{gateway.base_url}/admin/config/diff", content=smaller,
                              headers={**auth, "content-type": ctype}, timeout=60)  # fmt: skip
            assert resp.status_code == 200, resp.text
            assert [(c["kind"], c["path"]) for c in resp.json()["diff"]] == [("removed", "backends[vllm-b]")]
        elsewhere = httpx.post(f"{gateway.base_url}/admin/reload", content=smaller,
                               headers={**auth, "content-type": "application/yaml"}, timeout=60)  # fmt: skip
        assert elsewhere.status_code == 415, elsewhere.text
    finally:
        gateway.stop()
