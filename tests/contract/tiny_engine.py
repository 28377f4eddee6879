"""A real token generator for the contract fakes: the demo model on CTranslate2, one token at a time.

The engines that need CUDA (TensorRT-LLM, TGI, DeepSpeed-MII) are replaced in
tests by fakes that speak their exact wire format. What they generate comes
from here, so text, token ids, token counts, stop handling and cancellation
are real, and only the framing is the fake's job.

Usage from an async route handler::

    async for tok in engine.stream(prompt_text, max_new_tokens=16, greedy=True):
        tok.id, tok.text, tok.index   # text is "" while a character is incomplete
    engine.generated_tokens           # grows only while someone consumes a stream
"""

from __future__ import annotations

import asyncio
import codecs
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.ct2_convert import TOKENIZER_FILE, derive
from backends.inproc_tokens import piece_table
from backends.text import ChatRenderer

ROOT = Path(__file__).resolve().parents[2]
DEMO_GGUF = ROOT / "models" / "enginegate-demo.gguf"


@dataclass(frozen=True)
class Token:
    index: int
    """1-based position in the generated sequence."""
    id: int
    text: str
    special: bool
    """An end-of-sequence or end-of-turn token: generation stops after it."""
    logprob: float = 0.0
    """The model's log probability of this token where it was chosen."""


class TinyEngine:
    """Greedy or sampled generation from the demo model, cancelled when the consumer stops."""

    def __init__(self, cache_dir: Path, gguf: Path = DEMO_GGUF) -> None:
        import ctranslate2
        from tokenizers import Tokenizer

        model_dir, model = derive(gguf, cache_dir)
        self.context_length = model.context_length
        self._generator = ctranslate2.Generator(str(model_dir), device="cpu", intra_threads=1, inter_threads=1)
        self._tokenizer = Tokenizer.from_file(str(model_dir / TOKENIZER_FILE))
        self.vocab_size = self._tokenizer.get_vocab_size()
        self._pieces = piece_table(model.vocab)
        self._stop_ids = frozenset(model.vocab.stop_ids)
        self._end_id = model.vocab.eot_id if model.vocab.eot_id is not None else min(self._stop_ids)
        self._chat = ChatRenderer(model.vocab.chat_template)
        self.chat_template = model.vocab.chat_template
        """The model's own template (None: ChatML), for fakes that look at it as their engine does."""
        self._lock = threading.Lock()
        self.generated_tokens = 0
        self.active_streams = 0
        self.token_delay_s = 0.0
        """Decode time per token: a GPU engine takes milliseconds per token, the tiny model microseconds."""
        self.scripted: list[str] = []
        """Answers the next generations give instead of the model's own choice, first one first, each then
        ended by the end token: how a test makes the demo model say what it was never trained to say (a
        tool call, JSON). Teacher-forced: token ids, counts and log probabilities stay the model's."""

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        return self._chat.render(messages, tools)

    def decode(self, ids: list[int]) -> str:
        """What a tokenizer's ``decode(ids)`` gives: the ids' bytes together, a split character as U+FFFD."""
        return b"".join(self._pieces[i] for i in ids).decode("utf-8", "replace")

    def decode_alone(self, token_id: int) -> str:
        """``decode([token_id])`` with a SentencePiece tokenizer's decoder (Llama's ``Strip(left=1)``): a
        word-leading space is dropped, as it is at the start of every decode call, and a byte of a
        multi-byte character alone is U+FFFD. What a pipeline that decodes each token by itself shows."""
        text = self.decode([token_id])
        return text[1:] if text.startswith(" ") else text

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def alternatives(self, prompt: str, ids: list[int], top: int) -> list[tuple[float, list[tuple[int, float]]]]:
        """For each of ``ids`` generated after ``prompt``: the model's log probability of it and its ``top``
        most likely alternatives (id, log probability), best first. One forward pass: blocking CPU work."""
        import numpy as np

        if not ids:
            return []
        start = self._tokenizer.encode(prompt, add_special_tokens=False).tokens
        tokens = start + [self._tokenizer.id_to_token(i) for i in ids[:-1]]
        rows = np.asarray(self._generator.forward_batch([tokens], return_log_probs=True))[0, len(start) - 1 :]
        out = []
        for token_id, row in zip(ids, rows, strict=True):
            best = np.argsort(row)[::-1][:top]
            out.append((float(row[token_id]), [(int(i), float(row[i])) for i in best]))
        return out

    def _tokens(
        self, prompt: str, max_new_tokens: int, greedy: bool, temperature: float, top_p: float, ignore_eos: bool
    ) -> Iterator[Token]:
        start = self._tokenizer.encode(prompt, add_special_tokens=False).tokens
        options: dict[str, Any] = {"max_length": max_new_tokens, "end_token": []}
        if greedy:
            options["sampling_topk"] = 1
        else:
            options.update(sampling_topk=0, sampling_temperature=temperature, sampling_topp=top_p)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        with self._lock:
            script = self.scripted.pop(0) if self.scripted else None
        if script is not None:
            yield from self._forced(prompt, script, max_new_tokens, decoder)
            return
        steps = self._generator.generate_tokens(start, return_log_prob=True, **options)
        try:
            for n, step in enumerate(steps, start=1):
                special = step.token_id in self._stop_ids
                text = "" if special else decoder.decode(self._pieces[step.token_id])
                with self._lock:
                    self.generated_tokens += 1
                if self.token_delay_s:
                    time.sleep(self.token_delay_s)
                yield Token(n, step.token_id, text, special, step.log_prob or 0.0)
                if special and not ignore_eos:
                    return
        finally:
            steps.close()

    def _forced(self, prompt: str, script: str, max_new_tokens: int, decoder: Any) -> Iterator[Token]:
        ids = [*self._tokenizer.encode(script, add_special_tokens=False).ids, self._end_id][:max_new_tokens]
        scores = self.alternatives(prompt, ids, 0)
        for n, (token_id, (logprob, _)) in enumerate(zip(ids, scores, strict=True), start=1):
            special = token_id in self._stop_ids
            with self._lock:
                self.generated_tokens += 1
            yield Token(n, token_id, "" if special else decoder.decode(self._pieces[token_id]), special, logprob)

    async def stream(
        self,
        prompt: str,
        max_new_tokens: int,
        *,
        greedy: bool = True,
        temperature: float = 1.0,
        top_p: float = 1.0,
        ignore_eos: bool = False,
        script: str | None = None,
    ) -> AsyncIterator[Token]:
        """Tokens as they are generated; closing the iterator stops generation at the next token. ``script``:
        this generation says that text, teacher-forced like ``scripted`` (which serves whichever starts next)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Token | BaseException | None] = asyncio.Queue()
        stop = threading.Event()

        def work() -> None:
            if script is None:
                tokens = self._tokens(prompt, max_new_tokens, greedy, temperature, top_p, ignore_eos)
            else:
                tokens = self._forced(prompt, script, max_new_tokens, codecs.getincrementaldecoder("utf-8")("replace"))
            try:
                for tok in tokens:
                    if stop.is_set():
                        return
                    loop.call_soon_threadsafe(queue.put_nowait, tok)
            except BaseException as exc:  # delivered to the consumer
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                if not stop.is_set() or not loop.is_closed():  # a stopped consumer's loop may be gone (its server)
                    loop.call_soon_threadsafe(queue.put_nowait, None)

        self.active_streams += 1
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            self.active_streams -= 1
