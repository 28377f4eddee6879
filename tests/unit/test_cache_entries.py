"""The response cache's pure parts: what a key covers, what is cacheable, what is kept, the round trip
of stored chunks, and the in-memory store's byte cap and TTL."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from backends.base import Chunk, GenerationRequest, TokenLogprob, ToolCallDelta, TopLogprob, Usage
from gateway.cache import entries
from gateway.cache.stores import MemoryStore
from gateway.config import CacheConfig, ModelConfig

GEN = GenerationRequest("req-1", "m", messages=[{"role": "user", "content": "Hi"}], temperature=0.0)


def key(gen: GenerationRequest, scope: str = "key:a", version: str = "v") -> str:
    return entries.key_of(gen, scope, version)


def test_the_key_covers_what_changes_the_answer_and_nothing_else() -> None:
    # How the answer travels is not the answer: a whole answer asked whole (``whole``) is the one a
    # stream gives, so a streamed request hits what a whole one stored and the other way round.
    same = [
        replace(GEN, request_id="req-2"), replace(GEN, stream=True), replace(GEN, whole=True),
        replace(GEN, stream=True, whole=False), replace(GEN, user="someone"),
    ]  # fmt: skip
    assert {key(g) for g in same} == {key(GEN)}
    different = [
        replace(GEN, messages=[{"role": "user", "content": "Hi!"}]),
        replace(GEN, model="other"),
        replace(GEN, max_tokens=5),
        replace(GEN, seed=1),
        replace(GEN, stop=("x",)),
        replace(GEN, n=2),
        replace(GEN, logit_bias={5: 1.0}),
        replace(GEN, extra={"top_k": 3}),
        replace(GEN, response_format={"type": "json_object"}),
    ]
    assert len({key(g) for g in different} | {key(GEN)}) == len(different) + 1
    assert len({key(GEN), key(GEN, scope="key:b"), key(GEN, version="w")}) == 3


def test_only_deterministic_requests_without_tools_are_cacheable() -> None:
    config = CacheConfig(enabled=True)
    assert entries.bypass(GEN, config) is None
    assert entries.bypass(replace(GEN, temperature=0.7), config) == "sampled"
    assert entries.bypass(replace(GEN, temperature=0.7, seed=3), config) is None
    tools = ({"type": "function", "function": {"name": "f"}},)
    assert entries.bypass(replace(GEN, tools=tools), config) == "tools"
    assert entries.bypass(replace(GEN, tools=tools), CacheConfig(enabled=True, cache_tools=True)) is None
    assert entries.bypass(GEN, CacheConfig(enabled=True, models=["llama-*"])) == "model"


def test_scopes_keep_tenants_apart() -> None:
    assert entries.scope_of("key", "k1", "red") != entries.scope_of("key", "k2", "red")
    assert entries.scope_of("team", "k1", "red") == entries.scope_of("team", "k2", "red")
    assert entries.scope_of("team", "k1", None) != entries.scope_of("team", "k2", None)  # no team: its own
    assert entries.scope_of("global", "k1", "red") == entries.scope_of("global", "k2", "blue")
    assert entries.scope_of("global", None, None) == entries.scope_of("key", None, None) == "anonymous"


def test_a_model_entry_that_changes_is_a_new_version() -> None:
    model = ModelConfig(name="m", params_b=8)
    assert entries.model_version(model, "") == entries.model_version(ModelConfig(name="m", params_b=8), "")
    assert entries.model_version(model, "") != entries.model_version(ModelConfig(name="m", params_b=7), "")
    assert entries.model_version(model, "") != entries.model_version(model, "2026-12")


def test_only_answers_whose_every_choice_ended_normally_are_kept() -> None:
    stop, length = Chunk(finish_reason="stop"), Chunk(finish_reason="length", index=1)
    assert entries.finished([Chunk(text="a"), stop], 1)
    assert entries.finished([stop, length], 2)
    assert not entries.finished([Chunk(text="a")], 1)  # cut
    assert not entries.finished([stop], 2)  # a choice missing
    assert not entries.finished([Chunk(finish_reason="content_filter")], 1)


def test_stored_chunks_come_back_as_they_went_in() -> None:
    chunks = [
        Chunk(text="a", logprobs=(TokenLogprob("a", -0.1, (97,), (TopLogprob("b", -2.0, None),)),)),
        Chunk(tool_calls=(ToolCallDelta(0, "call_1", "f", '{"x": 1}'),), index=1),
        Chunk(finish_reason="stop", usage=Usage(3, 2, cached_tokens=1), stop_sequence="\n"),
    ]
    back = entries.decode(entries.encode(chunks))
    assert [replace(c, more=False) for c in back] == chunks
    assert [c.more for c in back] == [True, True, False]  # replayed in one write


def test_the_memory_store_drops_the_least_recently_used_beyond_its_bytes_and_expired_entries() -> None:
    async def go() -> None:
        store = MemoryStore(max_bytes=250)
        await store.put("a", b"x" * 100, 60)
        await store.put("b", b"y" * 100, 60)
        assert await store.get("a") == b"x" * 100  # a is now the most recently used
        await store.put("c", b"z" * 100, 60)
        assert (await store.get("a"), await store.get("b")) == (b"x" * 100, None)
        assert store.bytes == 200
        await store.put("d", b"w" * 10, 0)  # no time to live: gone at once
        assert await store.get("d") is None and store.bytes == 200

    asyncio.run(go())


def test_answers_stored_under_one_model_version_are_not_served_under_another() -> None:
    from prometheus_client import CollectorRegistry

    from gateway.cache.responses import ResponseCache
    from gateway.config import GatewayConfig

    def config(**changes: object) -> GatewayConfig:
        base: dict[str, object] = {
            "cache": {"enabled": True},
            "models": [{"name": "m", "params_b": 8}],
            "backends": [{"name": "b", "engine": "vllm", "url": "http://127.0.0.1:9", "model": "m", "gpu": "H100"}],
        }
        return GatewayConfig.model_validate({**base, **changes}, strict=False)

    async def go() -> list[str]:
        cache = ResponseCache(MemoryStore(1 << 20), CollectorRegistry())
        answer = [Chunk(text="a"), Chunk(finish_reason="stop", usage=Usage(1, 1))]
        first = config()
        found = await cache.lookup(first, GEN, "k1", None)
        assert found.key is not None
        await cache.keep(first, found.key, answer, 1)
        reloaded = [
            config(),  # the same file read again: the same version
            config(cache={"enabled": True, "version": "2026-12"}),
            config(models=[{"name": "m", "params_b": 8, "chat_template": "{{ messages }}"}]),
        ]
        return [(await cache.lookup(c, GEN, "k1", None)).header for c in reloaded]

    assert asyncio.run(go()) == ["hit", "miss", "miss"]
