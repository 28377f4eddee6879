"""What the TensorRT-LLM and DeepSpeed-MII adapters report and how they stop, proven on their contract
fakes as each is deployed: token counts and finish reasons against the fake's own count of tokens it
generated, streams that stream, clients that leave stopping the engine, trtllm-serve's tool parsing as
its deployment says, ``n`` checked where the engine answers it, and stop strings that stop MII's REST
engine. Through a gateway, with the official ``openai`` client, wherever a client is involved.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from backends import capabilities as cap
from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest
from backends.capabilities import capabilities_of
from backends.deepspeed_mii import MiiRestBackend
from backends.http_base import HttpSettings
from backends.trtllm import TritonTrtllmBackend, TrtllmServeBackend
from gateway.app import create_app
from gateway.config import load_config
from gateway.fleet.catalog import capabilities
from gateway.fleet.engines import configured_capabilities
from tests.conftest import GREETING_REPLY, ZEN_PROMPT, write_config
from tests.contract import fake_mii, fake_triton, fake_trtllm_serve
from tests.contract.control import FakeControl
from tests.contract.test_trtllm_mii_capabilities import HELLO as HELLO_MESSAGES
from tests.contract.test_trtllm_mii_capabilities import PARIS as PARIS_MESSAGES
from tests.contract.test_trtllm_mii_capabilities import WEATHER_TOOL
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread
from tests.polling import eventually, settles

SERVED = "enginegate-demo"
ADMIN = "counts-admin-key"
HELLO: Any = HELLO_MESSAGES
PARIS: Any = PARIS_MESSAGES  # the demo model answers it with a Hermes-style call
WEATHER: Any = WEATHER_TOOL


@dataclass
class Fake:
    url: str
    engine: TinyEngine
    control: FakeControl
    received: list[dict[str, Any]]

    def generated(self) -> int:
        """The fake engine's own count of the tokens it generated (end tokens included)."""
        return self.engine.generated_tokens

    def at_rest(self) -> int:
        return settles(self.generated, quiet_s=0.4, interval=0.05, message="the engine kept generating")


# Each deployment: (how its fake is made, its health route). Every fake has an engine of its own, so a
# test reads the tokens its request made and nothing else's.
DEPLOYMENTS: dict[str, tuple[Any, str]] = {
    # The ensemble as most deployments run it: no output_log_probs, no token-count outputs, decoupled.
    "triton_bare": (
        lambda e, c, got: fake_triton.create_app(e, c, received=got, output_log_probs=False),
        "/v2/health/ready",
    ),
    # A 2025+ ensemble: num_input_tokens / num_output_tokens.
    "triton_counts": (
        lambda e, c, got: fake_triton.create_app(e, c, received=got, token_counts=True),
        "/v2/health/ready",
    ),
    # Its tensorrt_llm model not in decoupled mode: it can only answer whole.
    "triton_whole_only": (
        lambda e, c, got: fake_triton.create_app(e, c, received=got, output_log_probs=False, decoupled=False),
        "/v2/health/ready",
    ),
    "serve_parser": (lambda e, c, got: fake_trtllm_serve.create_app(e, c, received=got), "/health"),
    "serve_plain": (
        lambda e, c, got: fake_trtllm_serve.create_app(e, c, received=got, tool_parser=None),
        "/health",
    ),
    "mii_rest": (lambda e, c, got: fake_mii.create_rest_app(e, c, received=got), "/healthz"),
}


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Fake]]:
    cache = tmp_path_factory.mktemp("counts-cache")
    made: dict[str, Fake] = {}
    with contextlib.ExitStack() as stack:
        for name, (factory, ready) in DEPLOYMENTS.items():
            engine, control, got = TinyEngine(cache), FakeControl(), list[dict[str, Any]]()
            url = stack.enter_context(serve_in_thread(factory(engine, control, got), ready))
            made[name] = Fake(url, engine, control, got)
        yield made


@pytest.fixture(autouse=True)
def _quiet(fakes: dict[str, Fake]) -> Iterator[None]:
    yield
    for fake in fakes.values():
        fake.engine.token_delay_s = 0.0
        fake.engine.scripted.clear()
        fake.control.reset()


def settings(fake: Fake) -> HttpSettings:
    return HttpSettings(url=fake.url, served_model=SERVED, default_max_tokens=64)


def req(**kw: Any) -> GenerationRequest:
    kw.setdefault("temperature", 0.0)
    return GenerationRequest(request_id="counts", model=SERVED, **kw)


def collect(backend: Any, request: GenerationRequest) -> list[Chunk]:
    async def go() -> list[Chunk]:
        try:
            return [c async for c in backend.generate(request)]
        finally:
            await backend.aclose()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def gateway(fakes: dict[str, Fake], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One model per deployment; models with ``gguf`` have their tokenizer at the gateway."""
    url = {name: fake.url for name, fake in fakes.items()}
    config = write_config(
        tmp_path_factory.mktemp("counts-gateway") / "fleet.yaml",
        f"""
limits: {{max_tokens: 120}}
admin: {{api_key_env: EG_COUNTS_ADMIN}}
models:
  - {{name: bare, gguf: "{{GGUF}}", tool_parser: hermes}}
  - {{name: bare-untokenized}}
  - {{name: counts, gguf: "{{GGUF}}"}}
  - {{name: whole-only, gguf: "{{GGUF}}"}}
  - {{name: serve-native, gguf: "{{GGUF}}"}}
  - {{name: serve-text, gguf: "{{GGUF}}", tool_parser: hermes}}
  - {{name: serve-plain, gguf: "{{GGUF}}"}}
  - {{name: rest, gguf: "{{GGUF}}"}}
backends:
  - {{name: bare, engine: triton_trtllm, url: "{url["triton_bare"]}", model: bare}}
  - {{name: bare-untokenized, engine: triton_trtllm, url: "{url["triton_bare"]}", model: bare-untokenized}}
  - {{name: counts, engine: triton_trtllm, url: "{url["triton_counts"]}", model: counts}}
  - {{name: whole-only, engine: triton_trtllm, url: "{url["triton_whole_only"]}", model: whole-only}}
  - {{name: serve-native, engine: trtllm_serve, url: "{url["serve_parser"]}", model: serve-native,
     served_model: {SERVED}, tool_parser: qwen3}}
  - {{name: serve-text, engine: trtllm_serve, url: "{url["serve_plain"]}", model: serve-text, served_model: {SERVED}}}
  - {{name: serve-plain, engine: trtllm_serve, url: "{url["serve_plain"]}", model: serve-plain,
     served_model: {SERVED}}}
  - {{name: rest, engine: mii_rest, url: "{url["mii_rest"]}", model: rest, deployment: {SERVED}}}
""",
    )
    os.environ["EG_COUNTS_ADMIN"] = ADMIN
    try:
        with serve_in_thread(create_app(load_config(config))) as base:
            yield base
    finally:
        del os.environ["EG_COUNTS_ADMIN"]


def client(base: str, timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=timeout)


# ------------------------------------------------------------- Triton: counts, finish reasons, streams


def test_a_bare_ensembles_whole_answer_is_counted_by_the_gateway(gateway: str, fakes: dict[str, Fake]) -> None:
    """No output_log_probs, no token-count outputs: the adapter marks its counts estimates and the gateway
    counts with the model's tokenizer. Every count matches what the fake engine generated."""
    fake = fakes["triton_bare"]
    prompt_tokens = fake.engine.count_tokens(fake.engine.render_chat(HELLO))
    before = fake.at_rest()
    cut = client(gateway).chat.completions.create(model="bare", messages=HELLO, max_tokens=5, temperature=0)
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None and cut.usage.completion_tokens == 5 == fake.at_rest() - before
    assert cut.usage.prompt_tokens == prompt_tokens
    before = fake.at_rest()
    whole = client(gateway).chat.completions.create(model="bare", messages=HELLO, max_tokens=60, temperature=0)
    assert whole.choices[0].message.content == GREETING_REPLY and whole.choices[0].finish_reason == "stop"
    assert whole.usage is not None
    assert whole.usage.completion_tokens == fake.at_rest() - before - 1  # the end token is no part of the answer
    assert fake.received[-1]["stream"] is False  # a client that does not stream gets the exact whole answer


def test_the_cap_cutting_a_bare_ensembles_answer_says_so_on_every_front_door(gateway: str) -> None:
    responses = client(gateway).responses.create(model="bare", input="Hello", max_output_tokens=16, temperature=0)
    assert responses.status == "incomplete" and responses.incomplete_details is not None
    assert responses.incomplete_details.reason == "max_output_tokens"
    assert responses.usage is not None and responses.usage.output_tokens == 16
    messages = httpx.post(
        f"{gateway}/v1/messages",
        json={"model": "bare", "max_tokens": 5, "messages": HELLO},
        headers={"anthropic-version": "2023-06-01"},
        timeout=30,
    ).json()
    assert messages["stop_reason"] == "max_tokens" and messages["usage"]["output_tokens"] == 5


def test_without_the_models_tokenizer_the_estimate_stands_and_says_so(fakes: dict[str, Fake]) -> None:
    """The capability data names who counts; a model without a tokenizer keeps the adapter's estimate."""
    loaded_caps = {
        name: capabilities(TritonTrtllmBackend.capabilities, _backend_cfg("triton_trtllm"), _model_cfg(gguf))
        for name, gguf in (("with", True), ("without", False))
    }
    assert loaded_caps["with"].token_counts == "tokenizer"
    assert loaded_caps["without"].token_counts == "estimate"
    serve = capabilities(TrtllmServeBackend.capabilities, _backend_cfg("trtllm_serve"), _model_cfg(True))
    assert serve.token_counts == "engine"
    chunks = collect(TritonTrtllmBackend("t", SERVED, settings(fakes["triton_bare"])), req(messages=HELLO))
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_estimated and usage.prompt_estimated and usage.finish_from_count


def test_the_fleet_says_who_counts_each_backends_tokens(gateway: str) -> None:
    fleet = httpx.get(f"{gateway}/admin/fleet", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10).json()
    counts = {name: b["token_counts"] for name, b in fleet.items()}
    assert counts["bare"] == "tokenizer" and counts["bare-untokenized"] == "estimate"
    assert counts["serve-native"] == counts["rest"] == "engine"


def test_a_2025_ensembles_counts_are_the_engines(gateway: str, fakes: dict[str, Fake]) -> None:
    fake = fakes["triton_counts"]
    before = fake.at_rest()
    resp = client(gateway).chat.completions.create(model="counts", messages=HELLO, max_tokens=7, temperature=0)
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 7 == fake.at_rest() - before
    assert resp.usage.prompt_tokens == fake.engine.count_tokens(fake.engine.render_chat(HELLO))
    body = fake.received[-1]
    assert body["return_num_output_tokens"] is True and body["return_num_input_tokens"] is True
    # The adapter alone (no gateway to recount): exact, not estimated.
    usage = collect(TritonTrtllmBackend("t", SERVED, settings(fake)), req(messages=HELLO, max_tokens=7))[-1].usage
    assert usage is not None and (usage.completion_tokens, usage.completion_estimated) == (7, False)
    assert not usage.prompt_estimated


def test_a_streamed_request_streams_tokens_as_they_come(gateway: str, fakes: dict[str, Fake]) -> None:
    """The ensemble's per-token stream: the first token reaches the client while the engine is still
    generating, usage counts one token per response. Its text is each token decoded alone, as the
    ensemble sends it: exact for byte-level tokenizers; this SentencePiece one loses its word spaces
    (``text_output: cumulative`` is the exact stream for such models)."""
    fake = fakes["triton_bare"]
    fake.engine.token_delay_s = 0.02
    before = fake.at_rest()
    stream = client(gateway).chat.completions.create(
        model="bare", messages=HELLO, max_tokens=60, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    at_first, texts, finish, usage = None, [], None, None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if at_first is None:
                at_first = fake.generated() - before
            texts.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        usage = chunk.usage or usage
    generated = fake.at_rest() - before
    assert at_first is not None and at_first < generated / 2, "the first token came only once the answer was done"
    assert len(texts) > 10 and "".join(texts) == GREETING_REPLY.replace(" ", "")
    assert finish == "stop" and usage is not None and usage.completion_tokens == generated - 1
    assert fake.received[-1]["stream"] is True


def test_a_streamed_request_cut_by_the_cap_is_length(gateway: str, fakes: dict[str, Fake]) -> None:
    fake = fakes["triton_bare"]
    before = fake.at_rest()
    usage_too: Any = {"include_usage": True}
    stream = client(gateway).completions.create(
        model="bare", prompt=ZEN_PROMPT, max_tokens=9, temperature=0, stream=True, stream_options=usage_too
    )
    chunks = list(stream)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage]
    assert finish == ["length"] and usage[-1].completion_tokens == 9 == fake.at_rest() - before


def test_clients_that_leave_a_stream_stop_the_engine(gateway: str, fakes: dict[str, Fake]) -> None:
    """Twenty streaming clients read two tokens each and leave: the engine stops each, counted by its own
    counter (the full answers would have cost it 20 times as many)."""
    fake = fakes["triton_bare"]
    before = fake.at_rest()
    full = client(gateway).completions.create(model="bare", prompt="The Zen", max_tokens=100, temperature=0)
    assert full.usage is not None and full.usage.completion_tokens >= 60  # what each leaver would cost run out
    fake.engine.token_delay_s = 0.005
    before = fake.at_rest()
    for _ in range(20):
        stream = client(gateway).completions.create(
            model="bare", prompt="The Zen", max_tokens=100, temperature=0, stream=True
        )
        got = 0
        for chunk in stream:
            got += bool(chunk.choices and chunk.choices[0].text)
            if got == 2:
                break
        stream.close()
    spent = fake.at_rest() - before
    assert spent < 20 * full.usage.completion_tokens / 3, f"{spent} tokens for 20 clients that left"


def test_a_client_that_leaves_a_whole_answer_stops_the_engine(gateway: str, fakes: dict[str, Fake]) -> None:
    """A client that does not stream leaves while the engine generates its answer: the engine stops."""
    fake = fakes["triton_bare"]
    fake.engine.token_delay_s = 0.02  # 100 tokens: 2 s
    before = fake.at_rest()

    async def leave() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            body = {"model": "bare", "prompt": "The Zen", "max_tokens": 100, "temperature": 0}
            asked = asyncio.ensure_future(http.post(f"{gateway}/v1/completions", json=body))
            await eventually(lambda: fake.generated() > before, message="the engine never started")
            asked.cancel()  # the client goes away: its connection closes
            await asyncio.gather(asked, return_exceptions=True)

    asyncio.run(leave())
    spent = fake.at_rest() - before
    assert spent < 50, f"{spent} tokens after the client left"


def test_a_deployment_that_cannot_stream_answers_a_streamed_request_whole(gateway: str, fakes: dict[str, Fake]) -> None:
    """Its tensorrt_llm model is not decoupled: the first streamed request is refused there (before any
    token) and answered whole; later ones go whole at once."""
    fake = fakes["triton_whole_only"]
    for _ in range(2):
        before = len(fake.received)
        stream = client(gateway).chat.completions.create(
            model="whole-only", messages=HELLO, temperature=0, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == GREETING_REPLY
        usage = [c.usage for c in chunks if c.usage]
        assert usage and usage[-1].completion_tokens == fake.engine.count_tokens(GREETING_REPLY)
        asked = [body["stream"] for body in fake.received[before:]]
        assert asked in ([True, False], [False])
    assert asked == [False], "the deployment's refusal was learnt"


# ------------------------------------------------------------------------- trtllm-serve's tool parsing


def test_trtllm_serves_tool_parsing_is_what_its_deployment_says(fakes: dict[str, Fake]) -> None:
    default = TrtllmServeBackend("t", SERVED, settings(fakes["serve_plain"]))
    parsed = TrtllmServeBackend("t", SERVED, settings(fakes["serve_parser"]), tool_parser="qwen3")
    assert capabilities_of(default).tools_in_prompt and not capabilities_of(parsed).tools_in_prompt
    assert TrtllmServeBackend.capabilities.tools_in_prompt  # trtllm-serve's default launch has no parser
    assert cap.TOOLS in capabilities_of(default).features and cap.TOOLS in capabilities_of(parsed).features
    assert configured_capabilities(_backend_cfg("trtllm_serve", tool_parser="qwen3")) == capabilities_of(parsed)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", ["serve-native", "serve-text"])
def test_a_trtllm_serve_tool_call_comes_back_as_a_call(gateway: str, model: str, stream: bool) -> None:
    """With ``--tool_parser`` the engine parses; without it the gateway parses the markup out of the text."""
    if stream:
        chunks = list(
            client(gateway).chat.completions.create(
                model=model, messages=PARIS, tools=[WEATHER], temperature=0, stream=True
            )
        )
        pieces = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        assert pieces[0].id and pieces[0].function and pieces[0].function.name == "get_weather"
        arguments = "".join(p.function.arguments or "" for p in pieces if p.function)
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        resp = client(gateway).chat.completions.create(model=model, messages=PARIS, tools=[WEATHER], temperature=0)
        (call,) = resp.choices[0].message.tool_calls or []
        assert call.type == "function" and call.function.name == "get_weather" and call.id
        arguments, content, finish = (
            call.function.arguments,
            resp.choices[0].message.content or "",
            [resp.choices[0].finish_reason],
        )
    assert arguments.replace(" ", "") == '{"city":"Paris"}' and finish == ["tool_calls"]
    assert "<tool_call>" not in content


def test_tools_for_a_trtllm_serve_nobody_can_parse_are_refused(gateway: str) -> None:
    """No ``--tool_parser`` and no model ``tool_parser``: refused naming the field, never markup as text."""
    with pytest.raises(openai.BadRequestError) as err:
        client(gateway).chat.completions.create(model="serve-plain", messages=PARIS, tools=[WEATHER])
    assert err.value.param == "tools"


# ------------------------------------------------------------------------------- n where it is native


def test_a_choice_the_engine_never_answers_is_an_error(gateway: str, fakes: dict[str, Fake]) -> None:
    fake = fakes["serve_parser"]
    fake.control.fail_next = "lost_choice"
    backend = TrtllmServeBackend("t", SERVED, settings(fake), tool_parser="qwen3")
    with pytest.raises(BackendError) as err:
        collect(backend, req(messages=HELLO, n=2))
    assert err.value.kind is ErrorKind.PROTOCOL and "choice 1" in err.value.message
    fake.control.fail_next = "lost_choice"
    with pytest.raises(openai.APIStatusError) as status:  # never one choice for two
        client(gateway).chat.completions.create(model="serve-native", messages=HELLO, n=2, temperature=0)
    assert status.value.status_code >= 500
    fake.control.fail_next = "lost_choice"
    stream = client(gateway).chat.completions.create(
        model="serve-native", messages=HELLO, n=2, temperature=0, stream=True
    )
    finished: set[int] = set()
    with pytest.raises(openai.APIError):  # the stream ends with an error event, not with choice 1 open
        for chunk in stream:
            finished |= {c.index for c in chunk.choices if c.finish_reason}
    resp = client(gateway).chat.completions.create(model="serve-native", messages=HELLO, n=2, temperature=0)
    assert [c.index for c in resp.choices] == [0, 1]


# ---------------------------------------------------------------------------- MII REST's stop strings


def mii(fakes: dict[str, Fake], rounds: int = 16) -> MiiRestBackend:
    return MiiRestBackend("m", SERVED, settings(fakes["mii_rest"]), deployment=SERVED, stop_round_tokens=rounds)


def test_mii_rest_stops_generating_soon_after_a_stop_string(fakes: dict[str, Fake]) -> None:
    fake = fakes["mii_rest"]
    asked = req(prompt=ZEN_PROMPT, max_tokens=200, stop=("Simple",))
    before, sent = fake.at_rest(), len(fake.received)
    chunks = collect(mii(fakes, rounds=0), asked)
    assert "".join(c.text for c in chunks) == " ugly.\nExplicit is better than implicit.\n"
    to_the_end = fake.at_rest() - before  # one request: the engine runs to its end of sequence or the limit
    before = fake.at_rest()
    chunks = collect(mii(fakes), asked)
    spent = fake.at_rest() - before
    assert "".join(c.text for c in chunks) == " ugly.\nExplicit is better than implicit.\n"
    assert chunks[-1].finish_reason == "stop"
    usage = chunks[-1].usage
    assert usage is not None and 0 < usage.completion_tokens <= spent <= 16 < to_the_end
    bodies = fake.received[sent + 1 :]
    assert [b["max_new_tokens"] for b in bodies] == [16] and all("stop" not in b for b in bodies)


def test_mii_rest_rounds_continue_the_answer_exactly(fakes: dict[str, Fake]) -> None:
    """A stop string far into the answer: rounds of 16, 32, 64 tokens, each prompt the answer so far;
    the text is what one request would have made, and the engine generated less than twice the answer."""
    fake = fakes["mii_rest"]
    asked = req(prompt=ZEN_PROMPT, max_tokens=300, stop=("Although",))
    whole = "".join(c.text for c in collect(mii(fakes, rounds=0), req(prompt=ZEN_PROMPT, max_tokens=300)))
    expected = whole[: whole.index("Although")]
    before, sent = fake.at_rest(), len(fake.received)
    chunks = collect(mii(fakes), asked)
    spent = fake.at_rest() - before
    assert "".join(c.text for c in chunks) == expected and chunks[-1].finish_reason == "stop"
    needed = fake.engine.count_tokens(expected + "Although")  # the answer up to the end of its stop string
    assert spent <= 2 * needed + 16  # rounds of 16, 32, ...: the last one at most as long as all before it
    bodies = fake.received[sent:]
    assert [b["max_new_tokens"] for b in bodies] == [16 * 2**i for i in range(len(bodies))] and len(bodies) > 2
    assert all(b["prompts"][0].startswith(ZEN_PROMPT) for b in bodies)
    assert bodies[-1]["prompts"][0] != ZEN_PROMPT and expected.startswith(bodies[-1]["prompts"][0][len(ZEN_PROMPT) :])


def test_mii_rest_a_stop_string_across_two_rounds(fakes: dict[str, Fake]) -> None:
    """The first round ends with "Simple" (held back: it may begin the stop), the second brings " is"."""
    fake = fakes["mii_rest"]
    before, sent = fake.at_rest(), len(fake.received)
    chunks = collect(mii(fakes), req(prompt=ZEN_PROMPT, max_tokens=200, stop=("Simple is",)))
    spent = fake.at_rest() - before
    assert "".join(c.text for c in chunks) == " ugly.\nExplicit is better than implicit.\n"
    assert [b["max_new_tokens"] for b in fake.received[sent:]] == [16, 32]
    usage = chunks[-1].usage
    assert usage is not None and 16 < usage.completion_tokens < 20 < spent  # the kept text and its stop string


def test_mii_rest_without_a_stop_is_one_request(fakes: dict[str, Fake]) -> None:
    fake = fakes["mii_rest"]
    sent = len(fake.received)
    chunks = collect(mii(fakes), req(messages=HELLO, max_tokens=60))
    assert "".join(c.text for c in chunks) == GREETING_REPLY and len(fake.received) == sent + 1


def test_mii_rest_stops_through_the_gateway(gateway: str, fakes: dict[str, Fake]) -> None:
    fake = fakes["mii_rest"]
    before = fake.at_rest()
    resp = client(gateway).chat.completions.create(
        model="rest", messages=HELLO, stop=["Beautiful"], temperature=0, max_tokens=100
    )
    spent = fake.at_rest() - before
    assert resp.choices[0].message.content == GREETING_REPLY[: GREETING_REPLY.index("Beautiful")]
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None and 0 < resp.usage.completion_tokens <= spent <= 16 + 32


# ------------------------------------------------------------------------------------------- helpers


def _backend_cfg(engine: str, **extra: Any) -> Any:
    from pydantic import TypeAdapter

    from gateway.config import BackendConfig

    body = {"name": "b", "engine": engine, "model": "m", "url": "http://127.0.0.1:1", **extra}
    return TypeAdapter(BackendConfig).validate_python(body)


def _model_cfg(gguf: bool) -> Any:
    from gateway.config import ModelConfig

    return ModelConfig(name="m", gguf="x.gguf" if gguf else None)
