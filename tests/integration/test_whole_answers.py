"""A client that does not stream gets its answer from an engine asked for a whole answer (``stream:
false``), not a stream collected by the gateway: through a real gateway with the official ``openai``
client and vLLM's contract fake, which records every body it is sent. Where the attempt needs the first
token before the end (hedging against a time-to-first-token budget, or an engine that is queueing, for
admission by queue wait), the engine is still asked for a stream. The answer is the same either way,
usage and finish reason included, and a whole answer's time is never shown as a time to first token.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from backends.base import GenerationRequest
from gateway.app import create_app
from gateway.config import load_config
from gateway.pipeline.generation import LEARNING, SAMPLE_EVERY_S, STREAM_EVERY, needs_first
from tests.conftest import write_config
from tests.contract import fake_vllm
from tests.contract.fake_vllm import FakeVLLM
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread

HELLO: Any = [{"role": "user", "content": "Hello"}]


@dataclass
class Fleet:
    base: str
    engines: list[FakeVLLM]
    app: Any = None

    def learned(self) -> dict[str, tuple[int, float | None]]:
        """Per backend: answers the estimator learned from, and the per-token pace it learned."""
        entries = self.app.state.fleet.entries
        return {name: (e.observed.samples, e.observed.tpot_ms) for name, e in entries.items()}

    def mark(self) -> list[int]:
        return [len(engine.received) for engine in self.engines]

    def sent_since(self, mark: list[int]) -> list[dict[str, Any]]:
        """Every body the engines were sent since ``mark``."""
        return [b for engine, n in zip(self.engines, mark, strict=True) for b in engine.received[n:]]

    def streams_since(self, mark: list[int]) -> list[bool]:
        return sorted(bool(b["stream"]) for b in self.sent_since(mark))

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Fleet]:
    engine = TinyEngine(cache_dir)
    apps = [fake_vllm.create_app(engine) for _ in range(2)]
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_in_thread(app, "/health")) for app in apps]
        backends = "\n".join(
            f"  - {{name: v{i}, model: m, engine: vllm, url: {u}, served_model: enginegate-demo}}"
            for i, u in enumerate(urls)
        )
        config = write_config(
            tmp_path_factory.mktemp("whole") / "c.yaml",
            f'routing: {{hedging: true}}\nmodels: [{{name: m, gguf: "{{GGUF}}"}}]\nbackends:\n{backends}\n',
        )
        gateway = create_app(load_config(config))
        base = stack.enter_context(serve_in_thread(gateway))
        fleet = Fleet(base, [app.state.fake for app in apps], gateway)
        # A backend's first answers are streamed, for its estimate to learn from (``LEARNING``).
        client = fleet.client()
        for _ in range(LEARNING * 2 + 2):
            mark = fleet.mark()
            client.chat.completions.create(model="m", messages=HELLO, max_tokens=60, temperature=0)
            if fleet.streams_since(mark) == [False]:
                break
        else:
            raise AssertionError("never asked whole")
        yield fleet


def _ttft_count(base: str) -> float:
    text = httpx.get(f"{base}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("enginegate_time_to_first_token_seconds_count")
    )


def test_a_whole_answer_is_asked_whole_and_is_the_streamed_answer(fleet: Fleet) -> None:
    client = fleet.client()
    mark, ttfts, learned = fleet.mark(), _ttft_count(fleet.base), fleet.learned()
    whole = client.chat.completions.create(model="m", messages=HELLO, max_tokens=60, temperature=0)
    sent = fleet.sent_since(mark)
    assert [b["stream"] for b in sent] == [False] and "stream_options" not in sent[0]
    assert _ttft_count(fleet.base) == ttfts, "a whole answer's time is not a time to first token"
    assert fleet.learned() == learned, "nothing is learned from a whole answer (it shows no first token)"

    streamed = client.chat.completions.create(
        model="m", messages=HELLO, max_tokens=60, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(streamed)
    assert fleet.streams_since(mark) == [False, True]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
    usage = chunks[-1].usage
    assert whole.choices[0].message.content == text and text
    assert whole.choices[0].finish_reason == finish == "stop"
    assert whole.usage is not None and usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens)


def test_a_whole_answer_that_may_be_hedged_is_streamed_by_the_engine(fleet: Fleet) -> None:
    """Hedging starts the next backend when the first token is late against the budget: only a stream
    tells when it came."""
    mark = fleet.mark()
    answer = fleet.client().chat.completions.create(
        model="m", messages=HELLO, max_tokens=8, extra_headers={"x-ttft-budget-ms": "60000"}
    )
    assert answer.choices[0].finish_reason == "length"
    assert fleet.streams_since(mark) == [True]


def test_an_engine_that_is_queueing_streams_the_whole_answer() -> None:
    """Admission by queue wait gives up on a request still queued without a first token: on an engine
    that is queueing, the attempt needs the first token; elsewhere the answer is asked whole."""
    queueing = {"busy": 3.0, "idle": None}
    state: Any = SimpleNamespace(fleet=SimpleNamespace(queue_wait_s=lambda target: queueing[target.name]))
    learned = SimpleNamespace(samples=LEARNING)
    busy: Any = SimpleNamespace(name="busy", observed=learned, whole_asks=0)
    idle: Any = SimpleNamespace(name="idle", observed=learned, whole_asks=0)
    assert (needs_first(state, False)(busy), needs_first(state, False)(idle)) == (True, False)
    assert (needs_first(state, True)(busy), needs_first(state, True)(idle)) == (True, True)
    assert GenerationRequest("r", "m").whole is False, "an adapter driven directly streams unless told"


def test_a_backends_estimate_keeps_learning_from_streamed_whole_answers() -> None:
    """A whole answer shows no time to first token: a backend's first ``LEARNING`` whole answers are
    streamed, and after that every ``STREAM_EVERY``-th, at most one per ``SAMPLE_EVERY_S``."""
    state: Any = SimpleNamespace(fleet=SimpleNamespace(queue_wait_s=lambda target: None))
    target: Any = SimpleNamespace(name="b", observed=SimpleNamespace(samples=0), whole_asks=0, sampled_at=float("-inf"))
    now = [100.0]
    needs = needs_first(state, False, lambda: now[0])
    assert needs(target) and target.whole_asks == 0
    target.observed.samples = LEARNING

    def asked(count: int, pace_s: float) -> list[bool]:
        out = []
        for _ in range(count):
            out.append(needs(target))
            now[0] += pace_s
        return out

    slow = asked(STREAM_EVERY * 2, SAMPLE_EVERY_S)  # a second between answers: every STREAM_EVERY-th
    assert slow.count(True) == 2 and slow[STREAM_EVERY - 1] and slow[-1]
    # A thousand answers a second for 3.2 s: the 16th (a second after the last sample), then one a
    # second, whatever the count.
    fast = asked(STREAM_EVERY * 200, 0.001)
    assert [i for i, streamed in enumerate(fast) if streamed] == [15, 1015, 2015, 3015]


def test_with_ask_whole_off_every_engine_streams(tmp_path: Path, cache_dir: Path) -> None:
    app = fake_vllm.create_app(TinyEngine(cache_dir))
    with serve_in_thread(app, "/health") as url:
        config = write_config(
            tmp_path / "c.yaml",
            'routing: {ask_whole: false}\nmodels: [{name: m, gguf: "{GGUF}"}]\n'
            f"backends: [{{name: v, model: m, engine: vllm, url: {url}, served_model: enginegate-demo}}]\n",
        )
        with serve_in_thread(create_app(load_config(config))) as base:
            client = Fleet(base, [app.state.fake]).client()
            assert client.chat.completions.create(model="m", messages=HELLO, max_tokens=4).choices[0].message.content
    assert [b["stream"] for b in app.state.fake.received] == [True]
