"""Two gateway replicas, one Redis: with ``routing.prefix.share`` a conversation keeps one home.

Each conversation opens on replica A, pinned by a rule to backend ``x`` (as load would place it on
a busy fleet: anywhere but where a replica that never saw it would look), and takes its next turns
on replica B. Without sharing, B knows nothing of the conversation, treats every turn as a new
conversation and sends it to the rendezvous home of its opening, which for about half of them is
``y``: their history is prefilled again there. With sharing, A has told B where the opening went,
and every turn follows it to ``x``. Real gateway processes, real redis-server, trtllm-serve fakes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import httpx
import pytest

from tests.conftest import GatewayProcess, write_config
from tests.contract import fake_trtllm_serve
from tests.contract.control import FakeControl
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread
from tests.polling import wait_until
from tests.tenancy.services import RedisServer

CONVERSATIONS = 8
BUDGET = {"x-ttft-budget-ms": "5000"}
"""Met with room to spare on either backend: the history, not the fakes' speed, decides."""
SYSTEM = "You are the help desk of Acme Corporation: answer in one sentence and name the manual section. " * 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[tuple[RedisServer, str, str]]:
    work = tmp_path_factory.mktemp("share")
    redis = RedisServer(work)
    with ExitStack() as stack:
        engine = TinyEngine(cache_dir)
        x, y = (
            stack.enter_context(serve_in_thread(fake_trtllm_serve.create_app(engine, FakeControl()), "/health"))
            for _ in range(2)
        )
        yield redis, x, y
    redis.stop()


def replicas(
    setup: tuple[RedisServer, str, str], work: Path, cache_dir: Path, share: bool
) -> tuple[GatewayProcess, GatewayProcess]:
    redis, x, y = setup
    config = write_config(
        work / f"share-{share}.yaml",
        f"""
redis: {{url: "{redis.url}"}}
routing:
  prefix: {{share: {str(share).lower()}}}
  rules: [{{name: opening, match: {{headers: {{x-tenant: opening}}}}, require: [x]}}]
models:
  - {{name: enginegate-demo, params_b: 8, dtype: bf16, context: 8192}}
backends:
  - {{name: x, engine: trtllm_serve, url: "{x}", model: enginegate-demo, gpu: H100}}
  - {{name: y, engine: trtllm_serve, url: "{y}", model: enginegate-demo, gpu: H100}}
""",
    )
    return GatewayProcess(config, cache_dir), GatewayProcess(config, cache_dir)


def shared(gateway: GatewayProcess, direction: str) -> float:
    text = httpx.get(f"{gateway.base_url}/metrics", timeout=10).text
    found = re.search(rf'^enginegate_prefix_share_prompts_total{{direction="{direction}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def heard(gateway: GatewayProcess, prompts: int) -> bool:
    return shared(gateway, "received") >= prompts


def homes(a: GatewayProcess, b: GatewayProcess, share: bool) -> list[set[str]]:
    """The backends each conversation's turns went to (its opening through A, three turns through B)."""
    out = []
    with httpx.Client(timeout=60) as client:
        for n in range(CONVERSATIONS):
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Conversation {n}: my badge reader number {n * 7919} is broken. " * 6},
            ]
            seen = set()
            for turn in range(4):
                gateway, headers = (a, {"x-tenant": "opening", **BUDGET}) if turn == 0 else (b, BUDGET)
                if turn == 1 and share:  # B has heard of this opening before its next turn comes
                    wait_until(partial(heard, b, n + 1), timeout=10, message="no news from replica A")
                body = {"model": "enginegate-demo", "messages": messages, "max_tokens": 4}
                resp = client.post(f"{gateway.base_url}/v1/chat/completions", json=body, headers=headers)
                assert resp.status_code == 200, resp.text
                seen.add(resp.headers["x-enginegate-backend"])
                answer = resp.json()["choices"][0]["message"]["content"]
                messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"And {turn}?"}]
            out.append(seen)
    return out


def test_replicas_sharing_prefix_blocks_keep_each_conversation_on_one_backend(
    setup: tuple[RedisServer, str, str], tmp_path: Path, cache_dir: Path
) -> None:
    alone = replicas(setup, tmp_path, cache_dir, share=False)
    try:
        homes_alone = homes(*alone, share=False)
        scattered = [h for h in homes_alone if len(h) > 1]
    finally:
        for g in alone:
            g.stop()
    # Without sharing, the conversations whose rendezvous home is y lose their history there.
    assert scattered, f"no conversation scattered without sharing: the test shows nothing ({homes_alone})"

    together = replicas(setup, tmp_path, cache_dir, share=True)
    try:
        placed = homes(*together, share=True)
        sent = shared(together[0], "sent")
    finally:
        for g in together:
            g.stop()
    assert all(h == {"x"} for h in placed), placed
    assert sent >= CONVERSATIONS
