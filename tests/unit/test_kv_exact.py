"""The exact prefix-cache index (routing/kv_exact.py) and the KV-event subscriber (gateway/fleet/kv_events.py).

The subscriber tests run it against a fake vLLM publisher on loopback: an XPUB socket (which hears
the subscription, so nothing is sent before the subscriber listens) and a ROUTER that replays, both
speaking vLLM 0.32's wire format as recorded in /work/notes/kv_events_report.md: messages
``[topic, seq, payload]``, payload msgpack ``[ts, events, dp_rank]``, events maps tagged by ``type``.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from gateway.fleet.kv_events import KvEventSubscriber, decode_events
from routing.kv_exact import AllBlocksCleared, BlockRemoved, BlockStored, ExactIndex
from tests.polling import eventually

BS = 4
"""Block size of these tests (vLLM-CPU's is 128: the index takes whatever the events say)."""
PROMPT = tuple(range(100, 100 + 5 * BS + 2))
"""Five full blocks and two tokens."""


def stored(
    first: int, count: int, tokens: Sequence[int] = PROMPT, parent: int | None = None, base: int = 1000
) -> BlockStored:
    """Blocks ``first .. first + count - 1`` of ``tokens``, engine hashes ``base + i``."""
    hashes = tuple(base + i for i in range(first, first + count))
    if parent is None and first:
        parent = base + first - 1
    return BlockStored(hashes, parent, tuple(tokens[first * BS : (first + count) * BS]), BS)


def index_of(*events: BlockStored | BlockRemoved | AllBlocksCleared) -> ExactIndex:
    index = ExactIndex()
    for event in events:
        index.apply(event)
    return index


# ---- ExactIndex ----------------------------------------------------------------------------------------


def test_an_empty_index_knows_nothing_and_is_not_synced() -> None:
    index = ExactIndex()
    assert (index.synced, index.block_size, len(index), index.cached_tokens(PROMPT)) == (False, 0, 0, 0)


def test_stored_blocks_count_as_leading_full_blocks_and_the_partial_last_block_never_does() -> None:
    index = index_of(stored(0, 5))
    assert (index.synced, index.block_size, len(index)) == (True, BS, 5)
    assert index.cached_tokens(PROMPT) == 5 * BS  # 22 tokens: five full blocks, two tokens left over
    assert index.cached_tokens(PROMPT[: 3 * BS + 1]) == 3 * BS
    assert index.cached_tokens(PROMPT[: BS - 1]) == 0


def test_a_whole_cached_prompt_leaves_its_last_token_to_compute_like_vllm() -> None:
    # vLLM looks up only the blocks within the first len - 1 tokens: a prompt of exactly two full
    # blocks, both cached, reports one block (the last one is recomputed for its logits).
    index = index_of(stored(0, 5))
    assert index.cached_tokens(PROMPT[: 2 * BS]) == BS
    assert index.cached_tokens(PROMPT[: 2 * BS + 1]) == 2 * BS
    assert index.cached_tokens(PROMPT[:BS]) == 0


def test_a_prompt_that_parts_from_a_cached_one_gets_only_the_shared_blocks() -> None:
    index = index_of(stored(0, 5))
    other = (*PROMPT[: 2 * BS], 7, *PROMPT[2 * BS + 1 :])
    assert index.cached_tokens(other) == 2 * BS
    assert index.cached_tokens([1, *PROMPT[1:]]) == 0
    # The same tokens at another position are another block: keys are chained, not per block.
    assert index.cached_tokens(PROMPT[BS:]) == 0


def test_blocks_chain_across_events_through_the_parent_hash() -> None:
    # A long prompt is prefilled in chunks: one event per chunk, each naming the last block before it.
    index = index_of(stored(0, 2), stored(2, 2), stored(4, 1))
    assert index.cached_tokens(PROMPT) == 5 * BS
    assert index.skipped == 0


def test_a_block_whose_parent_is_unknown_is_skipped_and_so_are_its_children() -> None:
    index = index_of(stored(0, 2), stored(3, 1, parent=999), stored(4, 1))
    assert index.cached_tokens(PROMPT) == 2 * BS
    assert (len(index), index.skipped) == (2, 2)


def test_a_new_block_after_a_cached_prefix_extends_it() -> None:
    # Second request: shares blocks 0-1, then its own block 2 whose parent is the shared block 1.
    other = (*PROMPT[: 2 * BS], *range(1, 3 * BS + 1))
    index = index_of(stored(0, 5), stored(2, 1, tokens=other, parent=1001, base=2000))
    assert index.cached_tokens(other) == 3 * BS
    assert index.cached_tokens(PROMPT) == 5 * BS


def test_removed_blocks_end_the_cached_prefix_where_they_were() -> None:
    index = index_of(stored(0, 5), BlockRemoved((1002,)))
    assert index.cached_tokens(PROMPT) == 2 * BS
    assert len(index) == 4
    index.apply(BlockRemoved((1000, 12345)))  # an unknown hash is nothing to remove
    assert (index.cached_tokens(PROMPT), len(index)) == (0, 3)


def test_a_block_held_twice_stays_until_its_last_copy_is_removed() -> None:
    # Two requests that computed the same new block at once: vLLM stores (and later evicts) both copies.
    index = index_of(stored(0, 2), stored(0, 2))
    index.apply(BlockRemoved((1001,)))
    assert index.cached_tokens(PROMPT) == 2 * BS
    index.apply(BlockRemoved((1001,)))
    assert index.cached_tokens(PROMPT) == BS


def test_all_blocks_cleared_empties_the_index_which_stays_synced() -> None:
    index = index_of(stored(0, 5), AllBlocksCleared())
    assert (len(index), index.cached_tokens(PROMPT), index.synced) == (0, 0, True)
    index.apply(stored(0, 1))
    assert index.cached_tokens(PROMPT) == BS


def test_clear_forgets_everything_and_unsyncs_until_the_next_event() -> None:
    index = index_of(stored(0, 5))
    index.clear()
    assert (len(index), index.cached_tokens(PROMPT), index.synced) == (0, 0, False)
    index.apply(BlockRemoved((1000,)))
    assert index.synced


def test_partial_blocks_and_blocks_of_another_size_are_not_indexed() -> None:
    index = index_of(stored(0, 1), BlockStored((1001,), 1000, PROMPT[BS : 2 * BS - 1], BS - 1))
    index.apply(BlockStored((1001,), 1000, PROMPT[BS : 3 * BS], 2 * BS))
    assert (index.cached_tokens(PROMPT), index.skipped, index.block_size) == (BS, 2, BS)


def test_the_block_cap_starts_the_index_over() -> None:
    index = ExactIndex(max_blocks=3)
    index.apply(stored(0, 5))
    assert (len(index), index.overflows, index.cached_tokens(PROMPT)) == (2, 1, 0)  # blocks 3 and 4 stay
    index.apply(AllBlocksCleared())
    index.apply(stored(0, 2))
    assert (index.cached_tokens(PROMPT), index.overflows) == (2 * BS, 1)


def test_keys_are_the_same_in_every_process() -> None:
    # Gateway replicas must agree; str and bytes hashing changes with PYTHONHASHSEED, a tuple of ints does not.
    code = "print(hash((0, tuple(range(128)))))"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], env={"PYTHONHASHSEED": seed}, capture_output=True, text=True, check=True
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1


# ---- wire format ---------------------------------------------------------------------------------------


def wire_stored(event: BlockStored, **fields: Any) -> dict[str, Any]:
    """A BlockStored as vLLM 0.32 writes it: every field without a default, nil when None."""
    return {
        "type": "BlockStored",
        "block_hashes": list(event.block_hashes),
        "parent_block_hash": event.parent_block_hash,
        "token_ids": list(event.token_ids),
        "block_size": event.block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None] * len(event.block_hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
        **fields,
    }


def wire_removed(*hashes: object, **fields: Any) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU", "group_idx": 0, **fields}


def payload(*events: dict[str, Any]) -> bytes:
    return msgspec.msgpack.encode([1764600000.25, list(events), 0])


def test_a_vllm_batch_decodes_to_the_index_events() -> None:
    digest = bytes(range(32))  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: raw 32-byte hashes
    events, left_out = decode_events(
        payload(
            wire_removed(7),
            wire_stored(stored(0, 2)),
            wire_stored(BlockStored((digest,), 1001, PROMPT[2 * BS : 3 * BS], BS), session_id="s1"),
            {"type": "AllBlocksCleared"},
        )
    )
    assert events == [
        BlockRemoved((7,)),
        stored(0, 2),
        BlockStored((digest,), 1001, PROMPT[2 * BS : 3 * BS], BS),
        AllBlocksCleared(),
    ]
    assert left_out == 0


def test_blocks_that_are_not_plain_tokens_are_left_out() -> None:
    event = stored(0, 1)
    events, left_out = decode_events(
        payload(
            wire_stored(event, lora_id=3, lora_name="adapter"),
            wire_stored(event, extra_keys=[["salt"]]),
            wire_stored(event, medium="CPU"),
            wire_stored(event, group_idx=1),
            wire_removed(1000, medium="CPU"),
            {"type": "BlockMoved", "block_hashes": [1]},  # a later vLLM's event type
            wire_stored(event),
        )
    )
    assert (events, left_out) == ([event], 6)


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # not msgpack
        msgspec.msgpack.encode({"ts": 1.0, "events": []}),  # a map, not vLLM's array
        payload({"type": "BlockStored", "block_hashes": [1]}),  # a known event without its fields
        payload(wire_removed("not-a-hash")),
    ],
    ids=["garbage", "map-batch", "missing-fields", "bad-hash"],
)
def test_malformed_payloads_raise_a_decode_error(body: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_events(body)


def test_without_pyzmq_the_import_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zmq", None)  # what `import zmq` meets when pyzmq is not installed
    monkeypatch.delitem(sys.modules, "gateway.fleet.kv_events")
    with pytest.raises(ImportError, match=re.escape("pip install 'enginegate[kv-events]'")):
        importlib.import_module("gateway.fleet.kv_events")


# ---- subscriber against a fake publisher ---------------------------------------------------------------

TOPIC = b"kv-events"
END = b"\xff" * 8


class FakeVllm:
    """vLLM's publisher side: an XPUB (hears subscriptions) and a replay ROUTER with a history."""

    def __init__(self, ctx: zmq.asyncio.Context) -> None:
        self.ctx = ctx
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.bind("tcp://127.0.0.1:*")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.bind("tcp://127.0.0.1:*")
        self.history: dict[int, bytes] = {}
        self.replays: list[int] = []

    @property
    def endpoint(self) -> str:
        return self.pub.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def replay_endpoint(self) -> str:
        return self.router.getsockopt_string(zmq.LAST_ENDPOINT)

    async def subscribed(self) -> None:
        frame = await asyncio.wait_for(self.pub.recv(), 10)
        assert frame[:1] == b"\x01", frame

    async def restart(self) -> None:
        """A new engine process on the same endpoint: its history and sequence start over."""
        endpoint = self.endpoint
        self.pub.close(linger=0)
        self.history.clear()
        self.pub = self.ctx.socket(zmq.XPUB)
        deadline = time.monotonic() + 10
        while True:  # zmq's I/O thread releases the port a moment after close
            try:
                self.pub.bind(endpoint)
                break
            except zmq.ZMQError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)
        await self.subscribed()

    def record(self, seq: int, body: bytes) -> None:
        """A batch the engine published while nobody listened: only the replay has it."""
        self.history[seq] = body

    async def publish(self, seq: int, body: bytes) -> None:
        self.record(seq, body)
        await self.pub.send_multipart([TOPIC, seq.to_bytes(8, "big"), body])

    async def serve_replays(self) -> None:
        while True:
            identity, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.replays.append(first)
            for seq in sorted(s for s in self.history if s >= first):
                await self.router.send_multipart([identity, b"", TOPIC, seq.to_bytes(8, "big"), self.history[seq]])
            await self.router.send_multipart([identity, b"", b"", END, b""])


@asynccontextmanager
async def running(
    replay: bool, before: dict[int, bytes] | None = None
) -> AsyncIterator[tuple[FakeVllm, KvEventSubscriber]]:
    ctx = zmq.asyncio.Context()
    fake = FakeVllm(ctx)
    for seq, body in (before or {}).items():
        fake.record(seq, body)
    server = asyncio.create_task(fake.serve_replays())
    sub = KvEventSubscriber(
        fake.endpoint, ExactIndex(), topic="kv", replay_endpoint=fake.replay_endpoint if replay else None
    )
    task = asyncio.create_task(sub.run())
    try:
        await fake.subscribed()
        if replay:
            # The start-up replay has read the history: what is published from now on comes live.
            await eventually(lambda: fake.replays, message="no start-up replay")
        yield fake, sub
        assert not task.done(), "the subscriber stopped"
    finally:
        await sub.aclose()
        assert task.done()
        server.cancel()
        await asyncio.wait([server])
        ctx.destroy(linger=0)


def test_live_batches_reach_the_index() -> None:
    async def main() -> None:
        async with running(replay=False) as (fake, sub):
            await fake.publish(0, payload(wire_stored(stored(0, 2))))
            await fake.publish(1, payload(wire_stored(stored(2, 3))))
            await eventually(lambda: sub.index.cached_tokens(PROMPT) == 5 * BS, message="blocks not indexed")
            assert (sub.received, sub.gaps, sub.malformed) == (2, 0, 0)

    asyncio.run(main())


def test_a_gap_without_replay_clears_the_index() -> None:
    async def main() -> None:
        async with running(replay=False) as (fake, sub):
            await fake.publish(0, payload(wire_stored(stored(0, 5))))
            await eventually(lambda: len(sub.index) == 5)
            fake.record(1, payload(wire_removed(1001)))  # lost: the index would still hold block 1
            await fake.publish(2, payload(wire_stored(stored(0, 1, tokens=range(50), base=3000))))
            await eventually(lambda: sub.gaps == 1)
            assert sub.index.cached_tokens(PROMPT) == 0
            assert sub.index.cached_tokens(range(50)) == BS  # the batch after the gap still applies
            await fake.publish(3, payload(wire_stored(stored(1, 1, tokens=range(50), base=3000))))
            await eventually(lambda: sub.index.cached_tokens(range(50)) == 2 * BS)
            assert (sub.gaps, sub.received) == (1, 3)

    asyncio.run(main())


def test_a_gap_with_replay_applies_what_was_missed() -> None:
    async def main() -> None:
        async with running(replay=True) as (fake, sub):
            await fake.publish(0, payload(wire_stored(stored(0, 5))))
            await eventually(lambda: len(sub.index) == 5)
            fake.record(1, payload(wire_removed(1004)))
            fake.record(2, payload(wire_stored(stored(4, 1, base=5000, parent=1003))))
            await fake.publish(3, payload(wire_removed(1003)))
            await eventually(lambda: sub.received == 4, message=f"received {sub.received}")
            assert (sub.gaps, sub.replayed) == (1, 2)
            assert fake.replays == [0, 1]  # at start, then from the first missing batch
            assert sub.index.cached_tokens(PROMPT) == 3 * BS  # 1004 and 1003 removed; 5004 orphaned
            assert sub.index.synced

    asyncio.run(main())


def test_the_engine_history_is_replayed_when_the_subscriber_starts() -> None:
    # The engine cached PROMPT before the gateway came up: no live event will ever mention it again.
    history = {0: payload(wire_stored(stored(0, 3))), 1: payload(wire_stored(stored(3, 2)))}

    async def main() -> None:
        async with running(replay=True, before=history) as (fake, sub):
            await eventually(lambda: sub.index.cached_tokens(PROMPT) == 5 * BS)
            # A live batch the replay already gave is a duplicate, not a restart.
            await fake.pub.send_multipart([TOPIC, (1).to_bytes(8, "big"), history[1]])
            await fake.publish(2, payload(wire_removed(1004)))
            await eventually(lambda: sub.index.cached_tokens(PROMPT) == 4 * BS)
            assert (sub.received, sub.replayed, sub.gaps) == (3, 2, 0)

    asyncio.run(main())


def test_a_restarted_engine_clears_the_index() -> None:
    async def main() -> None:
        async with running(replay=False) as (fake, sub):
            for seq in range(3):
                await fake.publish(seq, payload(wire_stored(stored(seq, 1))))
            await eventually(lambda: len(sub.index) == 3)
            await fake.publish(0, payload(wire_stored(stored(0, 1, tokens=range(50), base=3000))))
            await eventually(lambda: sub.index.cached_tokens(range(50)) == BS)
            assert sub.index.cached_tokens(PROMPT) == 0

    asyncio.run(main())


def test_malformed_messages_are_counted_and_the_subscriber_goes_on() -> None:
    async def main() -> None:
        async with running(replay=False) as (fake, sub):
            await fake.publish(0, payload(wire_stored(stored(0, 2))))
            await fake.pub.send_multipart([TOPIC, b"\x00\x01"])  # two frames
            await fake.pub.send_multipart([TOPIC, b"\x01", b""])  # a 1-byte sequence number
            await fake.publish(1, b"\xc1not msgpack")
            await fake.publish(2, payload(wire_stored(stored(0, 1, tokens=range(50), base=3000))))
            await eventually(lambda: sub.index.cached_tokens(range(50)) == BS)
            assert sub.malformed == 3
            # Batch 1's changes are unknown: what the index held before it is forgotten.
            assert sub.index.cached_tokens(PROMPT) == 0
            assert (sub.received, sub.gaps) == (3, 0)

    asyncio.run(main())


def test_the_topic_filters_messages() -> None:
    async def main() -> None:
        async with running(replay=False) as (fake, sub):
            await fake.pub.send_multipart([b"other", (0).to_bytes(8, "big"), payload(wire_stored(stored(0, 5)))])
            await fake.publish(0, payload(wire_stored(stored(0, 1))))
            await eventually(lambda: sub.received == 1)
            assert len(sub.index) == 1

    asyncio.run(main())


def test_a_lost_connection_clears_the_index_even_if_the_sequence_looks_unbroken() -> None:
    # The engine restarted while we were away and has published batch 0 already: its batch 1 is
    # the number we expect, but the blocks we knew are gone.
    async def main() -> None:
        async with running(replay=False) as (fake, sub):
            await fake.publish(0, payload(wire_stored(stored(0, 5))))
            await eventually(lambda: len(sub.index) == 5)
            await fake.restart()
            await eventually(lambda: sub.disconnects == 1)
            await fake.publish(1, payload(wire_stored(stored(0, 1, tokens=range(50), base=3000))))
            await eventually(lambda: sub.index.cached_tokens(range(50)) == BS)
            assert (sub.index.cached_tokens(PROMPT), sub.gaps) == (0, 0)

    asyncio.run(main())


def test_after_a_reconnect_the_history_is_replayed_again() -> None:
    async def main() -> None:
        async with running(replay=True) as (fake, sub):
            await fake.publish(0, payload(wire_stored(stored(0, 5))))
            await eventually(lambda: len(sub.index) == 5)
            await fake.restart()
            await fake.publish(0, payload(wire_stored(stored(0, 1, tokens=range(50), base=3000))))
            await eventually(lambda: fake.replays == [0, 0], message=f"replays {fake.replays}")
            await eventually(lambda: sub.index.cached_tokens(range(50)) == BS)
            assert sub.index.cached_tokens(PROMPT) == 0
            assert sub.disconnects == 1

    asyncio.run(main())
