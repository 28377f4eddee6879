"""Prefix-cache-aware routing on real engines: two llama-server processes behind a real gateway.

Conversations share a system prompt and grow turn by turn. The same workload (with its own system
prompt, so nothing carries over) goes once through the gateway and once round robin straight to the
engines. The engines' own counters (``llamacpp:prompt_tokens_cached_total``) say how many prompt
tokens each placement let them reuse. Each engine keeps only what its four slots hold
(``--cache-ram 0``: no host-memory prompt cache), so placement decides what is reused: eight
conversations fit in the two engines' eight slots only if each stays where it began.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.conftest import GatewayProcess, write_config
from tests.contract.engines import SERVED, llama_server

CONVERSATIONS = 8
TURNS = 8
SEED = 15
SLOTS = 4
ENGINE_ARGS = ("-np", str(SLOTS), "-c", str(SLOTS * 4096), "--cache-ram", "0", "--slot-prompt-similarity", "0.5")
"""Four slots and nothing beyond them; a request takes the slot whose prompt it shares half of (the
default, a tenth, hands a new conversation the slot of another that shares its system prompt)."""
BUDGET = {"x-ttft-budget-ms": "5000"}
"""What a chat client states: met with room to spare on either engine, so engine speed (noisy on a
shared two-core machine) does not decide, the expected cache and the conversation's home do."""
TOPICS = (
    "printer", "password", "invoice", "laptop battery", "VPN", "calendar", "badge reader", "monitor",
)  # fmt: skip


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with ExitStack() as stack:
        urls = [stack.enter_context(llama_server(tmp_path_factory.mktemp(f"llama-{n}"), *ENGINE_ARGS)) for n in "ab"]
        yield urls[0], urls[1]


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, engines: tuple[str, str]
) -> Iterator[GatewayProcess]:
    a, b = engines
    LIMITS = f"max_concurrency: {SLOTS}"  # noqa: N806
    config = write_config(
        tmp_path_factory.mktemp("prefix") / "prefix.yaml",
        f"""
models:
  - {{name: {SERVED}, gguf: "{{GGUF}}"}}
backends:
  - {{name: llama-a, engine: llama_server, model: {SERVED}, url: "{a}", {LIMITS}}}
  - {{name: llama-b, engine: llama_server, model: {SERVED}, url: "{b}", {LIMITS}}}
""",
    )
    proc = GatewayProcess(config, cache_dir)
    yield proc
    proc.stop()


def engine_counter(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(rf"^llamacpp:{name} (\S+)$", text, re.M)
    assert found is not None, text
    return float(found.group(1))


def converse(run: str, send: Callable[[list[dict[str, str]]], str]) -> None:
    """Every conversation takes its turns; within a turn they come in a shuffled (seeded) order."""
    system = (
        f"[{run}] You are the help desk assistant of Acme Corporation. Answer in one short sentence, name "
        "the manual section you used, never ask for passwords, and send hardware faults to the on-site team "
        "with the asset tag. Keep a friendly tone."
    )  # longer than the 256 characters the old affinity hashed: that sent every conversation to one engine
    histories = [[{"role": "system", "content": system}] for _ in range(CONVERSATIONS)]
    rng = random.Random(SEED)
    for turn in range(TURNS):
        for c in rng.sample(range(CONVERSATIONS), CONVERSATIONS):
            ask = f"Turn {turn}: my {TOPICS[c]} still misbehaves after what you said; what should I try next? " * 6
            histories[c].append({"role": "user", "content": ask})
            assert send(histories[c])
            # A fixed reply keeps every run's prompts the same (the demo model's greedy answers can
            # vary with batching); the engine then reuses the prompt, not its own answer.
            histories[c].append({"role": "assistant", "content": "Restart it, then see section 4 of the manual."})


def reply(resp: httpx.Response) -> str:
    assert resp.status_code == 200, resp.text
    return str(resp.json()["choices"][0]["message"]["content"])


def body(messages: list[dict[str, str]]) -> dict[str, object]:
    return {"model": SERVED, "messages": messages, "max_tokens": 4, "temperature": 0}


def reused(engines: tuple[str, str], run: Callable[[], None]) -> list[float]:
    before = [engine_counter(u, "prompt_tokens_cached_total") for u in engines]
    run()
    return [engine_counter(u, "prompt_tokens_cached_total") - b for u, b in zip(engines, before, strict=True)]


def test_the_gateway_lets_engines_reuse_twice_the_prompt_tokens_round_robin_does(
    gateway: GatewayProcess, engines: tuple[str, str]
) -> None:
    placed: Counter[str] = Counter()
    with httpx.Client(timeout=60) as client:

        def through_gateway(messages: list[dict[str, str]]) -> str:
            resp = client.post(f"{gateway.base_url}/v1/chat/completions", json=body(messages), headers=BUDGET)
            placed[resp.headers["x-enginegate-backend"]] += 1
            return reply(resp)

        turn = iter(range(10**6))

        def round_robin(messages: list[dict[str, str]]) -> str:
            url = engines[next(turn) % 2]
            return reply(client.post(f"{url}/v1/chat/completions", json=body(messages)))

        ours = reused(engines, lambda: converse("gateway", through_gateway))
        theirs = reused(engines, lambda: converse("round robin", round_robin))
        metrics = client.get(f"{gateway.base_url}/metrics").text

    print(f"cached prompt tokens: gateway {ours}, round robin {theirs}; gateway placement {dict(placed)}")
    assert sum(ours) >= 2 * sum(theirs) > 0
    requests = CONVERSATIONS * TURNS
    assert sum(placed.values()) == requests and max(placed.values()) <= 1.25 * requests / 2
    # The gateway counts what the engines reported reusing, per backend.
    for name, tokens in zip(("llama-a", "llama-b"), ours, strict=True):
        found = re.search(rf'^enginegate_prompt_tokens_cached_total\{{backend="{name}"\}} (\S+)$', metrics, re.M)
        assert found is not None and float(found.group(1)) == tokens
