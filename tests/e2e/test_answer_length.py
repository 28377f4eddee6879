"""One answer-length rule that every engine accepts, through a real gateway with the official ``openai``
client: each model entry says 8192 tokens of context, each engine was launched with less (vLLM's
``--max-model-len``, trtllm-serve's ``max_seq_len``, TGI's ``max_total_tokens``; the demo model's own
4096 elsewhere), and a request without ``max_tokens`` (what every SDK sends) is answered on every adapter
kind. A prompt too long for the engine is a 400 ``context_length_exceeded`` in the route's own error
shape, whole or streamed; ``min_tokens`` beyond ``max_tokens`` is a 400; ``ignore_eos`` without
``max_tokens`` stops where the engine's context does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.config import load_config
from tests.conftest import write_config
from tests.contract import fake_mii, fake_tgi, fake_triton, fake_trtllm_serve, fake_vllm
from tests.contract.control import FakeControl
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread

MODEL_CONTEXT = 8192
VLLM_LEN, TRT_LEN, TGI_INPUT, TGI_TOTAL, EDGE_TOTAL = 512, 1024, 768, 1024, 2048
DEMO_CONTEXT = 4096
# Model name -> (backend config, the context the engine holds a request to).
KINDS = {
    "len-vllm": ("engine: vllm", VLLM_LEN),
    "len-trtllm": ("engine: trtllm_serve", TRT_LEN),  # built with TensorRT: prompt + max_tokens checked
    "len-trtllm-pytorch": ("engine: trtllm_serve", TRT_LEN),  # the PyTorch backend clamps max_tokens
    "len-tgi": ("engine: tgi", TGI_TOTAL),
    "len-tgi-messages": ("engine: tgi_messages", TGI_TOTAL),
    "len-triton": ("engine: triton_trtllm", DEMO_CONTEXT),
    "len-triton-bls": (
        "{engine: triton_trtllm, triton_model: tensorrt_llm_bls, text_output: cumulative}",
        DEMO_CONTEXT,
    ),
    "len-mii-rest": ("{engine: mii_rest, deployment: enginegate-demo}", DEMO_CONTEXT),
    "len-mii-openai": ("engine: mii_openai", DEMO_CONTEXT),
    "len-ct2": ("engine: ctranslate2", DEMO_CONTEXT),
}
MATCHING_BODIES: list[dict[str, Any]] = []
EDGE_BODIES: list[tuple[str, Any]] = []
HELLO: Any = [{"role": "user", "content": "Hello"}]
CHATS: list[Any] = [  # short chats as SDK users send them
    HELLO,
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Say hi."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "?"}],
    [{"role": "user", "content": "The Zen of Python, by Tim Peters"}],
]


def _backend(name: str, url: str | None) -> str:
    kind, _ = KINDS[name]
    fields = kind.strip("{}") if kind.startswith("{") else kind
    where = f", url: {url}, served_model: enginegate-demo" if url else ""
    return f"  - {{name: {name}, model: {name}, {fields}{where}}}"


@pytest.fixture(scope="module")
def fleet_gateway(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[str]:
    engine, control = TinyEngine(cache_dir), FakeControl()
    apps = {
        "len-vllm": (fake_vllm.create_app(engine, max_model_len=VLLM_LEN), "/health"),
        "len-trtllm": (
            fake_trtllm_serve.create_app(engine, control, max_seq_len=TRT_LEN, backend="tensorrt"),
            "/health",
        ),
        "len-trtllm-pytorch": (fake_trtllm_serve.create_app(engine, control, max_seq_len=TRT_LEN), "/health"),
        "len-tgi": (
            fake_tgi.create_app(engine, control, max_input_tokens=TGI_INPUT, max_total_tokens=TGI_TOTAL),
            "/health",
        ),
        "len-triton": (fake_triton.create_app(engine, control), "/v2/health/ready"),
        "len-mii-rest": (fake_mii.create_rest_app(engine, control), "/healthz"),
        "len-mii-openai": (fake_mii.create_openai_app(engine, control), "/health"),
    }
    # The model entry says the engine's own context: only the prompt's count decides there.
    matching = fake_trtllm_serve.create_app(
        engine, control, max_seq_len=TRT_LEN, backend="tensorrt", received=MATCHING_BODIES
    )
    apps["len-matching"] = (matching, "/health")
    edge = fake_tgi.create_app(
        engine, control, max_input_tokens=EDGE_TOTAL - 100, max_total_tokens=EDGE_TOTAL, received=EDGE_BODIES
    )
    apps["len-tgi-edge"] = (edge, "/health")
    with ExitStack() as stack:
        urls = {name: stack.enter_context(serve_in_thread(app, ready)) for name, (app, ready) in apps.items()}
        urls["len-tgi-messages"] = urls["len-tgi"]
        urls["len-triton-bls"] = urls["len-triton"]
        models = "\n".join(f'  - {{name: {n}, gguf: "{{GGUF}}", context: {MODEL_CONTEXT}}}' for n in KINDS)
        backends = "\n".join(_backend(n, urls.get(n)) for n in KINDS)
        # No tokenizer: the prompt is estimated.
        for name, context, url, kind in (
            ("len-estimated", MODEL_CONTEXT, "len-trtllm", "trtllm_serve"),
            ("len-matching", TRT_LEN, "len-matching", "trtllm_serve"),
            ("len-tgi-edge", EDGE_TOTAL, "len-tgi-edge", "tgi"),
        ):
            models += f"\n  - {{name: {name}, context: {context}}}"
            backends += f"\n  - {{name: {name}, model: {name}, engine: {kind}, url: {urls[url]}}}"
        config = write_config(
            tmp_path_factory.mktemp("length") / "c.yaml",
            f"limits: {{health_interval_s: 0.5}}\nmodels:\n{models}\nbackends:\n{backends}\n",
        )
        yield stack.enter_context(serve_in_thread(create_app(load_config(config))))


@pytest.fixture(scope="module")
def client(fleet_gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fleet_gateway}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("model", [*KINDS, "len-estimated"])
def test_a_request_without_max_tokens_is_answered_on_every_engine(client: openai.OpenAI, model: str) -> None:
    for messages in CHATS:  # before: refused by the engine (its context is smaller than the model entry's)
        resp = client.chat.completions.create(model=model, messages=messages, temperature=0)
        choice = resp.choices[0]
        assert choice.finish_reason in ("stop", "length"), choice
        assert choice.message.content
        assert resp.usage is not None
    stream = client.chat.completions.create(model=model, messages=HELLO, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text


def test_an_estimated_prompt_leaves_the_template_its_room(client: openai.OpenAI) -> None:
    """Model entry and engine agree on the context, the prompt is estimated (no tokenizer): the margin and
    the template's allowance fit every short chat on the first try (before: 3 of 4 were refused)."""
    MATCHING_BODIES.clear()
    for messages in CHATS:
        resp = client.chat.completions.create(model="len-matching", messages=messages, temperature=0)
        assert resp.choices[0].message.content
    assert len(MATCHING_BODIES) == len(CHATS)  # none sent twice
    assert all(b["max_tokens"] <= TRT_LEN - 40 for b in MATCHING_BODIES)


def test_an_under_counted_prompt_near_the_edge_is_sized_to_what_the_engine_counted(client: openai.OpenAI) -> None:
    """An estimate far below the engine's count (the demo model's tiny vocabulary: about 0.6 tokens a
    character), at the edge of TGI's context: TGI's refusal (inside its stream) names the prompt's real
    size, and the answer is sized to what is left."""
    messages: Any = [{"role": "user", "content": "Beautiful is better than ugly. " * 150}]  # ~1500 tokens
    EDGE_BODIES.clear()
    resp = client.chat.completions.create(model="len-tgi-edge", messages=messages, temperature=0)
    assert resp.usage is not None and resp.usage.total_tokens <= EDGE_TOTAL
    assert resp.choices[0].finish_reason in ("stop", "length")
    first, second = (body["parameters"]["max_new_tokens"] for _, body in EDGE_BODIES)
    assert second == EDGE_TOTAL - resp.usage.prompt_tokens < first  # TGI's own count of the prompt
    chunks = list(client.chat.completions.create(model="len-tgi-edge", messages=messages, stream=True))
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


@pytest.mark.parametrize("model", ["len-vllm", "len-trtllm", "len-tgi", "len-ct2"])
def test_a_completion_without_max_tokens_is_answered(client: openai.OpenAI, model: str) -> None:
    resp = client.completions.create(model=model, prompt="The Zen of Python, by Tim Peters\n\n", temperature=0)
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.choices[0].text


def test_the_answer_is_sized_to_the_engine_context(client: openai.OpenAI) -> None:
    """ignore_eos without max_tokens is bounded: it runs to the engine's context, not the model entry's."""
    resp = client.chat.completions.create(
        model="len-vllm", messages=HELLO, temperature=0, extra_body={"ignore_eos": True}
    )
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.total_tokens == VLLM_LEN


def long_chat(tokens_at_least: int) -> Any:
    # The demo model's tokenizer takes about two characters a token: this is at least that many tokens.
    return [{"role": "user", "content": "Beautiful is better than ugly. " * (tokens_at_least // 8)}]


@pytest.mark.parametrize("model", ["len-vllm", "len-trtllm", "len-tgi", "len-tgi-messages", "len-ct2"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_too_long_for_the_engine_is_context_length_exceeded(
    client: openai.OpenAI, model: str, stream: bool
) -> None:
    _, engine_context = KINDS[model]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=long_chat(engine_context + 200), stream=stream)
    assert info.value.code == "context_length_exceeded", info.value.message
    assert "stream error" not in info.value.message


def test_an_engine_refusing_inside_its_stream_is_a_clean_400_on_a_whole_answer(client: openai.OpenAI) -> None:
    """TGI checks the prompt inside its 200 stream: a whole answer still gets a plain 400."""
    over_input: Any = [{"role": "user", "content": "Beautiful is better than ugly. " * 80}]  # ~810 tokens
    for model in ("len-tgi", "len-tgi-messages"):
        with pytest.raises(openai.BadRequestError) as info:  # more than TGI's max_input_tokens, within its total
            client.chat.completions.create(model=model, messages=over_input, max_tokens=8)
        assert info.value.code == "context_length_exceeded"
        assert "stream error" not in info.value.message and "refused the request" in info.value.message


def test_a_client_max_tokens_is_never_changed(client: openai.OpenAI) -> None:
    """The gateway resizes only the length it chose: the client's own is refused when it does not fit."""
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="len-trtllm", messages=HELLO, max_tokens=TRT_LEN)
    assert info.value.code == "context_length_exceeded"


def test_the_error_shape_is_the_route_s_own(fleet_gateway: str) -> None:
    long = long_chat(VLLM_LEN + 200)
    anthropic = httpx.post(
        f"{fleet_gateway}/v1/messages",
        json={"model": "len-vllm", "max_tokens": 16, "messages": long},
        headers={"anthropic-version": "2023-06-01"},
        timeout=60,
    )
    assert anthropic.status_code == 400
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "invalid_request_error"
    responses = httpx.post(
        f"{fleet_gateway}/v1/responses", json={"model": "len-vllm", "input": long[0]["content"]}, timeout=60
    )
    assert responses.status_code == 400
    assert responses.json()["error"]["code"] == "context_length_exceeded"
    for stream in (False, True):
        answer = httpx.post(
            f"{fleet_gateway}/v1/responses",
            json={"model": "len-trtllm", "input": "Hello", "stream": stream},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text


def test_min_tokens_beyond_max_tokens_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="len-vllm", messages=HELLO, max_tokens=4, extra_body={"min_tokens": 8})
    assert info.value.param == "min_tokens"
    with pytest.raises(openai.BadRequestError) as info:  # beyond what the engine's context leaves
        client.chat.completions.create(model="len-vllm", messages=HELLO, extra_body={"min_tokens": VLLM_LEN})
    assert info.value.param == "min_tokens"
    resp = client.chat.completions.create(  # as many as max_tokens: fine
        model="len-vllm", messages=HELLO, max_tokens=8, temperature=0, extra_body={"min_tokens": 8}
    )
    assert resp.choices[0].finish_reason == "length"


SLOT_CONTEXT = 512  # llama-server -c 1024 with its two slots


@pytest.fixture(scope="module")
def llama_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.contract.engines import llama_server

    workdir = tmp_path_factory.mktemp("length-llama-server")
    with llama_server(workdir, "-c", str(2 * SLOT_CONTEXT)) as url:
        config = write_config(
            workdir / "c.yaml",
            f"""
models:
  - {{name: ls-exact, gguf: "{{GGUF}}", context: {MODEL_CONTEXT}}}
  - {{name: ls-estimated, context: {MODEL_CONTEXT}}}
backends:
  - {{name: ls-exact, engine: llama_server, model: ls-exact, url: "{url}", served_model: enginegate-demo}}
  - {{name: ls-estimated, engine: llama_server, model: ls-estimated, url: "{url}", served_model: enginegate-demo}}
""",
        )
        with serve_in_thread(create_app(load_config(config))) as base:
            yield base


@pytest.mark.engines
def test_llama_server_slot_context_bounds_the_answer(llama_gateway: str) -> None:
    client = openai.OpenAI(base_url=f"{llama_gateway}/v1", api_key="unused", max_retries=0, timeout=120)
    for model in ("ls-exact", "ls-estimated"):
        resp = client.chat.completions.create(model=model, messages=HELLO, temperature=0)
        assert resp.choices[0].message.content
        eos = client.chat.completions.create(
            model=model, messages=HELLO, temperature=0, extra_body={"ignore_eos": True}
        )
        assert eos.usage is not None and eos.usage.total_tokens <= SLOT_CONTEXT  # /props' n_ctx, not the entry's
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as info:  # placement (exact) or llama-server's own 400
                client.chat.completions.create(model=model, messages=long_chat(SLOT_CONTEXT + 100), stream=stream)
            assert info.value.code == "context_length_exceeded"
            if model == "ls-exact":  # counted exactly against the slot's context: never sent
                assert f"context {SLOT_CONTEXT} <" in info.value.message
