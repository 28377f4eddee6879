"""Subscribe to a vLLM engine's KV-cache events (ZMQ) and keep its ``ExactIndex`` up to date.

Hand-written: vLLM's event stream has no client library (vLLM ships only the publisher, and its
``KVEventBatch`` classes live inside vLLM, which the gateway does not install), so this module
speaks the wire format directly. What it relies on, as vLLM 0.32 publishes it
(``vllm/distributed/kv_events.py``, ``--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", ...}'``):

- PUB/SUB multipart messages ``[topic, seq, payload]``: ``seq`` is 8 bytes big-endian, one counter
  per engine core, +1 per batch, back to 0 when the engine restarts. SUB filters ``topic`` by prefix.
- ``payload``: msgpack of ``[ts, events, data_parallel_rank]`` (an array-like struct). Events are
  maps tagged by ``"type"`` (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``); fields left at
  their defaults may be missing, unknown fields are ignored, an unknown event type is skipped.
- ``BlockStored`` carries its blocks' ``token_ids`` and ``block_size`` (128 on the CPU build);
  block hashes are uint64 (default) or 32-byte bin (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``).
- Replay (when ``replay_endpoint`` is set in vLLM's config): a ROUTER; a DEALER sends
  ``[b"", start_seq (8 bytes big-endian)]`` and gets ``[b"", topic, seq, payload]`` for every
  buffered batch from ``start_seq`` on, then ``[b"", b"", b"\\xff" * 8, b""]``.

Events are incremental: a block already cached is never sent again, and a PUB keeps nothing for a
late subscriber. So on each connection (the first, and after one was lost: the engine may have
restarted) the subscriber clears the index and asks the replay socket for the engine's history, and
at a gap in the sequence for what it missed; without replay a gap clears the index (the gateway
falls back to its estimate until the index knows blocks again). The SUB connects: vLLM must bind,
which it does for an endpoint with a wildcard host (``tcp://*:5557``). One engine core publishes
on one endpoint; with data parallelism rank ``r`` adds ``r`` to both ports.

Only blocks whose identity is their tokens are indexed: blocks with LoRA, multimodal or
cache-salt extra keys, other KV-cache groups (hybrid models) and other media (CPU offload tiers)
are left out. Requests must not ask for ``kv_cache_report_mode: "full"``: it re-sends reused
blocks as stores with no matching removals.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

try:
    import msgspec
    import zmq
    import zmq.asyncio
    from zmq.utils.monitor import parse_monitor_message
except ImportError as exc:
    raise ImportError(
        f"backends[].kv_events needs pyzmq and msgspec: pip install 'enginegate[kv-events]' ({exc})"
    ) from exc

from routing.kv_exact import AllBlocksCleared, BlockRemoved, BlockStored, Event, ExactIndex

log = logging.getLogger("enginegate.kv_events")

PRIMARY_MEDIA = frozenset({None, "GPU"})
"""vLLM's own block pool publishes ``medium: "GPU"``, even on the CPU build; offload tiers use others."""
REPLAY_TIMEOUT_S = 5.0
"""How long a replay may go quiet before it counts as failed (vLLM serves it about every 0.1 s)."""
RECONNECT_MAX_MS = 5000
"""zmq retries a lost connection with backoff up to this."""
HEARTBEAT_MS = 2000
"""ZMTP heartbeat interval; three without an answer drop the connection."""
RECEIVE_HWM = 10_000
"""Batches queued in the SUB socket before zmq drops them (a drop shows as a gap, then a replay)."""
_END = b"\xff" * 8


# vLLM's events, with the fields the index needs (and those that say a block is not plain tokens);
# msgspec skips the others. Those that only qualify a block have defaults: vLLM omits some left at
# theirs, and an absent one means a plain block.
class _Stored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class _Removed(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None = None
    group_idx: int | None = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _Tagged(msgspec.Struct):
    type: str


_batch = msgspec.msgpack.Decoder(_Batch)
_event = msgspec.msgpack.Decoder(_Stored | _Removed | _Cleared)
_tagged = msgspec.msgpack.Decoder(_Tagged)
_KNOWN = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})


def decode_events(payload: bytes) -> tuple[list[Event], int]:
    """The index's events in one batch's ``payload``, and how many events it left out (another
    medium or KV-cache group, extra keys, a type this module does not know). Raises
    ``msgspec.DecodeError`` when the payload or a known event is malformed: then none of it applies."""
    batch = _batch.decode(payload)
    events: list[Event] = []
    left_out = 0
    for raw in batch.events:
        try:
            wire = _event.decode(raw)
        except msgspec.DecodeError:
            if _tagged.decode(raw).type in _KNOWN:
                raise
            left_out += 1  # a newer vLLM's event: nothing the index needs
            continue
        if isinstance(wire, _Stored):
            if (
                wire.medium not in PRIMARY_MEDIA
                or wire.group_idx
                or wire.lora_id is not None
                or wire.lora_name is not None
                or (wire.extra_keys and any(k is not None for k in wire.extra_keys))
            ):
                left_out += 1
                continue
            events.append(
                BlockStored(tuple(wire.block_hashes), wire.parent_block_hash, tuple(wire.token_ids), wire.block_size)
            )
        elif isinstance(wire, _Removed):
            if wire.medium not in PRIMARY_MEDIA or wire.group_idx:
                left_out += 1
                continue
            events.append(BlockRemoved(tuple(wire.block_hashes)))
        else:
            events.append(AllBlocksCleared())
    return events, left_out


class KvEventSubscriber:
    """Keeps ``index`` equal to what the engine at ``endpoint`` holds, for as long as ``run`` runs.

    Counters: ``received`` batches (live and replayed), ``gaps`` in the sequence, ``malformed``
    messages, ``replayed`` batches got from the replay socket, ``left_out`` events not indexed,
    ``disconnects`` from the engine (each clears the index)."""

    def __init__(
        self, endpoint: str, index: ExactIndex, *, topic: str = "", replay_endpoint: str | None = None
    ) -> None:
        self.endpoint = endpoint
        self.index = index
        self.topic = topic
        self.replay_endpoint = replay_endpoint
        self.replay_timeout = REPLAY_TIMEOUT_S
        self.received = 0
        self.gaps = 0
        self.malformed = 0
        self.replayed = 0
        self.left_out = 0
        self.disconnects = 0
        self._next: int | None = None
        """The sequence number expected next; None before the first batch."""
        self._history_pending = True
        """Connected (again) and the engine's history not yet replayed."""
        self._catching_up = False
        """Just replayed the history: live batches the replay already gave are duplicates, not a restart."""
        self._ctx = zmq.asyncio.Context()
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Until cancelled. Reconnects are zmq's; each connection (the first one, and after a lost
        one) starts from the replay of the engine's history, or from an empty index without one."""
        self._task = asyncio.current_task()
        sub = self._ctx.socket(zmq.SUB)
        monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
            sub.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)
            # ZMTP pings (libzmq answers them on vLLM's side): a vanished host shows as a disconnect.
            sub.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
            sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_MS)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
            sub.connect(self.endpoint)
            poller = zmq.asyncio.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    await self._on_connection(parse_monitor_message(await monitor.recv_multipart())["event"])
                if sub in ready:
                    await self._on_message(await sub.recv_multipart())
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _on_connection(self, event: int) -> None:
        if event == zmq.EVENT_DISCONNECTED:
            # What the engine did while we were away is lost, and it may come back restarted with
            # its sequence starting over at the number we expect: only a fresh start is safe.
            self.disconnects += 1
            self.index.clear()
            self._next = None
            self._catching_up = False
            self._history_pending = True
        elif self.replay_endpoint is not None and self._history_pending:
            # What the engine cached before we came: nothing else will ever say it again. Live
            # batches may have been applied already (the monitor's news can come late): the
            # history goes in from the start, and those come again as duplicates.
            self._history_pending = False
            self.index.clear()
            self._next = None
            await self._replay(0, None)
            self._catching_up = self._next is not None

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait([task])  # its CancelledError stays its own; ours still reaches us
        self._ctx.destroy(linger=0)

    async def _on_message(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self._bad(f"a {len(frames)}-frame message")
            return
        seq = int.from_bytes(frames[1], "big")
        if self._next is not None and seq != self._next:
            if seq < self._next:
                if self._catching_up:
                    return  # the replay gave it already
                # The engine restarted (its sequence starts over, its cache is empty).
                log.info("kv events from %s: sequence restarted at %d", self.endpoint, seq)
                self.index.clear()
                self._next = 0
            if seq > self._next:
                self.gaps += 1
                await self._fill(self._next, seq)
        self._catching_up = False
        self.received += 1
        self._apply(seq, frames[2])

    async def _fill(self, start: int, stop: int) -> None:
        """Get the batches ``start..stop - 1`` the SUB socket missed, or forget what they changed."""
        if self.replay_endpoint is None or not await self._replay(start, stop):
            self.index.clear()
        self._next = stop

    async def _replay(self, start: int, stop: int | None) -> bool:
        """Apply the buffered batches from ``start`` (up to ``stop``); False when the replay failed
        or had lost some (vLLM keeps its last ``buffer_steps`` batches)."""
        assert self.replay_endpoint is not None
        dealer = self._ctx.socket(zmq.DEALER)
        complete = False
        try:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(self.replay_endpoint)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            expected = start
            while await dealer.poll(int(self.replay_timeout * 1000)):
                frames = await dealer.recv_multipart()
                if len(frames) != 4 or len(frames[2]) != 8:
                    self._bad(f"a {len(frames)}-frame replay message")
                    continue
                if frames[2] == _END:
                    complete = True
                    break
                seq = int.from_bytes(frames[2], "big")
                if seq < expected or (stop is not None and seq >= stop):
                    continue
                if seq > expected and (stop is not None or expected > start):
                    # A hole: its removals are lost, so what the index holds may be gone. Start over
                    # from here (a missing start of the engine's history only leaves blocks out).
                    self.index.clear()
                self.received += 1
                self.replayed += 1
                self._apply(seq, frames[3])
                expected = seq + 1
                if stop is not None and expected == stop:
                    complete = True  # the rest is on the SUB socket already
                    break
        finally:
            dealer.close(linger=0)
        if not complete:
            log.warning(
                "kv events replay from %s at %d: no end marker in %.1fs",
                self.replay_endpoint,
                start,
                self.replay_timeout,
            )
        return complete and (stop is None or expected == stop)

    def _apply(self, seq: int, payload: bytes) -> None:
        self._next = seq + 1
        try:
            events, left_out = decode_events(payload)
        except msgspec.DecodeError as exc:
            # Its changes are lost: forget rather than keep blocks it may have removed.
            self._bad(f"batch {seq}: {exc}")
            self.index.clear()
            return
        self.left_out += left_out
        for event in events:
            self.index.apply(event)

    def _bad(self, what: str) -> None:
        self.malformed += 1
        if self.malformed <= 10 or self.malformed % 1000 == 0:
            log.warning("kv events from %s: malformed %s (%d so far)", self.endpoint, what, self.malformed)
