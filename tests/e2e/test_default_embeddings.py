"""``make serve``'s embedded default answers ``/v1/embeddings`` (the official client, float and base64)
with the demo model's own token embeddings, mean-pooled: the vectors computed here from the GGUF."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from backends.gguf_file import GgufCache, read_gguf
from backends.hf_tokenizer import encode
from tests.conftest import DEMO_GGUF, ROOT, GatewayProcess


@pytest.fixture(scope="module")
def default_gateway(cache_dir: Path) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(ROOT / "configs" / "default.yaml", cache_dir)
    yield proc
    proc.stop()


def expected(text: str) -> np.ndarray:
    ggufs = GgufCache()
    table = read_gguf(DEMO_GGUF).tensors["token_embd.weight"]
    table = table.reshape(len(ggufs.header(DEMO_GGUF).vocab.tokens), -1)
    mean = table[encode(ggufs.tokenizer(DEMO_GGUF), text).ids].mean(axis=0, dtype=np.float64)
    out: np.ndarray = mean / np.linalg.norm(mean)
    return out


def test_the_embedded_default_embeds(default_gateway: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=f"{default_gateway.base_url}/v1", api_key="unused", max_retries=0)
    texts = ["Hello", "Beautiful is better than ugly."]
    resp = client.embeddings.create(model="enginegate-demo-embed", input=texts)
    assert [d.index for d in resp.data] == [0, 1]
    for d, text in zip(resp.data, texts, strict=True):
        assert np.allclose(d.embedding, expected(text), atol=1e-6)
    assert resp.usage.prompt_tokens > 2
    raw = client.embeddings.with_raw_response.create(
        model="enginegate-demo-embed", input="Hello", encoding_format="base64"
    ).parse()
    packed = base64.b64decode(raw.data[0].embedding)  # type: ignore[arg-type]
    floats = struct.unpack(f"<{len(packed) // 4}f", packed)
    assert np.allclose(floats, expected("Hello"), atol=1e-6)
    with pytest.raises(openai.BadRequestError) as info:  # text goes only to generating models
        client.chat.completions.create(model="enginegate-demo-embed", messages=[{"role": "user", "content": "hi"}])
    assert info.value.param == "model"
