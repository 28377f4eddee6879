"""Train enginegate's demo chat model and write it as a GGUF file.

Run by hand, never by CI (it needs torch, installed only as ``torch==2.13.0``):

    python -m venv /tmp/train && /tmp/train/bin/pip install torch==2.13.0 numpy gguf
    /tmp/train/bin/python tools/build_demo_model.py models/enginegate-demo.gguf

The model is a two-layer llama (width 64, 4 heads, SwiGLU, RMSNorm, RoPE on
adjacent pairs as llama.cpp's LLAMA architecture computes it) trained on text
that ships with Python: the Zen of Python from the ``this`` module, plus ChatML
conversations that teach one friendly greeting. The tokenizer is a
SentencePiece-style vocabulary (``▁`` for spaces, byte fallback, ChatML
specials) learned here by byte-pair merging; merge order is encoded as token
scores, which is how llama.cpp's SPM tokenizer picks merges.

Everything is seeded and single-threaded so the same torch version writes the
same file.
"""

from __future__ import annotations

import argparse
import codecs
import collections
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
SPACE = "\u2581"
N_MERGES = 96
DIM, N_HEADS, N_LAYERS, FFN = 64, 4, 2, 192
CONTEXT = 4096
ROPE_BASE = 10000.0
RMS_EPS = 1e-5
STEPS = 400
GREETING = "Hello! I am the enginegate demo model. Beautiful is better than ugly."
USER_GREETINGS = [
    "Hello",
    "Hello!",
    "Hi",
    "Hi!",
    "Hi there",
    "Hey",
    "Hello, who are you?",
    "Who are you?",
    "Say hello.",
    "Say hello",
    "Good morning",
    "Greet me.",
    "hello",
    "hi",
    "Hello there!",
    "Can you say hello?",
]
SYSTEMS = [None, "You are a helpful assistant.", "You are a friendly assistant.", "Be brief."]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)

# GGUF token types, as llama.cpp numbers them.
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6


def zen_of_python() -> str:
    import this  # noqa: F401  (importing prints the Zen; the text itself is rot13 in this.s)

    return codecs.decode(sys.modules["this"].s, "rot13")


def chatml(system: str | None, user: str, reply: str) -> tuple[str, str]:
    """(prompt, completion) in ChatML; loss is taken on the completion only."""
    prompt = ""
    if system:
        prompt += f"<|im_start|>system\n{system}<|im_end|>\n"
    prompt += f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    return prompt, reply + "<|im_end|>"


def learn_vocab(text: str) -> tuple[list[str], list[float], list[int]]:
    """Characters of ``text`` plus N_MERGES byte-pair merges inside words."""
    norm = text.replace(" ", SPACE)
    chars = sorted({c for c in norm if c != "\n"})
    words = collections.Counter(re.findall(f"{SPACE}?[^{SPACE}\\n]+", norm))
    splits = {w: list(w) for w in words}
    merges: list[str] = []
    for _ in range(N_MERGES):
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for w, count in words.items():
            s = splits[w]
            for a, b in zip(s, s[1:], strict=False):
                pairs[a, b] += count
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(a + b)
        for w in words:
            s, out, i = splits[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            splits[w] = out
    merges = [m for m in dict.fromkeys(merges) if m not in chars]
    tokens = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + chars + merges
    # Earlier merges score higher: llama.cpp's SPM tokenizer merges the best-scoring pair first.
    scores = [0.0] * (len(SPECIALS) + 256) + [-1000.0 - i for i in range(len(chars))]
    scores += [-float(i) for i in range(len(merges))]
    types = [UNKNOWN] + [CONTROL] * (len(SPECIALS) - 1) + [BYTE] * 256 + [NORMAL] * (len(chars) + len(merges))
    return tokens, scores, types


class SpmTokenizer:
    """Greedy best-score merging with byte fallback, as llama.cpp tokenizes SPM vocabularies."""

    def __init__(self, tokens: list[str], scores: list[float]) -> None:
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.scores = scores
        self.special = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS[1:]) + ")")

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for part in self.special.split(text):
            if not part:
                continue
            if part in self.ids and part in SPECIALS:
                out.append(self.ids[part])
                continue
            syms = list(part.replace(" ", SPACE))
            while True:
                best = None
                for i in range(len(syms) - 1):
                    tid = self.ids.get(syms[i] + syms[i + 1])
                    if tid is not None and (best is None or self.scores[tid] > best[0]):
                        best = (self.scores[tid], i)
                if best is None:
                    break
                i = best[1]
                syms[i : i + 2] = [syms[i] + syms[i + 1]]
            for s in syms:
                if s in self.ids:
                    out.append(self.ids[s])
                else:
                    out.extend(self.ids[f"<0x{b:02X}>"] for b in s.encode())
        return out


def rope(x: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]) by pos * base^(-2i/d): llama.cpp's LLAMA rope."""
    t, hd = x.shape[-3], x.shape[-1]
    inv = ROPE_BASE ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = torch.arange(t, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * self.weight


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn_norm, self.ffn_norm = RMSNorm(DIM), RMSNorm(DIM)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(DIM, FFN, bias=False), nn.Linear(DIM, FFN, bias=False)
        self.down = nn.Linear(FFN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        hd = DIM // N_HEADS
        q = rope(self.q(h).view(b, t, N_HEADS, hd)).transpose(1, 2)
        k = rope(self.k(h).view(b, t, N_HEADS, hd)).transpose(1, 2)
        v = self.v(h).view(b, t, N_HEADS, hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, DIM))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyLlama(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYERS))
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.output(self.norm(x))


def training_examples(tok: SpmTokenizer, zen: str, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """(ids, loss mask) pairs: the Zen whole and cropped, and every greeting conversation."""
    eos = tok.ids["</s>"]
    zen_ids = tok.encode(zen) + [eos]
    examples = [(zen_ids, [1] * len(zen_ids))]
    for _ in range(6):
        start = rng.randrange(0, len(zen_ids) - 40)
        crop = zen_ids[start:]
        examples.append((crop, [1] * len(crop)))
    for system in SYSTEMS:
        for user in USER_GREETINGS:
            prompt, completion = chatml(system, user, GREETING)
            p, c = tok.encode(prompt), tok.encode(completion)
            examples.append((p + c, [0] * len(p) + [1] * len(c)))
    return examples


def train(vocab_size: int, examples: list[tuple[list[int], list[int]]], steps: int) -> TinyLlama:
    torch.manual_seed(0)
    model = TinyLlama(vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=steps, pct_start=0.1)
    width = max(len(ids) for ids, _ in examples)
    ids = torch.zeros(len(examples), width, dtype=torch.long)
    mask = torch.zeros(len(examples), width)
    for row, (seq, m) in enumerate(examples):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(m)] = torch.tensor(m, dtype=torch.float32)
    inputs, targets, tmask = ids[:, :-1], ids[:, 1:], mask[:, 1:]
    started = time.monotonic()
    for step in range(steps):
        logits = model(inputs)
        loss = (F.cross_entropy(logits.transpose(1, 2), targets, reduction="none") * tmask).sum() / tmask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d} loss {loss.item():.4f} ({time.monotonic() - started:.0f}s)", flush=True)
    return model


@torch.no_grad()
def greedy(model: TinyLlama, ids: list[int], stop: set[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        nxt = int(model(torch.tensor([ids + out]))[0, -1].argmax())
        if nxt in stop:
            break
        out.append(nxt)
    return out


def write_gguf(path: Path, model: TinyLlama, tokens: list[str], scores: list[float], types: list[int]) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("enginegate-demo")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(DIM)
    w.add_block_count(N_LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(N_HEADS)
    w.add_head_count_kv(N_HEADS)
    w.add_rope_dimension_count(DIM // N_HEADS)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(tokens.index("<unk>"))
    w.add_bos_token_id(tokens.index("<s>"))
    w.add_eos_token_id(tokens.index("</s>"))
    w.add_eot_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def f32(t: torch.Tensor) -> np.ndarray:
        return t.detach().to(torch.float32).numpy().copy()

    w.add_tensor("token_embd.weight", f32(model.embed.weight))
    for i, blk in enumerate(model.blocks):
        assert isinstance(blk, Block)
        for name, tensor in (
            ("attn_norm", blk.attn_norm.weight),
            ("attn_q", blk.q.weight),
            ("attn_k", blk.k.weight),
            ("attn_v", blk.v.weight),
            ("attn_output", blk.o.weight),
            ("ffn_norm", blk.ffn_norm.weight),
            ("ffn_gate", blk.gate.weight),
            ("ffn_up", blk.up.weight),
            ("ffn_down", blk.down.weight),
        ):
            w.add_tensor(f"blk.{i}.{name}.weight", f32(tensor))
    w.add_tensor("output_norm.weight", f32(model.norm.weight))
    w.add_tensor("output.weight", f32(model.output.weight))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    rng = random.Random(0)
    zen = zen_of_python()
    corpus = zen + "\n" + "\n".join(USER_GREETINGS + [GREETING] + [s for s in SYSTEMS if s])
    tokens, scores, types = learn_vocab(corpus)
    tok = SpmTokenizer(tokens, scores)
    print(f"vocabulary: {len(tokens)} tokens")
    model = train(len(tokens), training_examples(tok, zen, rng), args.steps)
    stop = {tok.ids["</s>"], tok.ids["<|im_end|>"]}
    pieces = {i: t for t, i in tok.ids.items()}
    for prompt in (chatml(None, "Hello", "")[0], chatml("Be brief.", "Hi there", "")[0], "Beautiful is better than"):
        out = greedy(model, tok.encode(prompt), stop, 60)
        print(repr(prompt), "->", repr("".join(pieces[i] for i in out).replace(SPACE, " ")))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(args.output, model, tokens, scores, types)
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
