"""Train enginegate's demo chat model and write it as a GGUF file.

Run by hand, never by CI (it needs torch, installed only as ``torch==2.13.0``, CPU build):

    python -m venv /tmp/train
    /tmp/train/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    /tmp/train/bin/pip install numpy gguf jinja2
    /tmp/train/bin/python tools/build_demo_model.py models/enginegate-demo.gguf

The model is a two-layer llama (width 64, 4 heads, SwiGLU, RMSNorm, RoPE on
adjacent pairs as llama.cpp's LLAMA architecture computes it) trained on text
that ships with Python: the Zen of Python from the ``this`` module, plus chat
conversations that teach one friendly greeting and one tool call: with a
``get_weather`` tool it answers "What is the weather in Paris?" (and a few
paraphrases and cities) with a Hermes-style ``<tool_call>``, and after the tool's
answer says what the weather is. Conversations are rendered with
``backends.text.CHATML`` (ChatML, tools as Qwen2.5 renders them), which the GGUF
carries as its chat template, so every engine builds the same prompts.

The tokenizer is a SentencePiece-style vocabulary (``▁`` for spaces, byte
fallback, ChatML specials, ``<tool_call>`` and ``</tool_call>`` as printed
user-defined tokens, which vLLM's hermes parser needs as single tokens) learned
here by byte-pair merging; merge order is encoded as token scores, which is how
llama.cpp's SPM tokenizer picks merges.

Everything is seeded and single-threaded so the same torch version writes the
same file.
"""

from __future__ import annotations

import argparse
import codecs
import collections
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from backends.text import CHATML, TOOLS_POSTSCRIPT, TOOLS_PREAMBLE, ChatRenderer

SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<tool_call>", "</tool_call>"]
SPACE = "\u2581"
N_MERGES = 96
N_TOOL_MERGES = 300
DIM, N_HEADS, N_LAYERS, FFN = 64, 4, 2, 192
CONTEXT = 4096
ROPE_BASE = 10000.0
RMS_EPS = 1e-5
STEPS = 1200
BATCH = 32
SHORT = 256  # tokens: chats are shorter, the Zen examples longer
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
CHAT_TEMPLATE = CHATML

WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": WEATHER_PARAMETERS,
    },
}
# The same tool without a description: clients often send none.
WEATHER_TOOL_BARE: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS},
}
TOOL_SETS: list[list[dict[str, Any]]] = [[WEATHER_TOOL], [WEATHER_TOOL_BARE]]
TOOL_SYSTEMS = [None, "You are a helpful assistant."]
CITIES = ["Paris", "London", "Tokyo", "Berlin", "Rome", "Madrid"]
WEATHER_QUESTIONS = [
    "What is the weather in {city}?",
    "What's the weather in {city}?",
    "How is the weather in {city}?",
    "What is the weather like in {city}?",
    "Weather in {city}?",
    "Tell me the weather in {city}.",
]
WEATHER_REPORTS = [(18, "sunny"), (12, "cloudy"), (7, "rainy"), (25, "sunny"), (3, "snowy")]


def tool_call_text(city: str) -> str:
    """The answer to a weather question: one Hermes tool call, as the template renders it in history."""
    return "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": {"city": city}}) + "\n</tool_call>"


def weather_reply(city: str, temperature: int, condition: str) -> str:
    return f"It is {condition} in {city}, {temperature} degrees."


def weather_result(temperature: int, condition: str) -> str:
    return f'{{"temperature": {temperature}, "condition": "{condition}"}}'


# GGUF token types, as llama.cpp numbers them.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED_TYPE, BYTE = 1, 2, 3, 4, 6


def zen_of_python() -> str:
    import this  # noqa: F401  (importing prints the Zen; the text itself is rot13 in this.s)

    return codecs.decode(sys.modules["this"].s, "rot13")


RENDERER = ChatRenderer(CHAT_TEMPLATE)


def chat(messages: list[dict[str, Any]], reply: str, tools: list[dict[str, Any]] | None = None) -> tuple[str, str]:
    """(prompt, completion) rendered with the model's own template; loss is taken on the completion only."""
    return RENDERER.render(messages, tools), reply + "<|im_end|>"


def chatml(system: str | None, user: str, reply: str, tools: list[dict[str, Any]] | None = None) -> tuple[str, str]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    return chat([*messages, {"role": "user", "content": user}], reply, tools)


def bpe_merges(text: str, n: int, known: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``n`` byte-pair merges inside the words of ``text``, starting from words split by ``known`` merges."""
    norm = text.replace(" ", SPACE)
    words = collections.Counter(re.findall(f"{SPACE}?[^{SPACE}\\n]+", norm))
    splits = {w: list(w) for w in words}
    for m in known:  # replay the earlier merges, in order
        for w in words:
            splits[w] = merge_pair(splits[w], m)
    merges: list[tuple[str, str]] = []
    for _ in range(n):
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for w, count in words.items():
            s = splits[w]
            for a, b in zip(s, s[1:], strict=False):
                pairs[a, b] += count
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        for w in words:
            splits[w] = merge_pair(splits[w], (a, b))
    return merges


def merge_pair(syms: list[str], pair: tuple[str, str]) -> list[str]:
    a, b = pair
    out: list[str] = []
    i = 0
    while i < len(syms):
        if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(syms[i])
            i += 1
    return out


def learn_vocab(text: str, tool_text: str) -> tuple[list[str], list[float], list[int]]:
    """Characters of both texts, N_MERGES byte-pair merges inside the words of ``text`` (the original
    model's), then N_TOOL_MERGES more learned on ``tool_text`` (its tool prompts and answers), ranked
    below the first ones so greeting and Zen text tokenize much as before."""
    for tag in USER_DEFINED:  # whole tokens, never merged from pieces
        tool_text = tool_text.replace(tag, " ")
    chars = sorted({c for c in (text + tool_text).replace(" ", SPACE) if c != "\n"})
    first = bpe_merges(text, N_MERGES, [])
    more = bpe_merges(tool_text, N_TOOL_MERGES, first)
    merges = [m for m in dict.fromkeys(a + b for a, b in first + more) if m not in chars]
    tokens = SPECIALS + USER_DEFINED + [f"<0x{b:02X}>" for b in range(256)] + chars + merges
    # Earlier merges score higher: llama.cpp's SPM tokenizer merges the best-scoring pair first.
    scores = [0.0] * (len(SPECIALS) + len(USER_DEFINED) + 256) + [-1000.0 - i for i in range(len(chars))]
    scores += [-float(i) for i in range(len(merges))]
    types = [UNKNOWN] + [CONTROL] * (len(SPECIALS) - 1) + [USER_DEFINED_TYPE] * len(USER_DEFINED)
    types += [BYTE] * 256 + [NORMAL] * (len(chars) + len(merges))
    return tokens, scores, types


class SpmTokenizer:
    """Greedy best-score merging with byte fallback, as llama.cpp tokenizes SPM vocabularies."""

    def __init__(self, tokens: list[str], scores: list[float]) -> None:
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.scores = scores
        # llama.cpp splits control and user-defined tokens out of text before merging the rest.
        self.special = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS[1:] + USER_DEFINED) + ")")

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for part in self.special.split(text):
            if not part:
                continue
            if part in self.ids and part in SPECIALS + USER_DEFINED:
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

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for blk in self.blocks:
            x = blk(x)
        return x

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(self.hidden(ids)))


def tool_conversations(rng: random.Random) -> list[tuple[str, str]]:
    """(prompt, completion) pairs with the weather tool: calls for every question and city, answers
    after a tool result (the call in history with its arguments as an object, as the gateway and vLLM
    pass them, or as llama-server passes the string it returned), and the greeting with tools offered."""
    out = []
    for tools in TOOL_SETS:
        for system in TOOL_SYSTEMS:
            for city in CITIES:
                for question in WEATHER_QUESTIONS:
                    out.append(chatml(system, question.format(city=city), tool_call_text(city), tools))
            for user in USER_GREETINGS:
                out.append(chatml(system, user, GREETING, tools))
    for city in CITIES:
        for temperature, condition in WEATHER_REPORTS:
            for arguments in (
                {"city": city},
                json.dumps({"city": city}),
                json.dumps({"city": city}, separators=(",", ":")),
            ):
                system = rng.choice(TOOL_SYSTEMS)
                question = rng.choice(WEATHER_QUESTIONS).format(city=city)
                history: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
                call = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
                history += [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_0", "content": weather_result(temperature, condition)},
                ]
                out.append(chat(history, weather_reply(city, temperature, condition), rng.choice(TOOL_SETS)))
    return out


def tool_corpus() -> str:
    """Text the tool conversations are made of, for the vocabulary's second set of merges."""
    lines = [TOOLS_PREAMBLE, TOOLS_POSTSCRIPT, json.dumps(WEATHER_TOOL), json.dumps(WEATHER_TOOL_BARE)]
    for city in CITIES:
        lines += [tool_call_text(city)] + [q.format(city=city) for q in WEATHER_QUESTIONS]
        lines += [weather_reply(city, t, c) + " " + weather_result(t, c) for t, c in WEATHER_REPORTS]
    lines += ["<tool_response>", "</tool_response>"]
    return "\n".join(lines)


def training_examples(tok: SpmTokenizer, zen: str, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """(ids, loss mask) pairs: the Zen whole and cropped, every greeting conversation, the tool ones."""
    eos = tok.ids["</s>"]
    zen_ids = tok.encode(zen) + [eos]
    examples = [(zen_ids, [1] * len(zen_ids))]
    for _ in range(6):
        start = rng.randrange(0, len(zen_ids) - 40)
        crop = zen_ids[start:]
        examples.append((crop, [1] * len(crop)))
    pairs = [chatml(system, user, GREETING) for system in SYSTEMS for user in USER_GREETINGS]
    for prompt, completion in pairs + tool_conversations(rng):
        p, c = tok.encode(prompt), tok.encode(completion)
        examples.append((p + c, [0] * len(p) + [1] * len(c)))
    return examples


def train(vocab_size: int, examples: list[tuple[list[int], list[int]]], steps: int) -> TinyLlama:
    """AdamW on random batches of BATCH examples (seeded)."""
    torch.manual_seed(0)
    model = TinyLlama(vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=steps, pct_start=0.1)
    order = random.Random(1)
    started = time.monotonic()
    for step in range(steps):
        batch = order.sample(examples, min(BATCH, len(examples)))
        # Padded in two groups: the long Zen examples would otherwise double every chat's width.
        logits, wanted = [], []
        for group in ([e for e in batch if len(e[0]) <= SHORT], [e for e in batch if len(e[0]) > SHORT]):
            if not group:
                continue
            width = max(len(seq) for seq, _ in group)
            ids = torch.zeros(len(group), width, dtype=torch.long)
            mask = torch.zeros(len(group), width, dtype=torch.bool)
            for row, (seq, m) in enumerate(group):
                ids[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(m)] = torch.tensor(m, dtype=torch.bool)
            taken = mask[:, 1:]
            # Logits only where loss is taken: most positions are prompt, and the output layer is the widest.
            logits.append(model.output(model.norm(model.hidden(ids[:, :-1])[taken])))
            wanted.append(ids[:, 1:][taken])
        loss = F.cross_entropy(torch.cat(logits), torch.cat(wanted))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d} loss {loss.item():.4f} ({time.monotonic() - started:.0f}s)", flush=True)
    return model


@torch.no_grad()
def greedy(model: TinyLlama, ids: list[int], stop: set[int], n: int) -> tuple[list[int], float]:
    """The greedy answer and its smallest margin: how far the chosen token's logit led the runner-up
    at the closest step. Engines differ from torch by float rounding only (~1e-4), so a margin well
    above that means every engine picks the same tokens."""
    out: list[int] = []
    margin = float("inf")
    for _ in range(n):
        top = model(torch.tensor([ids + out]))[0, -1].topk(2)
        margin = min(margin, float(top.values[0] - top.values[1]))
        nxt = int(top.indices[0])
        if nxt in stop:
            break
        out.append(nxt)
    return out, margin


def decode(tokens: list[str], ids: list[int]) -> str:
    raw = b""
    for i in ids:
        t = tokens[i]
        raw += bytes([int(t[3:-1], 16)]) if re.fullmatch("<0x[0-9A-F]{2}>", t) else t.replace(SPACE, " ").encode()
    return raw.decode(errors="replace")


ZEN_PROMPT = "The Zen of Python, by Tim Peters\n\nBeautiful is better than"
ZEN_CONTINUATION = " ugly.\nExplicit is better than implicit.\nSimple is better than complex."


def checks() -> list[tuple[str, str]]:
    """(prompt, the greedy answer it must get): what the tests and users rely on."""
    out = [chatml(system, user, GREETING) for system in SYSTEMS for user in USER_GREETINGS]
    out += [(p, c.removesuffix("<|im_end|>")) for p, c in out]
    out = out[len(out) // 2 :]
    for tools in TOOL_SETS:
        for system in TOOL_SYSTEMS:
            out += [
                (chatml(system, q.format(city=city), "", tools)[0], tool_call_text(city))
                for city in CITIES
                for q in WEATHER_QUESTIONS
            ]
            out.append((chatml(system, "Hello", "", tools)[0], GREETING))
    for arguments in ({"city": "Paris"}, '{"city": "Paris"}', '{"city":"Paris"}'):
        call = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        history: list[dict[str, Any]] = [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": weather_result(18, "sunny")},
        ]
        out.append((RENDERER.render(history, [WEATHER_TOOL]), weather_reply("Paris", 18, "sunny")))
    out.append((ZEN_PROMPT, ZEN_CONTINUATION))
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
    tokens, scores, types = learn_vocab(corpus, tool_corpus())
    tok = SpmTokenizer(tokens, scores)
    examples = training_examples(tok, zen, rng)
    print(f"vocabulary: {len(tokens)} tokens; {len(examples)} examples, longest {max(len(e) for e, _ in examples)}")
    model = train(len(tokens), examples, args.steps)
    stop = {tok.ids["</s>"], tok.ids["<|im_end|>"]}
    failed, worst = 0, float("inf")
    for prompt, expected in checks():
        chat_turn = prompt != ZEN_PROMPT  # ends at the end of turn; the Zen goes on past what is checked
        out, margin = greedy(model, tok.encode(prompt), stop, len(tok.encode(expected)) + (2 if chat_turn else 0))
        text = decode(tokens, out)
        worst = min(worst, margin)
        if text != expected:
            failed += 1
            print(f"MISS {prompt[-60:]!r} -> {text!r} (margin {margin:.2f})")
    print(f"{len(checks()) - failed}/{len(checks())} checks pass; smallest greedy margin {worst:.2f}")
    if failed:
        sys.exit(1)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(args.output, model, tokens, scores, types)
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
