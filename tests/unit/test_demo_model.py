"""The demo model's derived artefacts agree with llama.cpp, the reference that loads the GGUF itself."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tokenizers import Tokenizer

from backends.ct2_convert import TOKENIZER_FILE, derive
from backends.gguf_file import GgufError, read_gguf
from tests.conftest import DEMO_GGUF

if TYPE_CHECKING:
    from llama_cpp import Llama


@pytest.fixture(scope="module")
def llama() -> Llama:
    from llama_cpp import Llama  # built by `make engines`

    return Llama(str(DEMO_GGUF), n_ctx=512, n_threads=1, verbose=False)


def samples() -> list[str]:
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyz ABCXYZ.,!?\n\t-'é日😀"
    fixed = [
        "Hello world",
        "  two  spaces ",
        "naïve café ☃",
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "Beautiful is better than ugly.\nExplicit is better than implicit.",
        "a<|im_end|>b </s> <s>x",
        "",
    ]
    return fixed + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 50))) for _ in range(300)]


def test_tokenizer_json_ids_match_llama_cpp(tmp_path: Path, llama: Llama) -> None:
    model_dir, _ = derive(DEMO_GGUF, tmp_path)
    tok = Tokenizer.from_file(str(model_dir / TOKENIZER_FILE))
    for text in samples():
        assert tok.encode(text, add_special_tokens=False).ids == llama.tokenize(
            text.encode(), add_bos=False, special=True
        ), text


def test_demo_model_is_small_and_llama_shaped() -> None:
    model = read_gguf(DEMO_GGUF)
    assert DEMO_GGUF.stat().st_size < 1_000_000
    assert (model.n_layers, model.dim, model.n_heads) == (2, 64, 4)
    assert model.vocab.tokens[model.vocab.eot_id or 0] == "<|im_end|>"
    assert not model.vocab.add_bos and not model.vocab.add_space_prefix


def test_derived_model_is_cached_by_content(tmp_path: Path) -> None:
    first, _ = derive(DEMO_GGUF, tmp_path)
    mtime = (first / "model.bin").stat().st_mtime_ns
    second, _ = derive(DEMO_GGUF, tmp_path)
    assert first == second and (second / "model.bin").stat().st_mtime_ns == mtime
    copy = tmp_path / "other.gguf"
    copy.write_bytes(DEMO_GGUF.read_bytes()[:-4] + b"\0\0\0\0")
    third, _ = derive(copy, tmp_path)
    assert third != first


def test_non_gguf_file_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "x.gguf"
    bogus.write_bytes(b"not a model")
    with pytest.raises(GgufError, match="cannot read GGUF"):
        read_gguf(bogus)


def test_routing_counts_demo_prompts_exactly(tmp_path: Path) -> None:
    from backends.base import GenerationRequest
    from gateway.fleet.catalog import PromptCounter

    counter = PromptCounter(DEMO_GGUF)
    chat = GenerationRequest("r", "m", messages=[{"role": "user", "content": "Hello"}])
    assert counter.count(chat) == 16  # what every engine reports as prompt_tokens for this chat
    assert counter.count(GenerationRequest("r", "m", prompt="The Zen of Python")) == len(
        Tokenizer.from_file(str(derive(DEMO_GGUF, tmp_path)[0] / TOKENIZER_FILE)).encode("The Zen of Python").ids
    )
