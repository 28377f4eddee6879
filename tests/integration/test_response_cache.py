"""The response cache through a real gateway (uvicorn in a thread) in front of engine fakes that count
what reaches them: repeated deterministic requests answered once by the engine (whole and streamed,
the replay read by the official clients), never across keys, never for sampled requests or tools,
never an answer that failed or was cut; in memory and in a real redis-server, with its TTL."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Usage
from gateway.app import create_app
from gateway.cache.stores import PREFIX, RedisStore
from gateway.config import ConfigError, load_config
from gateway.tenancy.keys import digest, new_token
from tests.conftest import write_config
from tests.fakes import ScriptedBackend, factory, serve_in_thread
from tests.polling import wait_until
from tests.tenancy.services import RedisServer

HELLO: Any = [{"role": "user", "content": "Hello"}]
GREEDY = {"temperature": 0}
WORDS = ["The", " cached", " answer", " is", " here"]


def config(cache: str, auth: str = "", redis: str = "") -> str:
    return "\n".join([
        f"cache: {{{cache}}}",
        *([f"auth: {{{auth}}}"] if auth else []),
        *([f"redis: {{{redis}}}"] if redis else []),
        "limits: {health_interval_s: 0.2}",
        "metrics: {protected: false}",
        "models: [{name: m, params_b: 8, price_per_mtok_in: 1000, price_per_mtok_out: 2000},"
        " {name: other, params_b: 8}]",
        "backends:",
        *(
            f"  - {{name: {name}, engine: vllm, url: 'http://127.0.0.1:9', model: {model}, gpu: H100,"
            " capabilities: {enable: [seed, tools]}}"
            for name, model in (("b", "m"), ("o", "other"))
        ),
        "",
    ])  # fmt: skip


class Gateway:
    def __init__(self, base: str, engine: Engine) -> None:
        self.base, self.engine = base, engine

    def client(self, key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=key, max_retries=0, timeout=10)

    def chat(self, key: str = "unused", **params: Any) -> tuple[str, str, str | None]:
        """(x-enginegate-cache, the answer's text, its finish reason), whole."""
        raw = self.client(key).chat.completions.with_raw_response.create(
            model=params.pop("model", "m"), messages=HELLO, **params
        )
        done = raw.parse()
        return raw.headers["x-enginegate-cache"], done.choices[0].message.content or "", done.choices[0].finish_reason

    def streamed(self, key: str = "unused", **params: Any) -> tuple[str, str, str | None]:
        """The same, streamed: the deltas joined as the client reads them."""
        create = self.client(key).chat.completions.with_raw_response.create
        raw = create(model="m", messages=HELLO, stream=True, **params)
        text, finish = [], None
        for chunk in raw.parse():
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        return raw.headers["x-enginegate-cache"], "".join(text), finish

    def metric(self, name: str) -> float:
        for line in httpx.get(f"{self.base}/metrics").raise_for_status().text.splitlines():
            if line.startswith((name + " ", name + "{")):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@dataclass
class Engine(ScriptedBackend):
    """``ScriptedBackend`` at a pace (``pace`` seconds before each word), ending with ``finish``."""

    pace: float = 0.0
    finish: str = "stop"

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.calls += 1
        try:
            for i, word in enumerate(self.words):
                if self.fail_with is not None and i == self.fail_after:
                    raise self.fail_with
                await asyncio.sleep(self.pace)
                yield Chunk(text=word)
            self.finished += 1
            yield Chunk(finish_reason=self.finish, usage=Usage(3, len(self.words)))
        finally:
            self.closed_streams += 1


@contextlib.contextmanager
def serving(tmp_path: Path, text: str) -> Iterator[Gateway]:
    tmp_path.mkdir(exist_ok=True)
    engine = Engine("b", "m", words=list(WORDS))
    other = Engine("o", "other", words=list(WORDS))
    app = create_app(load_config(write_config(tmp_path / "g.yaml", text)), factory({"b": engine, "o": other}))
    with serve_in_thread(app) as base:
        yield Gateway(base, engine)


@pytest.fixture()
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    with serving(tmp_path, config("enabled: true")) as gw:
        yield gw


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_repeated_deterministic_request_is_answered_once_by_the_engine(gateway: Gateway, stream: bool) -> None:
    ask = gateway.streamed if stream else gateway.chat
    first = ask(temperature=0)
    second = ask(temperature=0)
    assert first == ("miss", "".join(WORDS), "stop")
    assert second == ("hit", "".join(WORDS), "stop")
    assert gateway.engine.calls == 1  # the hit never reached an engine
    assert gateway.metric('enginegate_cache_lookups_total{result="hit"}') == 1
    body = httpx.get(f"{gateway.base}/metrics").raise_for_status().text
    assert 'backend="cache"' in body and 'enginegate_cache_stores_total{outcome="stored"} 1.0' in body


def test_a_whole_answer_stored_is_replayed_as_a_stream_and_through_another_door(gateway: Gateway) -> None:
    assert gateway.chat(temperature=0, max_tokens=64)[0] == "miss"
    assert gateway.streamed(temperature=0, max_tokens=64) == ("hit", "".join(WORDS), "stop")
    # This client's ``stream`` no longer names ``temperature``; the Messages API still takes it.
    claude = anthropic.Anthropic(base_url=gateway.base, api_key="unused", max_retries=0, timeout=10)
    with claude.messages.stream(model="m", max_tokens=64, messages=HELLO, extra_body=GREEDY) as events:
        assert events.get_final_text() == "".join(WORDS)
        assert events.response.headers["x-enginegate-cache"] == "hit"
    responses = gateway.client().responses.with_raw_response.create(
        model="m", input=HELLO, temperature=0, max_output_tokens=64, stream=True
    )
    text = "".join(e.delta for e in responses.parse() if e.type == "response.output_text.delta")
    assert (responses.headers["x-enginegate-cache"], text) == ("hit", "".join(WORDS))
    assert gateway.engine.calls == 1


def test_sampled_requests_are_never_cached_and_a_fixed_seed_is(gateway: Gateway) -> None:
    assert [gateway.chat(temperature=0.8)[0] for _ in range(2)] == ["bypass", "bypass"]
    assert [gateway.chat()[0] for _ in range(2)] == ["bypass", "bypass"]  # the default temperature samples
    assert gateway.engine.calls == 4
    assert [gateway.chat(temperature=0.8, seed=7)[0] for _ in range(2)] == ["miss", "hit"]
    assert gateway.chat(temperature=0.8, seed=8)[0] == "miss"  # another seed, another answer
    assert gateway.chat(temperature=0, max_tokens=5)[0] == "miss"  # another parameter, another answer
    assert gateway.chat(temperature=0, model="other")[0] == "miss"  # another model, another answer
    assert gateway.engine.calls == 7
    assert gateway.metric('enginegate_cache_lookups_total{result="bypass_sampled"}') == 4


TOOLS: Any = [{"type": "function", "function": {"name": "send_mail", "parameters": {"type": "object"}}}]


def test_requests_with_tools_are_cached_only_when_the_config_says_so(tmp_path: Path) -> None:
    for allowed, expected in ((False, ["bypass", "bypass"]), (True, ["miss", "hit"])):
        text = config(f"enabled: true, cache_tools: {str(allowed).lower()}")
        with serving(tmp_path / str(allowed), text) as gateway:
            assert [gateway.chat(temperature=0, tools=TOOLS)[0] for _ in range(2)] == expected


def keys(n: int, teams: list[str]) -> tuple[list[str], str]:
    """``n`` tokens, and the ``auth.keys`` that declare them (with their teams)."""
    made = [new_token() for _ in range(n)]
    rows = (f"{{id: '{i}', sha256: '{digest(t)}', team: {team}}}" for (i, t), team in zip(made, teams, strict=True))
    declared = ", ".join(rows)
    return [t for _, t in made], f"required: true, keys: [{declared}]"


@pytest.mark.parametrize(("scope", "third"), [("key", "miss"), ("team", "hit"), ("global", "hit")])
def test_no_key_reads_another_keys_answers_unless_the_scope_shares_them(tmp_path: Path, scope: str, third: str) -> None:
    (a, b, c), auth = keys(3, ["red", "blue", "red"])
    with serving(tmp_path, config(f"enabled: true, scope: {scope}", auth)) as gateway:
        assert [gateway.chat(a, temperature=0)[0] for _ in range(2)] == ["miss", "hit"]
        assert gateway.chat(b, temperature=0)[0] == ("hit" if scope == "global" else "miss")
        assert gateway.chat(c, temperature=0)[0] == third  # c is in a's team
        with pytest.raises(openai.AuthenticationError):
            gateway.chat("sk-eg-00000000_" + "x" * 43, temperature=0)


def test_a_hit_counts_against_the_keys_rate_limit_but_is_not_charged(tmp_path: Path) -> None:
    (a,), auth = keys(1, ["red"])
    auth = auth.replace("team: red}", "team: red, rpm: 3}")
    with serving(tmp_path, config("enabled: true", auth)) as gateway:
        assert gateway.chat(a, temperature=0)[0] == "miss"
        spent = gateway.metric('enginegate_team_spend_usd_total{team="red"}')
        assert spent > 0
        assert [gateway.chat(a, temperature=0)[0] for _ in range(2)] == ["hit", "hit"]
        assert gateway.metric('enginegate_team_spend_usd_total{team="red"}') == spent  # no engine worked
        with pytest.raises(openai.RateLimitError):
            gateway.chat(a, temperature=0)  # the hits were requests all the same
        assert gateway.engine.calls == 1


def test_an_answer_that_failed_or_was_cut_is_never_stored(gateway: Gateway) -> None:
    gateway.engine.fail_with, gateway.engine.fail_after = BackendError(ErrorKind.UPSTREAM, "engine died"), 2
    with pytest.raises(openai.APIError):
        gateway.streamed(temperature=0)  # two words, then the engine fails: an error event ends the stream
    with pytest.raises(openai.APIError):
        gateway.chat(temperature=0)
    gateway.engine.fail_with = None
    calls = gateway.engine.calls
    assert gateway.streamed(temperature=0) == ("miss", "".join(WORDS), "stop")  # the retry goes to the engine
    assert gateway.engine.calls == calls + 1
    assert gateway.chat(temperature=0)[0] == "hit"
    assert gateway.metric('enginegate_cache_stores_total{outcome="stored"}') == 1  # the failed two never offered


def test_a_filtered_answer_is_never_stored(gateway: Gateway) -> None:
    gateway.engine.finish = "content_filter"
    assert [gateway.chat(temperature=0)[0] for _ in range(2)] == ["miss", "miss"]
    assert gateway.engine.calls == 2
    assert gateway.metric('enginegate_cache_stores_total{outcome="unfinished"}') == 2


def test_a_client_that_leaves_mid_stream_leaves_nothing_in_the_cache(gateway: Gateway) -> None:
    gateway.engine.pace = 0.3
    body = {"model": "m", "messages": HELLO, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{gateway.base}/v1/chat/completions", json=body, timeout=10) as response:
        assert response.headers["x-enginegate-cache"] == "miss"
        next(response.iter_raw())  # the first event, then the client goes
    assert gateway.chat(temperature=0)[0] == "miss"
    wait_until(lambda: gateway.engine.closed_streams == 2, message="the engine's streams were not closed")
    assert gateway.engine.finished == 1  # the stream the client left was cut: only the second answer ended
    gateway.engine.pace = 0.0
    assert gateway.streamed(temperature=0)[0] == "hit"
    assert gateway.metric('enginegate_cache_stores_total{outcome="stored"}') == 1


def test_answers_are_shared_through_redis_and_expire(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    try:
        text = config("enabled: true, ttl_s: 1", redis=f"url: '{server.url}'")
        # Two replicas, one Redis.
        with serving(tmp_path / "one", text) as one, serving(tmp_path / "two", text) as two:
            assert one.streamed(temperature=0)[0] == "miss"
            assert two.streamed(temperature=0) == ("hit", "".join(WORDS), "stop")
            assert two.engine.calls == 0
            wait_until(lambda: one.chat(temperature=0)[0] == "miss", timeout=20, interval=0.1, message="never expired")
            server.stop()  # Redis gone: the engine answers, never an error
            assert one.chat(temperature=0)[0] == "bypass"
            assert one.metric('enginegate_cache_lookups_total{result="error"}') >= 1
    finally:
        server.stop()


def test_the_redis_store_keeps_the_sum_of_its_entries_under_its_cap(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)

    async def go() -> list[bytes | None]:
        store = RedisStore(server.url, max_bytes=1000, timeout_s=1, retry_s=1)
        for i in range(5):
            await store.put(f"k{i}", bytes([65 + i]) * 400, 60)
        await store.put("k4", b"E" * 400, 60)  # stored again: counted once
        found = [await store.get(f"k{i}") for i in range(5)]
        await store.aclose()
        return found

    try:
        found = asyncio.run(go())
        assert found == [None, None, None, b"D" * 400, b"E" * 400]
        assert int(redis.Redis.from_url(server.url).get(PREFIX + "bytes") or 0) == 800
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("cache", "redis", "message"),
    [
        ("enabled: true, store: redis", "", "cache.store: 'redis' needs redis.url"),
        ("enabled: true, max_bytes: 2048, max_entry_bytes: 4096", "", "must not exceed max_bytes"),
        ("enabled: true, scope: tenant", "", "cache.scope"),
        ("enabled: true, ttl: 5", "", "cache.ttl"),
    ],
)
def test_a_bad_cache_section_is_a_clear_error(tmp_path: Path, cache: str, redis: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path / "g.yaml", config(cache, redis=redis)))
    assert any(p.startswith(f"{tmp_path / 'g.yaml'}:1: ") and message in p for p in caught.value.problems), caught.value
