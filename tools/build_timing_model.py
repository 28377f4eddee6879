"""Write the timing model: a llama-shaped GGUF with random weights whose prefill and decode cost what a
real model of its size costs, for routing tests and benchmarks on real engines.

    python tools/build_timing_model.py                 # builds it (once) and prints its path
    python tools/build_timing_model.py --layers 4 OUT  # another shape, to a given file

The demo model (``models/enginegate-demo.gguf``) prefills tens of thousands of tokens a second: a cache
hit saves milliseconds there, so no routing decision about prefix caches can be measured on it. This
one has the demo model's tokenizer and chat template (so prompts render and tokenize the same) and a
realistic shape (width 1024, 12 layers, grouped-query attention with 4 KV heads, SwiGLU; 137 M
parameters in f16, 274 MB), with weights drawn from numpy's seeded PCG64 generator: the same
bytes on every machine, nothing downloaded, never committed. Its answers are noise; its prefill,
decode and prompt-cache behaviour are real (measured: llama-server prefills it at about 155 tokens a
second and decodes 18 a second on one thread of the two-core development machine, so a 1,000-token
prompt it must prefill costs six seconds and one it finds cached a fraction of one).

Built on demand into the cache (``$XDG_CACHE_HOME/enginegate/``, ``~/.cache`` by default), named by a
hash of its shape and this builder's version, so a changed shape builds a new file and the old one is
never read by mistake. Written by hand on ``gguf``'s writer: no library makes a random-weight GGUF,
and a torch model would only be a detour for numbers drawn from a generator.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "models" / "enginegate-demo.gguf"
VERSION = 1
"""Bumped when the file this writes for a shape changes."""


@dataclass(frozen=True)
class Shape:
    dim: int = 1024
    layers: int = 12
    heads: int = 16
    kv_heads: int = 4
    ffn: int = 2816
    context: int = 8192
    seed: int = 0

    def params(self, vocab: int) -> int:
        head = self.dim // self.heads
        attn = 2 * self.dim * self.dim + 2 * self.dim * head * self.kv_heads
        return self.layers * (attn + 3 * self.dim * self.ffn + 2 * self.dim) + 2 * vocab * self.dim + self.dim


def cached_path(shape: Shape) -> Path:
    key = hashlib.sha256(repr((VERSION, sorted(asdict(shape).items()))).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "enginegate"
    return cache / f"timing-model-{key}.gguf"


def _tokenizer() -> dict[str, object]:
    """The demo model's vocabulary, ids and chat template, as its GGUF holds them."""
    fields = gguf.GGUFReader(str(DEMO)).fields
    return {name: fields[name].contents() for name in fields if name.startswith("tokenizer.")}


def _write(path: Path, shape: Shape) -> None:
    tok = _tokenizer()
    tokens = tok["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list)
    rng = np.random.Generator(np.random.PCG64(shape.seed))
    head = shape.dim // shape.heads

    def weight(rows: int, cols: int) -> np.ndarray:
        # Scaled so activations stay of order one through the layers (and the logits finite).
        drawn: np.ndarray = (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)
        return drawn

    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("enginegate-timing")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.dim)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_dimension_count(head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model(str(tok["tokenizer.ggml.model"]))
    w.add_token_list(tokens)
    w.add_token_scores(tok["tokenizer.ggml.scores"])  # type: ignore[arg-type]
    w.add_token_types(tok["tokenizer.ggml.token_type"])  # type: ignore[arg-type]
    w.add_unk_token_id(int(tok["tokenizer.ggml.unknown_token_id"]))  # type: ignore[call-overload]
    w.add_bos_token_id(int(tok["tokenizer.ggml.bos_token_id"]))  # type: ignore[call-overload]
    w.add_eos_token_id(int(tok["tokenizer.ggml.eos_token_id"]))  # type: ignore[call-overload]
    w.add_eot_token_id(int(tok["tokenizer.ggml.eot_token_id"]))  # type: ignore[call-overload]
    w.add_add_bos_token(bool(tok["tokenizer.ggml.add_bos_token"]))
    w.add_add_space_prefix(bool(tok["tokenizer.ggml.add_space_prefix"]))
    w.add_chat_template(str(tok["tokenizer.chat_template"]))
    ones = np.ones(shape.dim, dtype=np.float32)  # norms stay f32, as converters write them
    w.add_tensor("token_embd.weight", weight(len(tokens), shape.dim))
    for i in range(shape.layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.attn_q.weight", weight(shape.dim, shape.dim))
        w.add_tensor(f"blk.{i}.attn_k.weight", weight(head * shape.kv_heads, shape.dim))
        w.add_tensor(f"blk.{i}.attn_v.weight", weight(head * shape.kv_heads, shape.dim))
        w.add_tensor(f"blk.{i}.attn_output.weight", weight(shape.dim, shape.dim))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(shape.ffn, shape.dim))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(shape.ffn, shape.dim))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(shape.dim, shape.ffn))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", weight(len(tokens), shape.dim))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)  # whole or not at all: a build cut short never leaves a file that looks done


def timing_model(shape: Shape = Shape(), path: Path | None = None) -> Path:
    """The timing model's file, built first if it is not there yet."""
    path = path or cached_path(shape)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, shape)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("output", nargs="?", type=Path, help="default: the cache, named by the shape")
    for name, default in asdict(Shape()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default, help=f"default {default}")
    args = parser.parse_args()
    shape = Shape(**{name: getattr(args, name) for name in asdict(Shape())})
    path = timing_model(shape, args.output)
    vocab = len(_tokenizer()["tokenizer.ggml.tokens"])  # type: ignore[arg-type]
    print(f"{path} ({path.stat().st_size / 1e6:.0f} MB, {shape.params(vocab) / 1e6:.0f} M parameters)", file=sys.stderr)
    print(path)


if __name__ == "__main__":
    main()
