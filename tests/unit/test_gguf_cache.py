"""GGUF files parsed once per file, and big prompts tokenized off the event loop."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import backends.ct2_convert as ct2_convert
from backends.base import GenerationRequest
from backends.gguf_file import GgufCache
from backends.text import INLINE_PROMPT_CHARS, sized_work
from gateway.config import load_config
from gateway.fleet import catalog
from gateway.fleet.catalog import MAX_EXACT_PROMPT_CHARS, PromptCounter, model_specs, prompt_counters
from tests.conftest import DEMO_GGUF, write_config


def test_catalog_and_counters_share_one_parse_per_file(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        """
models: [{name: m, gguf: "{GGUF}"}, {name: n, gguf: "{GGUF}"}]
backends: [{name: a, engine: ctranslate2, model: m}, {name: b, engine: ctranslate2, model: n}]
""",
    )
    loaded = load_config(config)
    ggufs = GgufCache()
    model_specs(loaded, ggufs)
    counters = prompt_counters(loaded, ggufs)
    model_specs(loaded, ggufs)
    assert ggufs.parsed == 1
    assert counters["m"]._tokenizer is counters["n"]._tokenizer


def test_a_replaced_file_is_parsed_again(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    shutil.copy(DEMO_GGUF, path)
    ggufs = GgufCache()
    first = ggufs.header(path)
    assert ggufs.header(path) is first
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert ggufs.header(path) is not first and ggufs.parsed == 2


def test_deriving_an_already_converted_model_reads_no_tensors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ggufs = GgufCache()
    target, _ = ct2_convert.derive(DEMO_GGUF, tmp_path, ggufs)

    def no_tensors(*args: object, **kwargs: object) -> None:
        raise AssertionError("tensors read for a model already converted")

    monkeypatch.setattr(ct2_convert, "read_gguf", no_tensors)
    again, header = ct2_convert.derive(DEMO_GGUF, tmp_path, ggufs)
    assert again == target and header.tensors == {} and ggufs.parsed == 1


def chat(chars: int) -> GenerationRequest:
    words = "Beautiful is better than ugly. "
    return GenerationRequest(
        "r", "m", messages=[{"role": "user", "content": (words * (chars // len(words) + 1))[:chars]}]
    )


async def max_loop_gap(work: asyncio.Future[Any]) -> float:
    """The longest the event loop went without running a 1 ms ticker while ``work`` ran."""
    gap, last = 0.0, time.perf_counter()
    while not work.done():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gap, last = max(gap, now - last), now
    return gap


def test_a_big_prompt_is_counted_in_a_thread_and_the_loop_keeps_running() -> None:
    counter = PromptCounter(DEMO_GGUF, GgufCache())
    big = chat(MAX_EXACT_PROMPT_CHARS - 1000)
    inline_s = time.perf_counter()
    exact = counter.count(big)
    inline_s = time.perf_counter() - inline_s

    async def main() -> tuple[int | None, float]:
        task = asyncio.ensure_future(counter.measure(big))
        gap = await max_loop_gap(task)
        return await task, gap

    measured, gap = asyncio.run(main())
    assert measured == exact
    # Counting it inline holds the loop for all of inline_s (~0.3 s); in a thread the loop ticks on.
    assert gap < max(0.05, inline_s / 4), f"loop stalled {gap * 1000:.0f} ms; counting takes {inline_s * 1000:.0f} ms"


def test_prompts_too_big_to_count_or_beyond_the_thread_cap_use_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = PromptCounter(DEMO_GGUF, GgufCache())
    release = threading.Event()
    real_count = counter.count

    def slow_count(request: GenerationRequest) -> int:
        release.wait(10)
        return real_count(request)

    async def main() -> None:
        assert await counter.measure(chat(MAX_EXACT_PROMPT_CHARS + 1)) is None
        assert await counter.measure(chat(100)) == real_count(chat(100))  # small: inline, exact
        monkeypatch.setattr(counter, "count", slow_count)
        busy = [
            asyncio.ensure_future(counter.measure(chat(INLINE_PROMPT_CHARS + 1)))
            for _ in range(catalog.MAX_THREADED_COUNTS)
        ]
        await asyncio.sleep(0)
        assert await counter.measure(chat(INLINE_PROMPT_CHARS + 1)) is None  # both threads taken
        release.set()
        assert all(isinstance(n, int) for n in await asyncio.gather(*busy))
        monkeypatch.setattr(counter, "count", real_count)
        assert await counter.measure(chat(INLINE_PROMPT_CHARS + 1)) is not None  # freed again

    asyncio.run(main())


def test_engines_prepare_small_prompts_inline_and_big_ones_in_a_thread() -> None:
    async def where(request: GenerationRequest) -> int:
        return await sized_work(request, lambda _: threading.get_ident())

    async def main() -> None:
        here = threading.get_ident()
        assert await where(chat(100)) == here
        assert await where(chat(INLINE_PROMPT_CHARS + 1)) != here

    asyncio.run(main())
