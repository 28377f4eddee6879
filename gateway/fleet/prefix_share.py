"""Replicas share where they sent prompt blocks (``routing.prefix.share``), through Redis pub/sub.

Each gateway replica keeps its own account of what every engine holds (``routing.prefix``): the
blocks of the prompts *it* sent there. A conversation whose turns reach different replicas (a load
balancer spreading requests) would look new to every replica that had not seen it, and land
wherever load puts new conversations: its history prefilled again, on several engines. With
sharing on, every replica publishes the blocks it sends to each backend, and every replica adds
what the others sent to its own index, so they agree on where each conversation lives.

Why Redis pub/sub: the replicas already share a Redis for limits and spend (``redis.url``); a
message lost (a reconnect) costs some cache hits, never a wrong answer, so at-most-once delivery is
enough; and nothing waits on it: a request's route is decided before its blocks are published.

Messages are JSON, ``{"s": sender, "m": [[backend, block_tokens, [key, ...], conversation], ...]}``
(the conversation's key may be left off, as older replicas do); a replica skips its own. Sends are
queued (bounded: when Redis is slow, the oldest news is dropped, counted) and published in batches
from one task; received batches are applied on the event loop (an index update per prompt, as for
the replica's own sends).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import orjson

log = logging.getLogger("enginegate.prefix_share")

CHANNEL = "enginegate:prefix-blocks"
QUEUE = 4096
"""Sends waiting to be published; beyond it the oldest are dropped."""
BATCH = 64
"""Sends per published message at most."""
MAX_KEYS = 1 << 16
"""Keys of one prompt in a message at most (a 1 MiB prompt in 16-byte blocks): larger is malformed."""
RETRY_S = 1.0

Learn = Callable[[str, Sequence[int], float, int | None], None]
"""(backend, block keys, tokens per block, conversation key): what another replica sent there."""


class PrefixShare:
    def __init__(
        self,
        url: str,
        learn: Learn,
        *,
        channel: str = CHANNEL,
        timeout_s: float = 1.0,
        count: Callable[[str, int], None] = lambda direction, prompts: None,
    ) -> None:
        self._url = url
        self._learn = learn
        self._count = count
        self._channel = channel
        self._timeout = timeout_s
        self.sender = secrets.token_hex(8)
        self._queue: asyncio.Queue[tuple[str, float, Sequence[int], int | None]] = asyncio.Queue(QUEUE)
        self._tasks: list[asyncio.Task[None]] = []
        self.subscribed = asyncio.Event()
        """Set while the subscription is live (tests wait for it; a replica's news before it is lost)."""

    def sent(self, backend: str, keys: Sequence[int], block_tokens: float, conversation: int | None = None) -> None:
        """This replica sent a prompt of ``keys`` (of ``conversation``) to ``backend``: tell the
        others (never blocks)."""
        if not keys:
            return
        if self._queue.full():
            self._queue.get_nowait()
            self._count("dropped", 1)
        self._queue.put_nowait((backend, block_tokens, keys, conversation))

    async def start(self) -> None:
        """Publishing and subscribing, in the background; returns once subscribed (or after the
        timeout: a replica serves without its peers' news rather than not at all)."""
        self._tasks = [
            asyncio.create_task(self._publish_forever(), name="prefix-share-publish"),
            asyncio.create_task(self._subscribe_forever(), name="prefix-share-subscribe"),
        ]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.subscribed.wait(), self._timeout)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _client(self) -> Any:
        from redis import asyncio as aioredis

        return aioredis.from_url(self._url, socket_timeout=self._timeout, socket_connect_timeout=self._timeout)

    async def _publish_forever(self) -> None:
        client = self._client()
        try:
            while True:
                batch = [await self._queue.get()]
                while len(batch) < BATCH and not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                body = orjson.dumps({"s": self.sender, "m": [[b, t, list(k), c] for b, t, k, c in batch]})
                try:
                    await client.publish(self._channel, body)
                    self._count("sent", len(batch))
                except Exception as exc:  # Redis away: this batch is lost (cache hits, not answers)
                    self._count("dropped", len(batch))
                    log.warning("prefix blocks not shared (%s: %s)", type(exc).__name__, exc)
                    await asyncio.sleep(RETRY_S)
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _subscribe_forever(self) -> None:
        while True:
            client = self._client()
            try:
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                await pubsub.subscribe(self._channel)
                self.subscribed.set()
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None and message.get("type") == "message":
                        self.apply(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("prefix share subscription lost (%s: %s)", type(exc).__name__, exc)
            finally:
                self.subscribed.clear()
                with contextlib.suppress(Exception):
                    await client.aclose()
            await asyncio.sleep(RETRY_S)

    def apply(self, data: bytes) -> None:
        """One published batch: every send of another replica goes into this replica's indexes."""
        try:
            body = orjson.loads(data)
            if body["s"] == self.sender:
                return
            sends = [_send(item) for item in body["m"]]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            self._count("malformed", 1)
            return
        for backend, keys, block_tokens, conversation in sends:
            self._learn(backend, keys, block_tokens, conversation)
        self._count("received", len(sends))


def _send(item: object) -> tuple[str, tuple[int, ...], float, int | None]:
    if not isinstance(item, list) or len(item) not in (3, 4):
        raise ValueError("not [backend, block_tokens, keys, conversation]")
    backend, block_tokens, keys, *rest = item
    conversation = rest[0] if rest else None
    if not isinstance(backend, str) or not isinstance(block_tokens, int | float) or not isinstance(keys, list):
        raise ValueError("wrong types")
    if conversation is not None and (not isinstance(conversation, int) or isinstance(conversation, bool)):
        raise ValueError("conversation is not an integer")
    if len(keys) > MAX_KEYS or not all(isinstance(k, int) for k in keys) or not 0 < block_tokens < 1e6:
        raise ValueError("keys or block size out of range")
    return backend, tuple(keys), float(block_tokens), conversation
