"""``POST /admin/route/explain`` with a prompt: the cached tokens each backend is expected to hold.

A real gateway (two CTranslate2 engines in process on the demo model) answers a chat; explaining the
chat's next turn then shows that turn's exact prompt tokens (the model's tokenizer) and its history
expected in cache on the backend that answered, none on the other.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from gateway.config import load_config
from tests.conftest import write_config
from tests.fakes import serve_in_thread

ADMIN = {"authorization": "Bearer admin-secret"}
SYSTEM = "You are the help desk of Acme Corporation. Answer in one sentence and name the manual section. " * 8


def test_explaining_a_prompt_shows_its_history_cached_where_it_was_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EG_TEST_ADMIN", "admin-secret")
    config = write_config(
        tmp_path / "explain.yaml",
        """
admin: {api_key_env: EG_TEST_ADMIN}
routing: {prefix: {block_tokens: 16}}
models: [{name: m, gguf: "{GGUF}"}]
backends:
  - {name: one, engine: ctranslate2, model: m}
  - {name: two, engine: ctranslate2, model: m}
""",
    )
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the Zen of Python?"}]
    with serve_in_thread(create_app(load_config(config))) as base:
        resp = httpx.post(
            f"{base}/v1/chat/completions", json={"model": "m", "messages": chat, "max_tokens": 8}, timeout=60
        )
        assert resp.status_code == 200, resp.text
        answered = resp.headers["x-enginegate-backend"]
        prompt_tokens = resp.json()["usage"]["prompt_tokens"]
        turn = [*chat, resp.json()["choices"][0]["message"], {"role": "user", "content": "And the next line?"}]
        turn[2] = {"role": "assistant", "content": turn[2]["content"]}
        explain = httpx.post(
            f"{base}/admin/route/explain", json={"model": "m", "messages": turn}, headers=ADMIN, timeout=30
        )
        assert explain.status_code == 200, explain.text
        doc = explain.json()
        cached = {c["backend"]: c["cached_tokens"] for c in doc["candidates"]}
        assert cached[answered] > 0.5 * prompt_tokens
        assert cached[next(name for name in cached if name != answered)] == 0
        both = httpx.post(
            f"{base}/admin/route/explain",
            json={"model": "m", "messages": turn, "prompt": "x"},
            headers=ADMIN,
            timeout=30,
        )
        assert both.status_code == 400 and "not both" in both.text
