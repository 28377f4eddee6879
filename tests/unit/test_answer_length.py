"""The answer's default length: the engine's context learned (published or refused), the prompt counted
to err long, an engine's refusal read for its figures and answered once more, ``min_tokens`` held to
the length, and ``config check`` warning of engines holding less context than their model entry."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Usage
from backends.capabilities import PLAIN
from backends.http_base import HttpSettings
from backends.http_errors import context_figures, from_event, from_response
from backends.llama_server import LlamaServerBackend
from backends.tgi import TgiBackend
from backends.vllm import VLLMBackend
from gateway.config import load_config
from gateway.pipeline.shaping import open_answer, open_sized, prompt_bound, resized
from gateway.state import AppState
from tests.conftest import ROOT, write_config
from tests.contract import fake_vllm
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import ScriptedBackend, serve_in_thread

# Context refusals as each engine words them (vLLM >= 0.10.1 and before, TGI, trtllm-serve's TensorRT and
# PyTorch backends, llama-server since 2025 and before, the in-process engines): (limit, prompt).
REFUSALS = [
    (
        "'max_tokens' or 'max_completion_tokens' is too large: 8189. This model's maximum context length is 4096 "
        "tokens and your request has 7 input tokens (8189 > 4096 - 7).",
        (4096, 7),
    ),
    (
        "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. "
        "Please reduce the length of the input messages.",
        (4096, 5000),
    ),
    (
        "This model's maximum context length is 2048 tokens. However, you requested 2723 tokens (1699 in the "
        "messages, 1024 in the completion). Please reduce the length of the messages or completion.",
        (2048, 1699),
    ),
    (
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 300. Given: 250 `inputs` tokens "
        "and 60 `max_new_tokens`",
        (300, 250),
    ),
    (
        "The sum of prompt length (4000.0) and query length (0) max_tokens (2048) should not exceed max_seq_len (4096)",
        (4096, 4000),
    ),
    (
        "`default_max_tokens` (-152) must be greater than 0, `default_max_tokens` (-152) = max_seq_len (8192) - "
        "`splited_prompt_len` (8000) - `query_token_len` (344)",
        (8192, 8344),
    ),
    ("request (9412 tokens) exceeds the available context size (8192 tokens), try increasing it", (8192, 9412)),
    (
        "This model's maximum context length is 4096 tokens. However, your messages resulted in 4100 tokens.",
        (4096, 4100),
    ),
    (
        "You passed 90000 input characters and requested 100 output tokens. However, the model's context length "
        "is only 8192 tokens, resulting in a maximum input length of 8092 tokens.",
        (8192, None),
    ),
    ("max_tokens=5000 cannot be greater than max_model_len=4096.", (4096, None)),
    ("the request exceeds the available context size, try increasing it", (None, None)),
    ("`top_p` must be > 0.0 and < 1.0", (None, None)),
]


@pytest.mark.parametrize(("text", "figures"), REFUSALS)
def test_context_refusals_name_the_engine_limit_and_prompt(text: str, figures: tuple[int | None, int | None]) -> None:
    assert context_figures(text) == figures


def test_every_context_refusal_is_a_context_error() -> None:
    for text, _ in REFUSALS[:-1]:
        err = from_response("e", 400, b'{"error": {"message": %s}}' % repr(text).replace("'", '"').encode(), {})
        assert err.kind is ErrorKind.CONTEXT_LENGTH, text
    tgi_input = (
        b'{"error":"Input validation error: `inputs` must have less than 768 tokens. Given: 810",'
        b'"error_type":"validation"}'
    )
    assert from_response("e", 422, tgi_input, {}).kind is ErrorKind.CONTEXT_LENGTH


def test_a_refusal_inside_a_stream_reads_as_the_engine_refusing_the_request() -> None:
    """TGI validates inside its 200 stream: the client, who may have asked for a whole answer, reads no
    stream error."""
    doc = {"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 1024. Given: 900 "
           "`inputs` tokens and 200 `max_new_tokens`", "error_type": "validation"}  # fmt: skip
    err = from_event("tgi-1", doc)
    assert err.kind is ErrorKind.CONTEXT_LENGTH
    assert err.message.startswith("tgi-1 refused the request: Input validation error")
    overloaded = from_event("tgi-1", {"error": "Model is overloaded", "error_type": "overloaded"})
    assert overloaded.message == "tgi-1 stream error: the engine is overloaded"


def chat(*contents: str, **kw: Any) -> GenerationRequest:
    return GenerationRequest("r", "m", messages=[{"role": "user", "content": c} for c in contents], **kw)


def test_an_exact_count_is_the_prompt_and_an_estimate_errs_long() -> None:
    assert prompt_bound(chat("Hello"), 17) == 17
    # ceil(1.25 * 5 / 4) + 32 of template + 8 for the message
    assert prompt_bound(chat("Hello"), None) == 2 + 32 + 8
    assert prompt_bound(chat("a" * 400, "b" * 400), None) == 250 + 32 + 16
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with_tools = prompt_bound(chat("a" * 400, tools=(tool,)), None)
    assert with_tools > prompt_bound(chat("a" * 400), None) + 128
    image = {"role": "user", "content": [{"type": "text", "text": "a" * 40}, {"type": "image_url", "image_url": {}}]}
    assert prompt_bound(GenerationRequest("r", "m", messages=[image]), None) == 13 + 32 + 8 + 1024
    assert prompt_bound(GenerationRequest("r", "m", prompt="a" * 400), None) == 125 + 8


def backend(cls: type, served: str = "demo") -> Any:
    return cls("b", "m", HttpSettings(url="http://127.0.0.1:9", served_model=served))


def test_engines_publish_their_context_where_the_references_say() -> None:
    """/work/shared/reference: vLLM's /v1/models card, TGI's /info, llama-server's /props."""
    models = {"object": "list", "data": [
        {"id": "other", "object": "model", "max_model_len": 2048},
        {"id": "meta-llama/Llama-3.1-8B-Instruct", "object": "model", "owned_by": "vllm", "max_model_len": 131072},
    ]}  # fmt: skip
    assert backend(VLLMBackend, "meta-llama/Llama-3.1-8B-Instruct").read_context(models) == 131072
    assert backend(VLLMBackend, "unknown").read_context(models) == 2048
    assert backend(VLLMBackend).read_context({"object": "list", "data": [{"id": "demo"}]}) is None
    info = {"model_id": "bigscience/blomm-560m", "max_input_tokens": 1024, "max_total_tokens": 2048}
    tgi = backend(TgiBackend)
    assert tgi.read_context(info) == 2048 and tgi.info == info
    props = {"default_generation_settings": {"id": 0, "n_ctx": 1024, "params": {}}, "total_slots": 1}
    assert backend(LlamaServerBackend).read_context(props) == 1024


def test_vllm_context_is_read_with_its_health_once_while_it_stays_up(cache_dir: Path) -> None:
    app = fake_vllm.create_app(TinyEngine(cache_dir), max_model_len=512)
    with serve_in_thread(app, "/health") as url:
        vllm = VLLMBackend("v", "m", HttpSettings(url=url, served_model="enginegate-demo"))

        async def scenario() -> None:
            assert vllm.context_length is None
            assert (await vllm.health()).ok
            assert vllm.context_length == 512
            app.state.fake.max_model_len = 256  # relaunched meanwhile: read again once it was down
            await vllm.health()
            assert vllm.context_length == 512
            vllm.settings = HttpSettings(url="http://127.0.0.1:9", served_model="enginegate-demo")
            await vllm.aclose()
            assert not (await vllm.health()).ok
            vllm.settings = HttpSettings(url=url, served_model="enginegate-demo")
            await vllm.aclose()
            assert (await vllm.health()).ok and vllm.context_length == 256
            await vllm.aclose()

        asyncio.run(scenario())


FLEET = """
models: [{name: m, gguf: "{GGUF}", context: 8192}]
backends: [{name: b, engine: ctranslate2, model: m}]
"""


def test_the_fleet_keeps_the_smaller_context_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    scripted = ScriptedBackend("b", "m")

    async def scenario() -> None:
        state = AppState(load_config(write_config(tmp_path / "c.yaml", FLEET)), lambda cfg, loaded: scripted)
        fleet = state.fleet
        entry = fleet.entries["b"]
        assert entry.context(8192) == 8192
        with caplog.at_level(logging.WARNING, logger="enginegate.fleet"):
            fleet.accounts.note_context(entry, 4096)
            fleet.accounts.note_context(entry, 4096)
        assert entry.context(8192) == 4096 and entry.profile.context == 4096
        assert len([r for r in caplog.records if "context of 4096 tokens" in r.getMessage()]) == 1
        fleet.accounts.note_context(entry, 1024, published=False)  # a refusal named less
        fleet.accounts.note_context(entry, 4096)  # the same published figure again does not undo it
        assert entry.context(8192) == 1024
        fleet.accounts.note_context(entry, 2048, published=False)  # a refusal only ever lowers
        assert entry.context(8192) == 1024
        fleet.accounts.note_context(entry, 16384)  # a relaunched engine publishes anew; the model entry still bounds it
        assert entry.context(8192) == 8192
        snapshot = fleet.snapshot()
        assert snapshot.backends[0].profile.context == 16384
        fleet.accounts.note_context(entry, 2048)
        assert await state.reload() == []
        assert state.fleet.entries["b"] is entry and entry.context(8192) == 2048  # a reload keeps what was learned

    asyncio.run(scenario())


@dataclass
class Refusing:
    """Refuses its first ``refusals`` requests with ``text`` (a context refusal), then answers."""

    text: str
    refusals: int = 1
    kind: ErrorKind = ErrorKind.CONTEXT_LENGTH
    asked: list[int | None] = field(default_factory=list)
    name: str = "r"
    capabilities = PLAIN

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.asked.append(request.max_tokens)
        if len(self.asked) <= self.refusals:
            raise BackendError(self.kind, self.text)
        yield Chunk(text="ok")
        yield Chunk(finish_reason="stop", usage=Usage(3, 1))


async def collect(stream: AsyncIterator[Chunk]) -> list[Chunk]:
    return [c async for c in stream]


def sized_answer(
    engine: Refusing, request: GenerationRequest, cap: int, context: int, prompt: int, learned: Callable[[int], None]
) -> list[Chunk]:
    """What dispatch does with a length the gateway chose: ``open_sized``, and after a refusal one more
    try sized by ``resized`` (``Generation.reopen``), else the refusal."""

    async def run() -> list[Chunk]:
        try:
            return await collect(open_sized(engine, PLAIN, request, cap, context, prompt))  # type: ignore[arg-type]
        except BackendError as exc:
            again = resized(request, cap, context, prompt, exc, learned)
            if again is None:
                raise
            return await collect(open_answer(engine, PLAIN, again))  # type: ignore[arg-type]

    return asyncio.run(run())


VLLM_TOO_LARGE = (
    "'max_tokens' or 'max_completion_tokens' is too large: 8150. This model's maximum context length is 1024 "
    "tokens and your request has 30 input tokens (8150 > 1024 - 30)."
)


def test_a_length_the_engine_refuses_is_sized_once_more_to_what_it_says() -> None:
    engine, learned = Refusing(VLLM_TOO_LARGE), list[int]()
    chunks = sized_answer(engine, chat("Hello"), 32768, 8192, 42, learned.append)
    assert [c.text for c in chunks] == ["ok", ""]
    assert engine.asked == [8192 - 42, 1024 - 30]
    assert learned == [1024]
    capped = Refusing(VLLM_TOO_LARGE, refusals=0)
    sized_answer(capped, chat("Hello"), 100, 8192, 42, learned.append)
    assert capped.asked == [100]  # the cap fitted: never refused


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (VLLM_TOO_LARGE, ErrorKind.BAD_REQUEST),  # not a context refusal
        ("the request exceeds the available context size, try increasing it", ErrorKind.CONTEXT_LENGTH),  # no figure
        ("This model's maximum context length is 1024 tokens. However, your request has 1500 input tokens.",
         ErrorKind.CONTEXT_LENGTH),  # no room left
    ],
)  # fmt: skip
def test_what_no_length_can_fix_is_refused_at_once(text: str, kind: ErrorKind) -> None:
    engine = Refusing(text, kind=kind)
    with pytest.raises(BackendError):
        sized_answer(engine, chat("Hello"), 32768, 8192, 42, lambda n: None)
    assert len(engine.asked) == 1


def test_a_second_refusal_is_the_answer() -> None:
    engine = Refusing(VLLM_TOO_LARGE, refusals=2)
    with pytest.raises(BackendError):
        sized_answer(engine, chat("Hello"), 32768, 8192, 42, lambda n: None)
    assert engine.asked == [8150, 994]


def test_min_tokens_beyond_the_length_the_context_leaves_is_refused() -> None:
    engine = Refusing(VLLM_TOO_LARGE, refusals=0)
    request = chat("Hello", extra={"min_tokens": 100})
    with pytest.raises(BackendError) as info:
        sized_answer(engine, request, 32768, 120, 42, lambda n: None)
    assert info.value.param == "min_tokens" and not info.value.retryable
    assert engine.asked == []
    sized_answer(engine, request, 32768, 200, 42, lambda n: None)
    assert engine.asked == [158]


CHECKED = """
models:
  - {name: big, gguf: "{GGUF}", context: 8192}
  - {name: fits, gguf: "{GGUF}"}
backends:
  - {name: ct2-big, engine: ctranslate2, model: big}
  - {name: ct2-fits, engine: ctranslate2, model: fits}
  - {name: llama-small, engine: llama_cpp, model: fits, n_ctx: 1024}
  - {name: vllm-small, engine: vllm, model: fits, url: "%s", served_model: enginegate-demo}
  - {name: trt, engine: trtllm_serve, model: fits, url: "%s"}
  - {name: down, engine: tgi, model: fits, url: "http://127.0.0.1:9"}
"""


def check(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gateway.cli", "config", "check", str(path), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_config_check_warns_of_engines_holding_less_context(tmp_path: Path, cache_dir: Path) -> None:
    with serve_in_thread(fake_vllm.create_app(TinyEngine(cache_dir), max_model_len=512), "/health") as url:
        path = write_config(tmp_path / "c.yaml", CHECKED % (url, url))
        offline = check(path)
        assert offline.returncode == 0, offline.stderr
        warnings = offline.stderr.splitlines()
        assert len(warnings) == 2, warnings
        assert (
            "backend ct2-big:" in warnings[0]
            and "4096 tokens (its GGUF's), smaller than model big's 8192" in warnings[0]
        )
        assert (
            "backend llama-small:" in warnings[1]
            and "1024 tokens (its n_ctx), smaller than model fits's 4096" in warnings[1]
        )
        probed = check(path, "--probe")
        assert probed.returncode == 0, probed.stderr
        lines = probed.stderr.splitlines()
        assert len(lines) == 4, lines
        assert any("backend vllm-small:" in line and "512 tokens (what the engine at" in line for line in lines)
        assert any("backend down: not probed" in line for line in lines)
        assert not any("backend trt" in line for line in lines)  # trtllm-serve publishes none: learned at runtime
