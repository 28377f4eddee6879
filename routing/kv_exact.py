"""What one vLLM engine holds in its prefix cache, exactly, as its KV-cache events say.

vLLM publishes an event whenever its block pool caches a full block of prompt tokens
(``BlockStored``), evicts one (``BlockRemoved``) or drops them all (``AllBlocksCleared``).
``ExactIndex`` replays those events into a set of blocks and answers the routing question: how
many leading tokens of this prompt would the engine take from its cache?

Keys are the index's own, not vLLM's. vLLM's block hashes are SHA-256 over a pickle of (parent
digest, tokens, extra keys) with a seed, published truncated to 64 bits, so the gateway can neither
extend the published chain nor recompute it cheaply for a new prompt. Each event carries its
blocks' token ids, so the index chains its own key over them instead: block ``i``'s key is
Python's ``hash`` of (key of block ``i - 1``, block ``i``'s tokens). The hash of a tuple of ints is
the same in every process and on every run (only str and bytes hashing is salted), so replicas of
the gateway agree. A map from vLLM's hash to the index's key lets a ``BlockStored`` find its
parent's key and a ``BlockRemoved`` (which names vLLM's hashes only) find the key to drop.

Only blocks whose identity is their tokens belong here: the subscriber leaves out blocks with
LoRA adapters, multimodal inputs or cache salts (their ``extra_keys``), which a plain token
prefix never matches. Pure: no I/O, nothing from ``gateway/``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

MAX_BLOCKS = 2_000_000
"""Blocks held at most (about 170 bytes each). The engine's own evictions bound the index, and the
subscriber clears it whenever events were lost; this bounds it should removals go missing anyway:
past it the index starts over (an engine holds far fewer blocks: 80 GB of KV cache is some
hundred thousand 16-token blocks of an 8B model)."""
_ROOT = 0
"""The parent key of a prompt's first block."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """The engine cached ``len(block_hashes)`` full blocks, in prompt order: ``token_ids`` holds all
    their tokens, ``parent_block_hash`` is the engine's hash of the block before the first one
    (None when the first one starts the prompt)."""

    block_hashes: tuple[Hashable, ...]
    parent_block_hash: Hashable | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """The engine evicted these blocks (its hashes)."""

    block_hashes: tuple[Hashable, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (``POST /reset_prefix_cache``, say)."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


class ExactIndex:
    """What one vLLM engine holds in its prefix cache, exactly, as its KV-cache events say.

    ``synced`` is False until the first event and again after ``clear()``: the gateway then falls
    back to its estimate. After a ``clear()`` the engine still holds what it held; the index learns
    only what it stores from then on (vLLM sends new blocks only), so it under-reports until those
    blocks are evicted, never over-reports.
    """

    __slots__ = ("_copies", "_engine", "_held", "block_size", "max_blocks", "overflows", "skipped", "synced")

    def __init__(self, max_blocks: int = MAX_BLOCKS) -> None:
        self.block_size = 0
        self.synced = False
        self.max_blocks = max_blocks
        self.skipped = 0
        """Blocks of ``BlockStored`` events that could not be indexed (unknown parent, partial block)."""
        self.overflows = 0
        """Times the index reached ``max_blocks`` and started over."""
        self._engine: dict[Hashable, int] = {}
        """vLLM's hash -> own key."""
        self._held: dict[int, int] = {}
        """Own key -> vLLM hashes that have it (one, but for a collision of vLLM's 64-bit hashes)."""
        self._copies: dict[Hashable, int] = {}
        """vLLM's hash -> copies beyond the first. vLLM may cache one hash in several physical blocks
        (two requests computed it at once) and reports a store and a removal per block, so a hash
        stays until its last copy goes. Rare, hence a map of its own."""

    def apply(self, event: Event) -> None:
        if isinstance(event, BlockStored):
            self._store(event)
        elif isinstance(event, BlockRemoved):
            for engine_hash in event.block_hashes:
                self._remove(engine_hash)
        else:
            self.clear()
        self.synced = True

    def cached_tokens(self, token_ids: Sequence[int]) -> int:
        """The tokens of ``token_ids`` the engine would take from its cache: its leading full blocks
        held, times the block size. vLLM computes at least the last token (it needs its logits), so
        it looks only at the blocks within the first ``len - 1`` tokens (``KVCacheManager.
        get_computed_blocks``, vLLM 0.32): a prompt of exactly two blocks, both held, reports one."""
        size = self.block_size
        if not size or not self._held:
            return 0
        held = self._held
        key = _ROOT
        blocks = (len(token_ids) - 1) // size
        for i in range(blocks):
            key = hash((key, tuple(token_ids[i * size : (i + 1) * size])))
            if key not in held:
                return i * size
        return blocks * size

    def clear(self) -> None:
        """Forget everything: the engine cleared its cache, or events were lost (a gap that could
        not be replayed, a reconnect to a restarted engine)."""
        self._engine.clear()
        self._held.clear()
        self._copies.clear()
        self.synced = False

    def __len__(self) -> int:
        return len(self._held)

    def _store(self, event: BlockStored) -> None:
        size = event.block_size
        count = len(event.block_hashes)
        # A partial block (vLLM's fine-grained hashing) or a block of another size (another KV
        # cache group) is not a full block of this index.
        if size <= 0 or len(event.token_ids) != count * size or (self.block_size and size != self.block_size):
            self.skipped += count
            return
        if event.parent_block_hash is None:
            key = _ROOT
        else:
            parent = self._engine.get(event.parent_block_hash)
            if parent is None:
                # Evicted, or stored before we connected: these blocks can't be chained to a prompt
                # start, so no lookup could reach them; their children are skipped in turn.
                self.skipped += count
                return
            key = parent
        self.block_size = size
        tokens = event.token_ids
        engine, held = self._engine, self._held
        for i, engine_hash in enumerate(event.block_hashes):
            key = hash((key, tokens[i * size : (i + 1) * size]))
            if engine_hash in engine:
                self._copies[engine_hash] = self._copies.get(engine_hash, 0) + 1
                continue
            if len(engine) >= self.max_blocks:
                self.overflows += 1
                self.clear()
            engine[engine_hash] = key
            held[key] = held.get(key, 0) + 1

    def _remove(self, engine_hash: Hashable) -> None:
        copies = self._copies.get(engine_hash)
        if copies:
            if copies > 1:
                self._copies[engine_hash] = copies - 1
            else:
                del self._copies[engine_hash]
            return
        key = self._engine.pop(engine_hash, None)
        if key is None:
            return
        left = self._held[key] - 1
        if left:
            self._held[key] = left
        else:
            del self._held[key]
