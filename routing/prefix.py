"""What each engine likely holds in its prefix cache: chained block hashes of prompts, and an LRU per backend.

Engines cache a prompt's KV in fixed-size blocks and reuse the longest run of leading blocks a new
prompt shares with one they have seen. The gateway cannot see those caches, so it keeps its own
account: the blocks of every prompt it sent to a backend, least recently used first out, bounded by
the tokens that backend's KV cache holds. A new prompt's expected cached tokens on a backend are its
leading blocks found there.

Blocks are cut from the prompt's UTF-8 bytes, not tokens: no tokenizer runs on the request path,
and two prompts that share their first ``n`` bytes share their first ``n`` bytes' worth of tokens
whatever the tokenizer (up to the block where they part). Hashes are chained: block ``i``'s hash is
the CRC-32 of every byte up to its end (``zlib.crc32`` continues a running value, so chaining costs
one C call per block and no Python object per byte), salted with the block's position so two
prefixes of different lengths never share a key. CRC-32 and its salt are the same in every process,
so gateway replicas compute the same keys (Python's ``hash`` of a string is not).

Engines tell what they really reused (``usage.prompt_tokens_details.cached_tokens``, llama-server's
``timings.cache_n``), and that corrects the account's size: a block the gateway thought was there
but the engine had evicted shows the engine keeps less than its nominal KV capacity (llama-server
keeps one prompt per slot), a block it still had shows it keeps at least that much.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Sequence

CHARS_PER_TOKEN = 4
"""Bytes a block holds per configured token (``routing.prefix.block_tokens``): English text's
average, so a block of 64 tokens is cut as 256 bytes (the gateway tokenizes nothing to cut them)."""
DEFAULT_BLOCK_TOKENS = 64
"""TensorRT-LLM's default KV page (``tokens_per_block``) and four of vLLM's 16-token blocks. Smaller
blocks predict a few more cached tokens at a cost linear in the prompt; a block of difference is
noise beside a prompt's prefill."""
BLOCK_BYTES = DEFAULT_BLOCK_TOKENS * CHARS_PER_TOKEN
MAX_BYTES = 1 << 20
"""Prompts longer than this (1 MiB) are hashed up to here: the work per request stays bounded."""
OPENING_BYTES = 2048
"""A completion prompt's opening (its rendezvous key) is at most its first 2 KiB."""
MIN_CAPACITY_TOKENS = 512
"""An engine's learned cache size never drops below this: one short prompt always fits."""
REPORT_WEIGHT = 0.3
"""How far one engine report of a missed block moves the expected cache size towards that block's age."""


def _key(crc: int, position: int) -> int:
    return (position << 32) | crc


def chain(data: bytes, block: int = BLOCK_BYTES) -> tuple[int, ...]:
    """Chained hashes of the complete blocks of ``data`` (a partial last block is never cached whole)."""
    view = memoryview(data)
    keys = []
    crc = 0
    for position, start in enumerate(range(0, min(len(data), MAX_BYTES) - block + 1, block)):
        crc = zlib.crc32(view[start : start + block], crc)
        keys.append(_key(crc, position))
    return tuple(keys)


def rendered(texts: Sequence[object]) -> bytes:
    """The bytes a prompt's blocks are cut from: each message's text, NUL-separated (chat templates
    add role markers between messages, which a separator stands for: prefixes agree either way)."""
    return b"\x00".join((t if isinstance(t, str) else str(t)).encode() for t in texts)


def opening(texts: Sequence[object], roles: Sequence[str] | None) -> tuple[int, int]:
    """(bytes of the preamble, bytes of the opening) of ``rendered(texts)``.

    The preamble is what many conversations share: a chat's system messages (a completion prompt's
    first ``OPENING_BYTES``); cache beyond it is a conversation's own. The opening adds the first
    user message: the same on every turn of a conversation, different between conversations, so
    it names the conversation for rendezvous hashing."""
    if roles is None:
        size = min(OPENING_BYTES, len(rendered(texts[:1])))
        return size, size
    preamble = size = 0
    for i, (text, role) in enumerate(zip(texts, roles, strict=False)):
        size += len(text.encode() if isinstance(text, str) else str(text).encode()) + (1 if i else 0)
        if role == "system" or role == "developer":
            preamble = size
        if role == "user":
            break
    return preamble, size


def opening_key(data: bytes, length: int) -> int:
    """A stable number naming the conversation: rendezvous hashing on it sends every turn of a
    conversation to the same backend, from any gateway replica."""
    return zlib.crc32(memoryview(data)[:length])


class PrefixIndex:
    """Blocks sent to one backend, least recently used first out, bounded in tokens.

    ``capacity`` starts at the backend's nominal KV capacity and moves with what the engine reports.
    """

    __slots__ = ("_blocks", "_conversations", "_tick", "_tokens", "capacity", "ceiling")

    def __init__(self, capacity_tokens: float) -> None:
        self.ceiling = max(float(MIN_CAPACITY_TOKENS), capacity_tokens)
        """The nominal capacity: what the engine's memory holds."""
        self.capacity = self.ceiling
        self._blocks: OrderedDict[int, tuple[float, float]] = OrderedDict()
        """Key -> (tokens in the block, tick of its last use)."""
        self._tokens = 0.0
        self._tick = 0.0
        """Tokens inserted so far: a block's age is the tokens used since it was."""
        self._conversations: OrderedDict[int, tuple[int | None, float]] = OrderedDict()
        """Conversation key -> (its latest prompt's deepest block, the tick it was sent at), least
        recently sent first."""

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def tokens(self) -> float:
        return self._tokens

    @property
    def conversations(self) -> int:
        """Conversations whose latest prompt the engine is expected to hold: those whose next turns
        find their history here."""
        return len(self._conversations)

    def match(self, keys: Sequence[int]) -> int:
        """How many of ``keys``' leading blocks the backend is expected to hold."""
        blocks = self._blocks
        n = 0
        for key in keys:
            if key not in blocks:
                break
            n += 1
        return n

    def ages(self, keys: Sequence[int], n: int) -> list[float]:
        """Tokens used since each of the first ``n`` blocks was (kept by a request to judge the
        engine's report against)."""
        blocks, tick = self._blocks, self._tick
        return [tick - blocks[k][1] for k in keys[:n]]

    def add(self, keys: Sequence[int], block_tokens: float, conversation: int | None = None) -> None:
        """The prompt of ``keys`` was sent here: the engine holds its blocks now. Deepest blocks go
        in first, so the oldest prompts lose their tails before the prefixes others share (as an
        engine frees a finished request's blocks). ``conversation``: the prompt's conversation
        (``RequestFeatures.prefix_hash``), counted while the deepest block of its latest prompt is
        held (the first to go), or while a prompt shorter than a block would be (sent within the last
        ``capacity`` tokens)."""
        blocks = self._blocks
        for key in reversed(keys):
            self._tick += block_tokens
            old = blocks.get(key)
            if old is not None:
                blocks[key] = (old[0], self._tick)
                blocks.move_to_end(key)
            else:
                blocks[key] = (block_tokens, self._tick)
                self._tokens += block_tokens
        if conversation is not None:
            self._conversations[conversation] = (keys[-1] if keys else None, self._tick)
            self._conversations.move_to_end(conversation)
        self._evict()

    def _evict(self) -> None:
        blocks = self._blocks
        while self._tokens > self.capacity and blocks:
            _, (tokens, _) = blocks.popitem(last=False)
            self._tokens -= tokens
        # Conversations leave in the order they were last sent, as their deepest blocks do.
        conversations, oldest = self._conversations, self._tick - self.capacity
        while conversations:
            deepest, tick = next(iter(conversations.values()))
            if (deepest in blocks) if deepest is not None else tick >= oldest:
                break
            conversations.popitem(last=False)

    def reported(self, ages: Sequence[float], cached_tokens: int, block_tokens: float) -> None:
        """The engine says it reused ``cached_tokens`` of a prompt whose first ``len(ages)`` blocks
        were expected, ``ages[i]`` tokens old when it was sent: a block it had shows it keeps at
        least that many tokens, one it had not that it keeps fewer."""
        if not ages or block_tokens <= 0:
            return
        # One block of slack: tokens per block are the request's average, and a chat template's
        # tokens sit between the messages, so the engine's count lands within a block of ours.
        held = int(cached_tokens // block_tokens) + 1
        if held >= len(ages):
            self.capacity = min(self.ceiling, max(self.capacity, ages[-1] + block_tokens))
        else:
            # Smoothed, not taken at once: engines also miss for reasons other than size (llama-server
            # gives a slot to the most similar prompt, evicting one that had just been used).
            shrunk = (1 - REPORT_WEIGHT) * self.capacity + REPORT_WEIGHT * ages[held]
            self.capacity = max(float(MIN_CAPACITY_TOKENS), min(self.capacity, shrunk))
            self._evict()
