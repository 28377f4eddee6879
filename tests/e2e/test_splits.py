"""A weighted split in ``enginegate serve`` as users run it: two in-process CTranslate2 engines on the
demo model, the official openai client, the arm in the answer, every turn of a conversation on one
arm, and the per-arm series in /metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import GatewayProcess, write_config

CONFIG = """
models: [{name: enginegate-demo, gguf: "{GGUF}", params_b: 0.00016}]
backends:
  - {name: ct2-control, engine: ctranslate2, model: enginegate-demo, threads: 1}
  - {name: ct2-canary, engine: ctranslate2, model: enginegate-demo, threads: 1}
routing:
  rules:
    - name: trial
      split: [{to: ct2-control, weight: 70, name: control}, {to: ct2-canary, weight: 30, name: canary}]
"""


@pytest.fixture(scope="module")
def split_gateway(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(write_config(tmp_path_factory.mktemp("split") / "split.yaml", CONFIG), cache_dir)
    yield proc
    proc.stop()


def test_a_split_gateway_process_keeps_each_conversation_on_its_arm_and_counts_the_arms(
    split_gateway: GatewayProcess,
) -> None:
    client = openai.OpenAI(base_url=f"{split_gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    arms: dict[int, set[str]] = {}
    backends: dict[str, set[str]] = {"control": set(), "canary": set()}
    for i in range(60):
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"Tell me about topic {i}."}]
        for turn in range(2):
            raw = client.chat.completions.with_raw_response.create(
                model="enginegate-demo", messages=messages, max_tokens=3, temperature=0, stream=turn == 1
            )
            arm = raw.headers["x-enginegate-arm"]
            arms.setdefault(i, set()).add(arm)
            backends[arm].add(raw.headers["x-enginegate-backend"])
            parsed = raw.parse()
            text = (
                "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
                if isinstance(parsed, openai.Stream)
                else parsed.choices[0].message.content or ""
            )
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "And then?"}]
    assert all(len(seen) == 1 for seen in arms.values()), arms
    on_canary = sum(seen == {"canary"} for seen in arms.values())
    assert 6 <= on_canary <= 30, on_canary  # 30% of 60 conversations, give or take
    assert backends == {"control": {"ct2-control"}, "canary": {"ct2-canary"}}
    samples = {
        (s.labels["arm"], s.labels["outcome"]): s.value
        for family in text_string_to_metric_families(httpx.get(f"{split_gateway.base_url}/metrics").text)
        for s in family.samples
        if s.name == "enginegate_split_requests_total"
    }
    assert samples == {("control", "ok"): 2 * (60 - on_canary), ("canary", "ok"): 2 * on_canary}
