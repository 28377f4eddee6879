"""Export a llama GGUF (the demo model) to a Hugging Face model directory, for vLLM and TGI.

    python tools/gguf_to_hf.py models/enginegate-demo.gguf OUT_DIR

Writes ``config.json``, ``generation_config.json``, ``model.safetensors``,
``tokenizer.json`` (ids identical to llama.cpp's), ``tokenizer_config.json``
with the chat template, and ``special_tokens_map.json``. No torch needed.

Control tokens become special added tokens (skipped when decoding); user-defined
ones (the demo model's ``<tool_call>`` and ``</tool_call>``) become added tokens
that are not special, as llama.cpp prints them: vLLM's hermes tool parser needs
each as one token in the text it parses.

RoPE layout: GGUF keeps llama.cpp's rotation of adjacent pairs (x[2i], x[2i+1]);
Hugging Face's llama rotates halves (x[i], x[i + d/2]). Rows of q and k are
reordered per head so both compute the same attention.

``--head-dim N`` pads every head to N dimensions without changing what the
model computes, for engines whose kernels refuse small heads (vLLM's CPU
attention starts at 32): the real pairs sit at rotary slots j and N/2 + j with
zeros elsewhere, rope_theta becomes theta^(N/d) so slot j keeps its frequency,
q is scaled by sqrt(N/d) to undo the engine's 1/sqrt(N), and v and o are padded
with zeros.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from backends.gguf_file import GgufModel, read_gguf
from backends.gguf_vocab import TOKEN_USER_DEFINED, Vocabulary
from backends.hf_tokenizer import build_tokenizer


def pairs_to_halves(weight: np.ndarray, n_heads: int, head_dim: int | None = None) -> np.ndarray:
    """Per head, rows (0, 1, 2, 3, ...) as adjacent pairs become halves (0, 2, 4, ..., 1, 3, 5, ...);
    with a larger ``head_dim`` each half is zero-padded to head_dim / 2."""
    rows, cols = weight.shape
    d = rows // n_heads
    halves = weight.reshape(n_heads, d // 2, 2, cols).transpose(0, 2, 1, 3)  # [head, half, pair, col]
    padded = np.zeros((n_heads, 2, (head_dim or d) // 2, cols), dtype=weight.dtype)
    padded[:, :, : d // 2, :] = halves
    return padded.reshape(-1, cols)


def pad_heads(weight: np.ndarray, n_heads: int, head_dim: int, axis: int) -> np.ndarray:
    """Zero-pad each head's block of ``weight`` along ``axis`` to head_dim."""
    w = np.moveaxis(weight, axis, 0)
    d = w.shape[0] // n_heads
    padded = np.zeros((n_heads, head_dim, *w.shape[1:]), dtype=w.dtype)
    padded[:, :d] = w.reshape(n_heads, d, *w.shape[1:])
    return np.moveaxis(padded.reshape(n_heads * head_dim, *w.shape[1:]), 0, axis)


def hf_tensors(model: GgufModel, head_dim: int | None = None) -> dict[str, np.ndarray]:
    t = model.tensors
    d = model.dim // model.n_heads
    hd = head_dim or d
    q_scale = np.float32(np.sqrt(hd / d))
    out = {
        "model.embed_tokens.weight": t["token_embd.weight"],
        "model.norm.weight": t["output_norm.weight"],
        "lm_head.weight": t.get("output.weight", t["token_embd.weight"]),
    }
    for i in range(model.n_layers):
        g, h = f"blk.{i}.", f"model.layers.{i}."
        out |= {
            h + "input_layernorm.weight": t[g + "attn_norm.weight"],
            h + "self_attn.q_proj.weight": pairs_to_halves(t[g + "attn_q.weight"], model.n_heads, hd) * q_scale,
            h + "self_attn.k_proj.weight": pairs_to_halves(t[g + "attn_k.weight"], model.n_heads_kv, hd),
            h + "self_attn.v_proj.weight": pad_heads(t[g + "attn_v.weight"], model.n_heads_kv, hd, 0),
            h + "self_attn.o_proj.weight": pad_heads(t[g + "attn_output.weight"], model.n_heads, hd, 1),
            h + "post_attention_layernorm.weight": t[g + "ffn_norm.weight"],
            h + "mlp.gate_proj.weight": t[g + "ffn_gate.weight"],
            h + "mlp.up_proj.weight": t[g + "ffn_up.weight"],
            h + "mlp.down_proj.weight": t[g + "ffn_down.weight"],
        }
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def tokenizer_json(vocab: Vocabulary) -> tuple[str, dict[str, dict[str, object]]]:
    """``tokenizer.json``'s text, and its added tokens as ``tokenizer_config.json``'s
    ``added_tokens_decoder`` lists them; user-defined tokens are not special."""
    doc = json.loads(build_tokenizer(vocab).to_str())
    decoder: dict[str, dict[str, object]] = {}
    for added in doc["added_tokens"]:
        if vocab.types[added["id"]] == TOKEN_USER_DEFINED:
            added["special"] = False
        decoder[str(added["id"])] = {k: v for k, v in added.items() if k != "id"}
    return json.dumps(doc, ensure_ascii=False), decoder


def export(gguf_path: Path, out: Path, head_dim: int | None = None) -> Path:
    from safetensors.numpy import save_file

    model = read_gguf(gguf_path)
    d = model.dim // model.n_heads
    hd = head_dim or d
    if hd < d or hd % 2:
        raise ValueError(f"head_dim {hd} must be even and at least the model's {d}")
    v = model.vocab
    out.mkdir(parents=True, exist_ok=True)
    eos = v.stop_ids
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": model.dim,
        "intermediate_size": model.ffn_dim,
        "num_attention_heads": model.n_heads,
        "num_key_value_heads": model.n_heads_kv,
        "num_hidden_layers": model.n_layers,
        "head_dim": hd,
        "hidden_act": "silu",
        "max_position_embeddings": model.context_length,
        "rms_norm_eps": model.rms_eps,
        "rope_theta": model.rope_base ** (hd / d),
        "vocab_size": len(v.tokens),
        "tie_word_embeddings": "output.weight" not in model.tensors,
        "bos_token_id": v.bos_id,
        "eos_token_id": eos,
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {"bos_token_id": v.bos_id, "eos_token_id": eos, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    save_file(hf_tensors(model, hd), str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer, added = tokenizer_json(v)
    (out / "tokenizer.json").write_text(tokenizer, encoding="utf-8")

    def name(i: int | None) -> str | None:
        return v.tokens[i] if i is not None else None

    specials = {"bos_token": name(v.bos_id), "eos_token": name(v.eot_id or v.eos_id), "unk_token": name(v.unk_id)}
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model.context_length,
        "add_bos_token": v.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": v.chat_template,
        "added_tokens_decoder": added,
        **specials,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    return out


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--head-dim", type=int, default=None)
    args = parser.parse_args()
    print(export(args.gguf, args.out, args.head_dim))


if __name__ == "__main__":
    main()
