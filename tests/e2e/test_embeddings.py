"""``/v1/embeddings`` through a real gateway process, read by the official ``openai`` client, on real
engines: llama.cpp in process (``embedding=True``), ``llama-server --embeddings`` and vLLM serving a
pooling model. Vectors, float
and base64, are compared with the engine's own; token arrays, Matryoshka ``dimensions``, the model
kinds kept apart, failover before the answer, and the route's own metrics."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import DEMO_GGUF, GatewayProcess, free_port, write_config

pytestmark = pytest.mark.engines  # llama.cpp in process and llama-server

TEXTS = ["Hello world", "Beautiful is better than ugly.", "Explicit is better than implicit."]


@pytest.fixture(scope="module")
def llama_embed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.contract.engines import llama_server

    with llama_server(tmp_path_factory.mktemp("llama-embed"), "--embeddings", "--pooling", "mean") as url:
        yield url


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, llama_embed_server: str) -> Iterator[GatewayProcess]:
    config = write_config(
        tmp_path_factory.mktemp("embeddings") / "fleet.yaml",
        f"""
models:
  - {{name: enginegate-demo, gguf: "{{GGUF}}"}}
  - {{name: demo-embed, gguf: "{{GGUF}}", kind: embed, matryoshka: true}}
  - {{name: server-embed, gguf: "{{GGUF}}", kind: embed}}
  - {{name: failover-embed, gguf: "{{GGUF}}", kind: embed}}
backends:
  - {{name: ct2, engine: ctranslate2, model: enginegate-demo}}
  - {{name: llama-embed, engine: llama_cpp, model: demo-embed}}
  - {{name: server, engine: llama_server, url: "{llama_embed_server}", model: server-embed,
      served_model: enginegate-demo}}
  - {{name: dead, engine: llama_server, url: "http://127.0.0.1:9", model: failover-embed,
      served_model: enginegate-demo, cost_per_hour: 0}}
  - {{name: alive, engine: llama_server, url: "{llama_embed_server}", model: failover-embed,
      served_model: enginegate-demo, cost_per_hour: 100}}
""",
    )
    proc = GatewayProcess(config, cache_dir)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def close(a: list[float], b: list[float], tol: float = 1e-6) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


def from_base64(text: str) -> list[float]:
    raw = base64.b64decode(text)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def test_in_process_llama_vectors_are_the_engines_own_float_and_base64(client: openai.OpenAI) -> None:
    import llama_cpp

    engine = llama_cpp.Llama(
        str(DEMO_GGUF), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_ctx=512, verbose=False
    )
    own = engine.embed(TEXTS, normalize=True)
    tokens = sum(len(engine.tokenize(t.encode())) for t in TEXTS)
    resp = client.embeddings.create(model="demo-embed", input=TEXTS, encoding_format="float")
    assert [d.index for d in resp.data] == [0, 1, 2]
    assert all(close(d.embedding, v) for d, v in zip(resp.data, own, strict=True))
    assert resp.usage.prompt_tokens == tokens == resp.usage.total_tokens
    # Without a format the client asks for base64 itself and decodes it; float32 keeps 1e-7 of a unit vector.
    decoded = client.embeddings.create(model="demo-embed", input=TEXTS)
    assert all(close(d.embedding, v) for d, v in zip(decoded.data, own, strict=True))
    b64 = client.embeddings.create(model="demo-embed", input=TEXTS, encoding_format="base64")
    raw: list[str] = [d.embedding for d in b64.data]  # type: ignore[misc]
    assert all(close(from_base64(text), v) for text, v in zip(raw, own, strict=True))
    ids = engine.tokenize(TEXTS[1].encode())
    by_ids = client.embeddings.create(model="demo-embed", input=[ids, ids[:3]])
    assert close(by_ids.data[0].embedding, own[1]) and by_ids.usage.prompt_tokens == len(ids) + 3


def test_llama_server_vectors_are_the_engines_own(client: openai.OpenAI, llama_embed_server: str) -> None:
    own = httpx.post(f"{llama_embed_server}/v1/embeddings", json={"model": "enginegate-demo", "input": TEXTS}).json()
    resp = client.embeddings.create(model="server-embed", input=TEXTS)
    vectors = [d["embedding"] for d in sorted(own["data"], key=lambda d: d["index"])]
    assert all(close(d.embedding, v) for d, v in zip(resp.data, vectors, strict=True))
    assert resp.usage.prompt_tokens == own["usage"]["prompt_tokens"]


def test_matryoshka_dimensions_cut_and_renormalize_else_refused(client: openai.OpenAI) -> None:
    full = client.embeddings.create(model="demo-embed", input=TEXTS[0]).data[0].embedding
    cut = client.embeddings.create(model="demo-embed", input=TEXTS[0], dimensions=8).data[0].embedding
    norm = math.sqrt(sum(x * x for x in full[:8]))
    assert close(cut, [x / norm for x in full[:8]])
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="server-embed", input=TEXTS[0], dimensions=8)
    assert info.value.param == "dimensions"


def test_each_kind_of_model_answers_only_its_kind_of_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as generating:
        client.embeddings.create(model="enginegate-demo", input="Hello")
    assert generating.value.param == "model" and generating.value.code == "model_not_embedding"
    with pytest.raises(openai.BadRequestError) as embedding:
        client.chat.completions.create(model="demo-embed", messages=[{"role": "user", "content": "Hello"}])
    assert embedding.value.param == "model" and "embedding model" in embedding.value.message
    with pytest.raises(openai.BadRequestError) as empty:
        client.embeddings.create(model="demo-embed", input=[])
    assert empty.value.param == "input"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="Hello")


def test_a_dead_backend_fails_over_before_the_answer(gw: GatewayProcess) -> None:
    r = httpx.post(f"{gw.base_url}/v1/embeddings", json={"model": "failover-embed", "input": "Hello"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-enginegate-backend"] == "alive" and len(r.json()["data"][0]["embedding"]) == 64
    metrics = httpx.get(f"{gw.base_url}/metrics").text
    assert any(
        line.startswith("enginegate_requests_total{")
        and 'route="embeddings"' in line
        and 'backend="alive"' in line
        and 'code="2xx"' in line
        for line in metrics.splitlines()
    )


@contextmanager
def vllm_pooling(workdir: Path) -> Iterator[str]:
    """vLLM serving the demo model as an embedding (pooling) model."""
    from tests.contract.engines import SERVED, VLLM_PYTHON, _process, _require
    from tools.gguf_to_hf import export

    _require(VLLM_PYTHON, "tools/install_vllm.sh .venv-vllm")
    model_dir = export(DEMO_GGUF, workdir / "hf-demo", head_dim=32)
    port = free_port()
    cmd = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", SERVED, "--enforce-eager", "--dtype", "float32",
        "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "8", "--runner", "pooling", "--convert", "embed",
    ]  # fmt: skip
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    with _process(cmd, workdir / "vllm.log", f"http://127.0.0.1:{port}", "/health", 600, env) as base:
        yield base


def test_vllm_pooling_vectors_are_the_engines_own(tmp_path: Path, cache_dir: Path) -> None:
    with vllm_pooling(tmp_path) as url:
        own = httpx.post(f"{url}/v1/embeddings", json={"model": "enginegate-demo", "input": TEXTS}, timeout=60).json()
        config = write_config(
            tmp_path / "fleet.yaml",
            f"""
models: [{{name: vllm-embed, gguf: "{{GGUF}}", kind: embed}}]
backends: [{{name: vllm, engine: vllm, url: "{url}", model: vllm-embed, served_model: enginegate-demo}}]
""",
        )
        gw = GatewayProcess(config, cache_dir)
        try:
            client = openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
            resp = client.embeddings.create(model="vllm-embed", input=TEXTS, encoding_format="float")
            b64 = client.embeddings.create(model="vllm-embed", input=TEXTS)  # the client's base64, decoded
        finally:
            gw.stop()
    vectors = [d["embedding"] for d in sorted(own["data"], key=lambda d: d["index"])]
    assert all(close(d.embedding, v) for d, v in zip(resp.data, vectors, strict=True))
    assert all(close(d.embedding, v) for d, v in zip(b64.data, vectors, strict=True))
    assert resp.usage.prompt_tokens == own["usage"]["prompt_tokens"]
