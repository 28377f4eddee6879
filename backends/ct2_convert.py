"""Derive a CTranslate2 model directory (and tokenizer.json) from a llama GGUF file.

The GGUF stores q and k in llama.cpp's rotary layout (adjacent pairs), which is
CTranslate2's ``rotary_interleave=True``: weights are copied as they are.
Derived files are cached under the GGUF's content hash, so a changed file is
re-derived and an unchanged one costs a hash (once per file, with a ``GgufCache``)
and a directory lookup: its tensors are read only when it converts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from backends.gguf_file import GgufCache, GgufModel, read_gguf

TOKENIZER_FILE = "tokenizer.json"


def _spec(model: GgufModel):  # type: ignore[no-untyped-def]
    from ctranslate2.specs import common_spec, transformer_spec

    spec = transformer_spec.TransformerDecoderModelSpec.from_config(
        model.n_layers,
        model.n_heads,
        activation=common_spec.Activation.SWISH,
        pre_norm=True,
        ffn_glu=True,
        rms_norm=True,
        rotary_dim=0,
        rotary_interleave=True,
        rotary_base=model.rope_base,
        num_heads_kv=model.n_heads_kv if model.n_heads_kv != model.n_heads else None,
    )
    t = model.tensors
    dec = spec.decoder
    dec.scale_embeddings = False
    dec.embeddings.weight = t["token_embd.weight"]
    dec.layer_norm.gamma = t["output_norm.weight"]
    dec.projection.weight = t.get("output.weight", t["token_embd.weight"])
    for i, layer in enumerate(dec.layer):
        p = f"blk.{i}."
        layer.self_attention.layer_norm.gamma = t[p + "attn_norm.weight"]
        layer.self_attention.linear[0].weight = np.concatenate(
            [t[p + "attn_q.weight"], t[p + "attn_k.weight"], t[p + "attn_v.weight"]]
        )
        layer.self_attention.linear[1].weight = t[p + "attn_output.weight"]
        layer.ffn.layer_norm.gamma = t[p + "ffn_norm.weight"]
        layer.ffn.linear_0.weight = t[p + "ffn_gate.weight"]
        layer.ffn.linear_0_noact.weight = t[p + "ffn_up.weight"]
        layer.ffn.linear_1.weight = t[p + "ffn_down.weight"]
    v = model.vocab
    spec.register_vocabulary(v.tokens)
    spec.config.bos_token = v.tokens[v.bos_id] if v.bos_id is not None else "<s>"
    spec.config.eos_token = v.tokens[v.eos_id] if v.eos_id is not None else "</s>"
    spec.config.unk_token = v.tokens[v.unk_id] if v.unk_id is not None else ""
    spec.config.layer_norm_epsilon = model.rms_eps
    return spec


def derive(gguf_path: str | Path, cache_dir: str | Path, ggufs: GgufCache | None = None) -> tuple[Path, GgufModel]:
    """Return (directory with model.bin, config and tokenizer.json, the GGUF's header without tensors).
    Blocking: run it off the event loop."""
    ggufs = ggufs or GgufCache()
    target = Path(cache_dir) / f"ct2-{ggufs.sha256(gguf_path)[:16]}"
    header = ggufs.header(gguf_path)
    if (target / "model.bin").is_file() and (target / TOKENIZER_FILE).is_file():
        return target, header
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent starters never see half a model.
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model = read_gguf(gguf_path)
        spec = _spec(model)
        spec.validate()
        spec.optimize(quantization=None)
        spec.save(str(tmp))
        ggufs.tokenizer(gguf_path).save(str(tmp / TOKENIZER_FILE))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "model.bin").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target, header
