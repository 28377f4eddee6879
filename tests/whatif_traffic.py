"""Traffic for the what-if tests: fake engines that answer as many tokens as asked, and a seeded mix of
chat requests (two models, budgets, tenants, streams) sent through a real gateway app.

``python -m tests.whatif_traffic`` records ``tests/data/whatif/requests.jsonl``: the gateway's own
request log (JSON lines) of that traffic on ``tests/data/whatif/old.yaml``, paced at about 4 requests/s.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from backends.base import Backend, Chunk, GenerationRequest, Health, Load, Usage
from gateway.config import BackendConfig, LoadedConfig, load_config
from gateway.telemetry.logs import JsonFormatter

DATA = Path(__file__).resolve().parent / "data" / "whatif"


@dataclass
class SizedBackend:
    """Answers ``max_tokens`` words (16 when unbounded), counting the prompt at four characters a token."""

    name: str
    model: str

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        words = request.max_tokens or 16
        for _ in range(words):
            await asyncio.sleep(0)
            yield Chunk(text=" w")
        prompt = sum(len(str(m.get("content", ""))) for m in request.messages or ()) // 4
        yield Chunk(finish_reason="stop", usage=Usage(max(1, prompt), words))

    async def health(self) -> Health:
        return Health(ok=True)

    async def load(self) -> Load | None:
        return Load(running=0, waiting=0)

    def models(self) -> list[str]:
        return [self.model]

    async def aclose(self) -> None:
        pass


def sized(cfg: BackendConfig, loaded: LoadedConfig) -> Backend:
    return SizedBackend(cfg.name, cfg.model)


async def send(client: httpx.AsyncClient, count: int, pace_s: float = 0.0, seed: int = 7) -> None:
    """``count`` chat requests: 75% for the 8B model; half interactive (first token within 500 ms),
    a quarter agent steps (whole answer within 20 s), the rest without a budget; a third streamed."""
    rng = random.Random(seed)
    for i in range(count):
        headers = {}
        kind = rng.random()
        if kind < 0.5:
            headers["x-ttft-budget-ms"] = "500"
        elif kind < 0.75:
            headers["x-latency-budget-ms"] = "20000"
        if rng.random() < 0.3:
            headers["x-tenant"] = rng.choice(("acme", "globex"))
        body = {
            "model": "llama-3.1-8b" if rng.random() < 0.75 else "llama-3.1-70b",
            "messages": [{"role": "user", "content": "word " * rng.randint(50, 2000)}],
            "max_tokens": rng.randint(20, 400),
            "stream": rng.random() < 0.33,
        }
        answer = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        if pace_s:
            await asyncio.sleep(pace_s)
        del i


def capture(path: Path) -> Callable[[], None]:
    """Write the gateway's request log to ``path`` as ``serve --log-format json`` does; returns the undo."""
    handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("enginegate.request")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    def undo() -> None:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()

    return undo


async def record(config: Path, out: Path, count: int, pace_s: float) -> None:
    from gateway.app import create_app
    from tests.fakes import serve_in_thread

    with serve_in_thread(create_app(load_config(config), sized)) as base:
        undo = capture(out)  # after uvicorn configured logging: its dictConfig closes handlers it finds
        try:
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                await send(client, count, pace_s)
        finally:
            undo()


if __name__ == "__main__":
    asyncio.run(record(DATA / "old.yaml", DATA / "requests.jsonl", int(sys.argv[1]) if len(sys.argv) > 1 else 60, 0.25))
