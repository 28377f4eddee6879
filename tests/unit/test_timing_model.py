"""The timing model's builder (tools/build_timing_model.py): a deterministic file of the shape asked,
with the demo model's tokenizer, that the project's own GGUF reader loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.gguf_file import GgufCache, file_sha256, read_gguf
from tests.conftest import DEMO_GGUF
from tools.build_timing_model import Shape, cached_path, timing_model

SMALL = Shape(dim=64, layers=2, heads=4, kv_heads=2, ffn=128, context=2048)


def test_the_same_shape_writes_the_same_bytes_and_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = timing_model(SMALL)
    assert built == cached_path(SMALL) and built.is_relative_to(tmp_path)
    again = timing_model(SMALL, tmp_path / "again.gguf")
    assert file_sha256(built) == file_sha256(again)
    other = timing_model(Shape(**{**SMALL.__dict__, "seed": 1}))
    assert other != built and file_sha256(other) != file_sha256(built)
    model = read_gguf(built, with_tensors=False)
    assert (model.context_length, model.n_layers, model.n_heads_kv, model.dim) == (2048, 2, 2, 64)
    cache = GgufCache()
    text = "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"
    assert cache.tokenizer(built).encode(text).ids == cache.tokenizer(DEMO_GGUF).encode(text).ids
