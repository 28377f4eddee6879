"""Capabilities of the TensorRT-LLM and DeepSpeed-MII adapters, table by table.

For each capability an adapter declares, the engine (its contract fake) receives the field in its own
wire form, asserted on what the fake recorded, and the adapter yields OpenAI's shapes (tool-call pieces,
token logprobs, choice indexes, finish "tool_calls"). What an engine cannot do is absent from the
adapter's capabilities, so the gateway never routes it there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from backends import capabilities as cap
from backends.base import Backend, BackendError, Chunk, ErrorKind, GenerationRequest
from backends.capabilities import FEATURES, Capabilities, capabilities_of
from backends.deepspeed_mii import MiiOpenAIBackend, MiiRestBackend
from backends.http_base import HttpSettings
from backends.trtllm import TritonTrtllmBackend, TrtllmServeBackend
from gateway.app import create_app
from gateway.config import load_config
from tests.conftest import GREETING_REPLY, ZEN_PROMPT, write_config
from tests.contract import fake_mii, fake_triton, fake_trtllm_serve
from tests.contract.control import FakeControl
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread

SERVED = "enginegate-demo"
HELLO = [{"role": "user", "content": "Hello"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
PICTURE = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ],
    }
]
HISTORY = [
    *PARIS,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}


@dataclass
class Fake:
    url: str
    received: list[dict[str, Any]]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> TinyEngine:
    return TinyEngine(tmp_path_factory.mktemp("caps-cache"))


@pytest.fixture(autouse=True)
def _no_script_left(engine: TinyEngine) -> Iterator[None]:
    yield
    engine.scripted.clear()


@pytest.fixture(scope="module")
def fakes(engine: TinyEngine) -> Iterator[dict[str, Fake]]:
    """Each engine's fake, as deployed for these capabilities, with what it received."""
    made: dict[str, Fake] = {}
    apps = {
        "trtllm_serve": (lambda got: fake_trtllm_serve.create_app(engine, FakeControl(), received=got), "/health"),
        "trtllm_serve_plain": (  # launched without --tool_parser and without a guided decoding backend
            lambda got: fake_trtllm_serve.create_app(
                engine, FakeControl(), received=got, tool_parser=None, guided_decoding_backend=None
            ),
            "/health",
        ),
        "triton": (lambda got: fake_triton.create_app(engine, FakeControl(), received=got), "/v2/health/ready"),
        "mii_rest": (lambda got: fake_mii.create_rest_app(engine, FakeControl(), received=got), "/healthz"),
        "mii_openai": (lambda got: fake_mii.create_openai_app(engine, FakeControl(), received=got), "/health"),
    }
    with contextlib.ExitStack() as stack:
        for name, (factory, ready) in apps.items():
            got: list[dict[str, Any]] = []
            made[name] = Fake(stack.enter_context(serve_in_thread(factory(got), ready)), got)
        yield made


def make(kind: str, fakes: dict[str, Fake]) -> Backend:
    def settings(fake: str) -> HttpSettings:
        return HttpSettings(url=fakes[fake].url, served_model=SERVED, default_max_tokens=64)

    if kind == "trtllm_serve":  # launched with --tool_parser qwen3, as its backend setting says
        return TrtllmServeBackend("t", SERVED, settings("trtllm_serve"), tool_parser="qwen3")
    if kind == "trtllm_serve_plain":
        return TrtllmServeBackend("t", SERVED, settings("trtllm_serve_plain"))
    if kind == "triton":
        return TritonTrtllmBackend("t", SERVED, settings("triton"))
    if kind == "triton_bls":
        return TritonTrtllmBackend(
            "t", SERVED, settings("triton"), triton_model="tensorrt_llm_bls", text_output="cumulative"
        )
    if kind == "triton_tokens":
        return TritonTrtllmBackend("t", SERVED, settings("triton"), text_output="per_token")
    if kind == "mii_rest":
        return MiiRestBackend("t", SERVED, settings("mii_rest"), deployment=SERVED)
    assert kind == "mii_openai"
    return MiiOpenAIBackend("t", SERVED, settings("mii_openai"))


FAKE_OF = {"triton_bls": "triton", "triton_tokens": "triton"}


def req(**kw: Any) -> GenerationRequest:
    kw.setdefault("temperature", 0.0)
    kw.setdefault("max_tokens", 60)
    return GenerationRequest(request_id="caps", model=SERVED, **kw)


def generate(kind: str, fakes: dict[str, Fake], request: GenerationRequest) -> tuple[list[Chunk], dict[str, Any]]:
    """The adapter's chunks and the body its engine received."""
    fake = fakes[FAKE_OF.get(kind, kind)]
    before = len(fake.received)

    async def go() -> list[Chunk]:
        backend = make(kind, fakes)
        try:
            return [c async for c in backend.generate(request)]
        finally:
            await backend.aclose()

    chunks = asyncio.run(go())
    assert len(fake.received) == before + 1, "one request reached the engine"
    return chunks, fake.received[-1]


# ------------------------------------------------------------------------------------ what each declares

# (adapter, features declared, features it must not declare, native n, tools in the prompt)
DECLARED = [
    (
        "trtllm_serve",
        {
            cap.TOOLS, cap.JSON_OBJECT, cap.JSON_SCHEMA, cap.LOGPROBS, cap.TOP_LOGPROBS, cap.PENALTIES,
            cap.LOGIT_BIAS, cap.SEED, cap.ECHO, cap.IMAGES,
        },
        # accepted but not enforced: no call is forced, parallel_tool_calls false is ignored
        {cap.TOOL_CHOICE_REQUIRED, cap.PARALLEL_TOOL_CALLS},
        True,
        False,
    ),
    (
        "triton",
        {cap.TOOLS, cap.JSON_OBJECT, cap.JSON_SCHEMA, cap.PENALTIES, cap.SEED},
        # whole answers: no per-token text to pair logprobs with; embedding_bias takes words, not ids
        {cap.LOGPROBS, cap.TOP_LOGPROBS, cap.LOGIT_BIAS, cap.TOOL_CHOICE_REQUIRED, cap.ECHO, cap.IMAGES},
        False,
        True,
    ),
    (
        "triton_bls",
        {cap.TOOLS, cap.JSON_OBJECT, cap.JSON_SCHEMA, cap.PENALTIES, cap.SEED, cap.LOGPROBS},
        {cap.TOP_LOGPROBS, cap.LOGIT_BIAS, cap.TOOL_CHOICE_REQUIRED},
        False,
        True,
    ),
    (
        "mii_rest",
        {cap.TOOLS},
        {cap.SEED, cap.PENALTIES, cap.LOGPROBS, cap.JSON_OBJECT, cap.JSON_SCHEMA, cap.LOGIT_BIAS},
        False,
        True,
    ),
    (
        "mii_openai",
        set(),
        # MII's server accepts penalties, user, logprobs, echo and ignores them; n streams one prompt only
        {cap.TOOLS, cap.PENALTIES, cap.LOGPROBS, cap.SEED, cap.JSON_OBJECT, cap.JSON_SCHEMA, cap.ECHO},
        False,
        False,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "declared", "lacks", "native_n", "in_prompt"), DECLARED, ids=[d[0] for d in DECLARED])
def test_capabilities_are_declared_honestly(
    fakes: dict[str, Fake], kind: str, declared: set[str], lacks: set[str], native_n: bool, in_prompt: bool
) -> None:
    caps = capabilities_of(make(kind, fakes))
    assert caps.features == declared
    assert not caps.features & lacks
    assert caps.features <= FEATURES and caps.extras <= cap.KNOWN_EXTRAS
    assert (caps.native_n, caps.tools_in_prompt) == (native_n, in_prompt)


def test_class_declarations_match_the_default_deployments() -> None:
    """Route explanations read the classes: they say what the default deployment of each honours."""
    assert isinstance(TritonTrtllmBackend.capabilities, Capabilities)
    assert cap.LOGPROBS not in TritonTrtllmBackend.capabilities.features  # whole answers by default
    assert MiiOpenAIBackend.capabilities.extras == {"top_k"}  # min_tokens: MII counts the prompt in it
    assert MiiRestBackend.capabilities.extras == {"ignore_eos", "top_k"}


# ------------------------------------------------------------------------------ the engine's wire form

# (adapter, request, what the engine's body holds: a subset, checked key by key)
WIRE = [
    ("trtllm_serve", req(messages=PARIS, tools=(WEATHER_TOOL,), tool_choice="auto"),
     {"tools": [WEATHER_TOOL], "tool_choice": "auto"}),
    ("trtllm_serve", req(messages=HELLO, response_format={"type": "json_object"}),
     {"response_format": {"type": "json_object"}}),
    ("trtllm_serve", req(messages=HELLO, response_format=JSON_SCHEMA), {"response_format": JSON_SCHEMA}),
    ("trtllm_serve", req(messages=HELLO, logprobs=True, top_logprobs=2), {"logprobs": True, "top_logprobs": 2}),
    # completions' logprobs is read as a truth value by trtllm-serve: 0 alternatives still asks for 1
    ("trtllm_serve", req(prompt=ZEN_PROMPT, logprobs=True, top_logprobs=0), {"logprobs": 1}),
    ("trtllm_serve", req(prompt=ZEN_PROMPT, logprobs=True, top_logprobs=3), {"logprobs": 3}),
    ("trtllm_serve", req(messages=HELLO, n=2), {"n": 2}),
    ("trtllm_serve", req(messages=HELLO, presence_penalty=0.5, frequency_penalty=-0.25),
     {"presence_penalty": 0.5, "frequency_penalty": -0.25}),
    ("trtllm_serve", req(messages=HELLO, logit_bias={12: 5.0, 30: -100.0}), {"logit_bias": {"12": 5.0, "30": -100.0}}),
    ("trtllm_serve", req(messages=HELLO, temperature=0.7, seed=7), {"seed": 7, "temperature": 0.7}),
    ("trtllm_serve", req(prompt=ZEN_PROMPT, echo=True), {"echo": True}),
    ("trtllm_serve", req(messages=HELLO, extra={"top_k": 5, "min_p": 0.1}), {"top_k": 5, "min_p": 0.1}),
    ("trtllm_serve", req(messages=PICTURE), {"messages": PICTURE}),  # parts as they are, for a multimodal model
    ("triton", req(messages=HELLO, response_format={"type": "json_object"}), {"guided_decoding_guide_type": "json"}),
    ("triton", req(messages=HELLO, response_format=JSON_SCHEMA),
     {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": json.dumps(SCHEMA)}),
    ("triton", req(messages=HELLO, presence_penalty=0.5, frequency_penalty=0.25),
     {"presence_penalty": 0.5, "frequency_penalty": 0.25}),
    ("triton", req(messages=HELLO, temperature=0.7, seed=-1), {"seed": 2**64 - 1}),  # the input is UINT64
    ("triton_bls", req(messages=HELLO, logprobs=True), {"return_log_probs": True, "stream": True}),
    ("mii_rest", req(messages=HELLO, temperature=0.7, extra={"top_k": 4}), {"top_k": 4, "do_sample": True}),
    ("mii_openai", req(messages=HELLO, temperature=0.7, extra={"top_k": 4}), {"top_k": 4}),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "request_", "expected"), WIRE, ids=[f"{w[0]}-{i}" for i, w in enumerate(WIRE)])
def test_the_engine_receives_the_field_in_its_own_form(
    fakes: dict[str, Fake], kind: str, request_: GenerationRequest, expected: dict[str, Any]
) -> None:
    _, body = generate(kind, fakes, request_)
    assert {k: body.get(k) for k in expected} == expected


@pytest.mark.parametrize("kind", ["triton", "mii_rest"])
def test_raw_text_engines_get_the_tools_in_the_prompt(fakes: dict[str, Fake], kind: str) -> None:
    _, body = generate(kind, fakes, req(messages=PARIS, tools=(WEATHER_TOOL,)))
    prompt = body["text_input"] if kind == "triton" else body["prompts"][0]
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt and prompt.endswith("<|im_start|>assistant\n")
    _, body = generate(kind, fakes, req(messages=PARIS, tools=(WEATHER_TOOL,), tool_choice="none"))
    prompt = body["text_input"] if kind == "triton" else body["prompts"][0]
    assert "get_weather" not in prompt  # "none": the model is not offered the tools


@pytest.mark.parametrize("kind", ["triton", "mii_rest"])
def test_raw_text_engines_get_the_tool_call_history_rendered(fakes: dict[str, Fake], kind: str) -> None:
    _, body = generate(kind, fakes, req(messages=HISTORY, tools=(WEATHER_TOOL,)))
    prompt = body["text_input"] if kind == "triton" else body["prompts"][0]
    assert '"name": "get_weather"' in prompt.split("</tools>")[1]  # the assistant's call, after the tools
    assert "Sunny, 21 C" in prompt


def test_fields_an_engine_lacks_never_go_out(fakes: dict[str, Fake]) -> None:
    """Even if a request carrying them reached the adapter, trtllm-serve (which refuses unknown fields)
    gets no parallel_tool_calls and MII's server no penalties."""
    _, body = generate("trtllm_serve", fakes, req(messages=PARIS, tools=(WEATHER_TOOL,), parallel_tool_calls=False))
    assert "parallel_tool_calls" not in body
    _, body = generate("mii_openai", fakes, req(messages=HELLO, presence_penalty=0.5, n=2))
    assert "presence_penalty" not in body and "n" not in body


# ---------------------------------------------------------------------------------- OpenAI's shapes back


def test_trtllm_serve_tool_call_comes_back_as_tool_call_pieces(fakes: dict[str, Fake]) -> None:
    """The demo model answers this question with a Hermes call; trtllm-serve's parser turns it into pieces."""
    chunks, _ = generate("trtllm_serve", fakes, req(messages=PARIS, tools=(WEATHER_TOOL,), max_tokens=200))
    pieces = [p for c in chunks for p in c.tool_calls]
    assert pieces[0].index == 0 and pieces[0].name == "get_weather" and pieces[0].id
    assert pieces[0].id.startswith("chatcmpl-tool-")
    assert all(p.index == 0 and p.name is None and p.id is None for p in pieces[1:])
    assert json.loads("".join(p.arguments for p in pieces)) == {"city": "Paris"}
    assert "".join(c.text for c in chunks) == ""  # the markup is not content
    assert chunks[-1].finish_reason == "tool_calls"


def test_trtllm_serve_without_a_tool_parser_leaves_the_markup_in_the_text(
    fakes: dict[str, Fake], engine: TinyEngine
) -> None:
    """Why the backend setting ``tool_parser`` mirrors ``--tool_parser``: without it the engine's answer is
    markup in the text, which the gateway parses itself (``tools_in_prompt``)."""
    chunks, _ = generate("trtllm_serve_plain", fakes, req(messages=PARIS, tools=(WEATHER_TOOL,), max_tokens=200))
    assert "".join(c.text for c in chunks) == HERMES_CALL and not any(c.tool_calls for c in chunks)
    assert chunks[-1].finish_reason == "stop"


def test_trtllm_serve_without_guided_decoding_refuses_response_format(fakes: dict[str, Fake]) -> None:
    with pytest.raises(BackendError) as err:
        generate("trtllm_serve_plain", fakes, req(messages=HELLO, response_format=JSON_SCHEMA))
    assert err.value.kind is ErrorKind.BAD_REQUEST and "Guided decoding is not enabled" in err.value.message


def test_trtllm_serve_json_schema_answer(fakes: dict[str, Fake], engine: TinyEngine) -> None:
    engine.scripted.append('{"city": "Paris"}')
    chunks, _ = generate("trtllm_serve", fakes, req(messages=PARIS, response_format=JSON_SCHEMA))
    assert json.loads("".join(c.text for c in chunks)) == {"city": "Paris"}


@pytest.mark.parametrize("chat", [True, False])
def test_trtllm_serve_logprobs_are_token_logprobs(fakes: dict[str, Fake], engine: TinyEngine, chat: bool) -> None:
    shape: dict[str, Any] = {"messages": HELLO} if chat else {"prompt": ZEN_PROMPT, "max_tokens": 12}
    chunks, _ = generate("trtllm_serve", fakes, req(logprobs=True, top_logprobs=2, **shape))
    logprobs = [t for c in chunks for t in c.logprobs]
    usage = chunks[-1].usage
    assert usage is not None and len(logprobs) == usage.completion_tokens
    prompt = engine.render_chat(HELLO) if chat else ZEN_PROMPT
    ids = engine._tokenizer.encode("".join(c.text for c in chunks), add_special_tokens=False).ids
    expected = engine.alternatives(prompt, ids, 2)
    for got, (lp, top) in zip(logprobs, expected, strict=False):
        assert got.logprob == pytest.approx(lp, abs=1e-4)
        assert len(got.top) == 2  # the sampled token was among the top: the engine's extra one is cut
        assert [a.logprob for a in got.top] == pytest.approx([v for _, v in top], abs=1e-4)
        assert got.top[0].token == got.token  # greedy: the chosen token is the best one
    assert logprobs[0].token == engine.decode_alone(ids[0])


def test_trtllm_serve_logprobs_without_alternatives(fakes: dict[str, Fake]) -> None:
    for shape in ({"messages": HELLO}, {"prompt": ZEN_PROMPT, "max_tokens": 8}):
        chunks, _ = generate("trtllm_serve", fakes, req(logprobs=True, **shape))
        logprobs = [t for c in chunks for t in c.logprobs]
        assert logprobs and all(t.top == () and t.logprob <= 0 for t in logprobs)


def test_trtllm_serve_native_n_answers_each_choice(fakes: dict[str, Fake], engine: TinyEngine) -> None:
    chunks, _ = generate("trtllm_serve", fakes, req(messages=HELLO, n=2))
    for index in (0, 1):
        mine = [c for c in chunks if c.index == index]
        assert "".join(c.text for c in mine) == GREETING_REPLY
        assert [c.finish_reason for c in mine if c.finish_reason] == ["stop"]
    usage = chunks[-1].usage
    # both choices, in the engine's one count
    assert usage is not None and usage.completion_tokens == 2 * engine.count_tokens(GREETING_REPLY)


def test_triton_streamed_logprobs_pair_each_token_with_its_text(fakes: dict[str, Fake], engine: TinyEngine) -> None:
    chunks, body = generate("triton_bls", fakes, req(messages=HELLO, logprobs=True))
    logprobs = [t for c in chunks for t in c.logprobs]
    usage = chunks[-1].usage
    assert usage is not None and len(logprobs) == usage.completion_tokens == engine.count_tokens(GREETING_REPLY)
    assert "".join(t.token for t in logprobs) == "".join(c.text for c in chunks) == GREETING_REPLY
    ids = engine._tokenizer.encode(GREETING_REPLY, add_special_tokens=False).ids
    scores = engine.alternatives(body["text_input"], ids, 1)
    assert [t.logprob for t in logprobs] == pytest.approx([lp for lp, _ in scores], abs=1e-4)


def test_triton_per_token_logprobs_follow_the_ensembles_stream(fakes: dict[str, Fake]) -> None:
    """Each response is one token decoded alone: its text (spaces lost with this tokenizer, as the
    ensemble shows it) and its log probability."""
    chunks, body = generate("triton_tokens", fakes, req(messages=HELLO, logprobs=True))
    logprobs = [t for c in chunks for t in c.logprobs]
    usage = chunks[-1].usage
    assert body["stream"] is True and usage is not None and len(logprobs) == usage.completion_tokens > 20
    assert "".join(t.token for t in logprobs) == "".join(c.text for c in chunks) == GREETING_REPLY.replace(" ", "")


def test_triton_guided_decoding_without_a_backend_fails(engine: TinyEngine) -> None:
    app = fake_triton.create_app(engine, FakeControl(), guided_decoding_backend=None)
    with serve_in_thread(app, "/v2/health/ready") as url:
        backend = TritonTrtllmBackend("t", SERVED, HttpSettings(url=url, served_model=SERVED))

        async def go() -> list[Chunk]:
            try:
                return [c async for c in backend.generate(req(messages=HELLO, response_format=JSON_SCHEMA))]
            finally:
                await backend.aclose()

        with pytest.raises(BackendError) as err:
            asyncio.run(go())
    assert "Guided decoding is not enabled" in err.value.detail


def test_triton_json_schema_answer(fakes: dict[str, Fake], engine: TinyEngine) -> None:
    engine.scripted.append('{"city": "Paris"}')
    chunks, _ = generate("triton", fakes, req(messages=PARIS, response_format=JSON_SCHEMA))
    assert json.loads("".join(c.text for c in chunks)) == {"city": "Paris"}


# --------------------------------------------------------------------- through a gateway, the openai client


@pytest.fixture(scope="module")
def gateway(fakes: dict[str, Fake], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway serving one model per adapter kind, each on its fake; raw-text engines parse Hermes calls."""
    config = write_config(
        tmp_path_factory.mktemp("caps-gateway") / "fleet.yaml",
        f"""
limits: {{max_tokens: 120}}
models:
  - {{name: trt, gguf: "{{GGUF}}"}}
  - {{name: triton, gguf: "{{GGUF}}", tool_parser: hermes}}
  - {{name: bls, gguf: "{{GGUF}}", tool_parser: hermes}}
  - {{name: rest, gguf: "{{GGUF}}", tool_parser: hermes}}
  - {{name: mii, gguf: "{{GGUF}}", tool_parser: hermes}}
backends:
  - {{name: trt, engine: trtllm_serve, url: "{fakes["trtllm_serve"].url}", model: trt, served_model: {SERVED},
     tool_parser: qwen3}}
  - {{name: triton, engine: triton_trtllm, url: "{fakes["triton"].url}", model: triton}}
  - {{name: bls, engine: triton_trtllm, url: "{fakes["triton"].url}", model: bls, triton_model: tensorrt_llm_bls,
     text_output: cumulative}}
  - {{name: rest, engine: mii_rest, url: "{fakes["mii_rest"].url}", model: rest, deployment: {SERVED}}}
  - {{name: mii, engine: mii_openai, url: "{fakes["mii_openai"].url}", model: mii, served_model: {SERVED}}}
""",
    )
    with serve_in_thread(create_app(load_config(config))) as base:
        yield base


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.mark.parametrize("model", ["trt", "triton", "bls", "rest"])
@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip_through_the_gateway(gateway: str, engine: TinyEngine, model: str, stream: bool) -> None:
    asked: Any = PARIS  # the demo model answers it with a Hermes call
    tools: Any = [WEATHER_TOOL]
    if stream:
        chunks = list(client(gateway).chat.completions.create(model=model, messages=asked, tools=tools, stream=True))
        pieces = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        assert pieces[0].id and pieces[0].function and pieces[0].function.name == "get_weather"
        arguments = "".join(p.function.arguments or "" for p in pieces if p.function)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        resp = client(gateway).chat.completions.create(model=model, messages=asked, tools=tools)
        (call,) = resp.choices[0].message.tool_calls or []
        assert call.type == "function" and call.function.name == "get_weather" and call.id
        arguments, finish = call.function.arguments, [resp.choices[0].finish_reason]
    assert json.loads(arguments) == {"city": "Paris"} and finish == ["tool_calls"]
    engine.scripted.append("It is sunny in Paris.")
    follow: Any = HISTORY
    answer = client(gateway).chat.completions.create(model=model, messages=follow, tools=tools)
    assert answer.choices[0].message.content == "It is sunny in Paris."


def test_n_through_the_gateway_native_and_fanned_out(gateway: str, fakes: dict[str, Fake]) -> None:
    hello: Any = HELLO
    for model in ("trt", "mii"):
        before = len(fakes["trtllm_serve" if model == "trt" else "mii_openai"].received)
        resp = client(gateway).chat.completions.create(model=model, messages=hello, n=2, temperature=0)
        assert [c.index for c in resp.choices] == [0, 1]
        assert all(c.message.content == GREETING_REPLY for c in resp.choices)
        got = fakes["trtllm_serve" if model == "trt" else "mii_openai"].received[before:]
        assert len(got) == (1 if model == "trt" else 2)  # trtllm-serve answers n itself; MII is asked twice


def test_what_a_backend_lacks_is_refused_naming_the_field(gateway: str) -> None:
    hello: Any = HELLO
    asks: dict[str, dict[str, Any]] = {
        "response_format": {"response_format": {"type": "json_object"}},
        "logprobs": {"logprobs": True},
        "seed": {"seed": 3, "temperature": 0.8},
    }
    for model, field in (("mii", "response_format"), ("triton", "logprobs"), ("rest", "seed")):
        extra = asks[field]
        with pytest.raises(openai.BadRequestError) as err:
            client(gateway).chat.completions.create(model=model, messages=hello, **extra)
        assert err.value.param == field, (model, err.value)


def test_streamed_triton_logprobs_through_the_gateway(gateway: str) -> None:
    hello: Any = HELLO
    resp = client(gateway).chat.completions.create(model="bls", messages=hello, logprobs=True, temperature=0)
    content = resp.choices[0].logprobs and resp.choices[0].logprobs.content
    assert content and "".join(t.token for t in content) == GREETING_REPLY and all(t.logprob <= 0 for t in content)
