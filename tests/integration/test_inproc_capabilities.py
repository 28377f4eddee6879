"""Every capability the in-process engines declare takes visible effect in the engine itself.

Run against the real CTranslate2 and llama.cpp (llama-cpp-python) with the demo model: seeds
reproduce and differ, logprobs are log probabilities whose best alternative is the greedy choice,
``logit_bias`` moves llama.cpp's choice, penalties change what it writes, ``response_format`` and a
forced tool call come out as JSON that validates, and each declared extra changes the answer.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any, cast

import jsonschema
import pytest

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest
from backends.capabilities import (
    JSON_OBJECT,
    JSON_SCHEMA,
    LOGIT_BIAS,
    LOGPROBS,
    PENALTIES,
    SEED,
    TOOL_CHOICE_REQUIRED,
    TOOLS,
    TOP_LOGPROBS,
    capabilities_of,
)
from backends.ctranslate2_engine import CTranslate2Backend
from backends.inproc import InProcessEngine
from backends.llamacpp_engine import LlamaCppBackend
from backends.text import CHATML
from backends.tool_calls import parser_for
from tests.conftest import DEMO_GGUF, GREETING_REPLY, ZEN_PROMPT

HELLO = [{"role": "user", "content": "Hello"}]
# A prompt the demo model is unsure how to continue: sampled answers differ from seed to seed.
OPEN_PROMPT = "Hello"

Engine = CTranslate2Backend | LlamaCppBackend
Make = Callable[[], Engine]


@pytest.fixture(params=["ctranslate2", "llama_cpp"])
def make(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Make]:
    """Fresh backends of one engine (asyncio primitives belong to one event loop: one per ``run``)."""
    made: list[Engine] = []
    cache = tmp_path_factory.getbasetemp() / "ct2-cache"

    def new() -> Engine:
        if request.param == "ctranslate2":
            made.append(CTranslate2Backend("under-test", "enginegate-demo", DEMO_GGUF, cache))
        else:
            made.append(LlamaCppBackend("under-test", "enginegate-demo", DEMO_GGUF))
        return made[-1]

    yield new
    for backend in made:
        backend._workers.shutdown()


@pytest.fixture
def llama() -> Iterator[Callable[[], LlamaCppBackend]]:
    made: list[LlamaCppBackend] = []

    def new() -> LlamaCppBackend:
        made.append(LlamaCppBackend("under-test", "enginegate-demo", DEMO_GGUF))
        return made[-1]

    yield new
    for backend in made:
        backend._workers.shutdown()


def req(**kw: Any) -> GenerationRequest:
    kw.setdefault("max_tokens", 24)
    return GenerationRequest("t", "enginegate-demo", **kw)


async def collect(backend: Engine, request: GenerationRequest) -> list[Chunk]:
    return [c async for c in backend.generate(request)]


def run(backend: Engine, *requests: GenerationRequest, concurrent: bool = False) -> list[list[Chunk]]:
    """Each request's chunks, one after another (or all at once), on one event loop."""

    async def go() -> list[list[Chunk]]:
        if concurrent:
            return list(await asyncio.gather(*(collect(backend, r) for r in requests)))
        return [await collect(backend, r) for r in requests]

    return asyncio.run(go())


def text(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks)


def tokens(chunks: list[Chunk]) -> list[str]:
    return [lp.token for c in chunks for lp in c.logprobs]


def distinct_tokens(chunks: list[Chunk]) -> int:
    return len(Counter(tokens(chunks)))


def token_id(backend: InProcessEngine, piece: bytes) -> int:
    return backend._pieces.index(piece)


# --- seeds


def test_same_seed_samples_the_same_text_run_after_run(make: Make) -> None:
    # ignore_eos: the sample runs its full length whatever it draws (an end of turn is one draw)
    answers = run(make(), *(req(prompt=OPEN_PROMPT, seed=1, extra={"ignore_eos": True}) for _ in range(5)))
    assert len({text(a) for a in answers}) == 1, [text(a) for a in answers]
    assert all(a[-1].usage and a[-1].usage.completion_tokens == 24 for a in answers)


def test_different_seeds_sample_different_texts(make: Make) -> None:
    answers = run(make(), *(req(prompt=OPEN_PROMPT, seed=s) for s in (1, 2, 3, 4)))
    assert len({text(a) for a in answers}) >= 3, [text(a) for a in answers]


def test_seeded_requests_running_together_each_keep_their_seed(make: Make) -> None:
    alone = [text(a) for a in run(make(), req(prompt=OPEN_PROMPT, seed=1), req(prompt=OPEN_PROMPT, seed=2))]
    assert alone[0] != alone[1]
    together = run(make(), *(req(prompt=OPEN_PROMPT, seed=1 + i % 2) for i in range(6)), concurrent=True)
    assert [text(a) for a in together] == alone * 3


def test_two_ctranslate2_backends_interleaving_seeded_requests_each_keep_their_seed(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """CTranslate2's seed is process-wide: two backends in one process must not mix each other's seeds."""
    cache = tmp_path_factory.getbasetemp() / "ct2-cache"
    backends = [CTranslate2Backend(f"twin-{i}", "enginegate-demo", DEMO_GGUF, cache) for i in range(2)]
    try:
        alone = [text(a) for a in run(backends[0], *(req(prompt=OPEN_PROMPT, seed=s) for s in (1, 2, 3)))]
        assert len(set(alone)) >= 2, alone

        async def interleaved() -> list[list[Chunk]]:
            jobs = [collect(backends[i % 2], req(prompt=OPEN_PROMPT, seed=1 + i % 3)) for i in range(12)]
            return list(await asyncio.gather(*jobs))

        together = [text(a) for a in asyncio.run(interleaved())]
        assert together == [alone[i % 3] for i in range(12)]
    finally:
        for backend in backends:
            backend._workers.shutdown()


def test_a_seed_is_not_left_behind_for_unseeded_requests(make: Make) -> None:
    answers = run(
        make(), req(prompt=OPEN_PROMPT, seed=1), *(req(prompt=OPEN_PROMPT, temperature=1.5) for _ in range(4))
    )
    unseeded = {text(a) for a in answers[1:]}
    assert len(unseeded) >= 2, unseeded


# --- logprobs


def test_greedy_logprobs_are_the_best_alternative_and_spell_the_text(make: Make) -> None:
    [chunks] = run(make(), req(messages=HELLO, temperature=0.0, max_tokens=60, logprobs=True, top_logprobs=5))
    assert text(chunks) == GREETING_REPLY
    usage = chunks[-1].usage
    assert usage is not None
    entries = [lp for c in chunks for lp in c.logprobs]
    assert len(entries) == usage.completion_tokens
    assert "".join(lp.token for lp in entries) == GREETING_REPLY
    for chunk in chunks:  # each token rides on the chunk that carries its text
        assert "".join(lp.token for lp in chunk.logprobs) == chunk.text
    for lp in entries:
        assert lp.logprob <= 0.0
        assert lp.bytes is not None and bytes(lp.bytes).decode() == lp.token
        assert len(lp.top) == 5
        assert lp.top[0].token == lp.token and math.isclose(lp.top[0].logprob, lp.logprob, abs_tol=1e-5)
        assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
        assert sum(math.exp(t.logprob) for t in lp.top) <= 1.0 + 1e-5
        assert len({t.token for t in lp.top}) == 5


def test_logprobs_without_alternatives_match_those_with_them(make: Make) -> None:
    plain, with_top = run(
        make(),
        req(messages=HELLO, temperature=0.0, logprobs=True),
        req(messages=HELLO, temperature=0.0, logprobs=True, top_logprobs=2),
    )
    a = [lp for c in plain for lp in c.logprobs]
    b = [lp for c in with_top for lp in c.logprobs]
    assert [x.token for x in a] == [x.token for x in b] and len(a) == 24
    assert all(x.top == () for x in a)
    assert all(math.isclose(x.logprob, y.logprob, abs_tol=1e-3) for x, y in zip(a, b, strict=True))


def test_sampled_tokens_logprobs_are_of_the_sampled_token(make: Make) -> None:
    [chunks] = run(make(), req(prompt=OPEN_PROMPT, seed=5, logprobs=True, top_logprobs=20))
    entries = [lp for c in chunks for lp in c.logprobs]
    assert "".join(lp.token for lp in entries) == text(chunks)
    for lp in entries:
        assert len(lp.top) == 20
        listed = {t.token: t.logprob for t in lp.top}
        if lp.token in listed:
            assert math.isclose(listed[lp.token], lp.logprob, abs_tol=1e-5)
        else:  # a token outside the top 20 is less likely than all of them
            assert lp.logprob <= lp.top[-1].logprob


def test_logprobs_of_text_held_back_for_a_stop_string_come_with_that_text(make: Make) -> None:
    # " d" and "demo m" may begin the stop string "demo x": held back, then sent with the next tokens.
    [chunks] = run(make(), req(messages=HELLO, temperature=0.0, max_tokens=60, logprobs=True, stop=["demo x", "ugly"]))
    assert text(chunks) == GREETING_REPLY.split("ugly")[0]
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].finish_reason == "stop"
    entries = tokens(chunks)
    assert len(entries) == usage.completion_tokens
    assert "".join(entries).startswith(text(chunks)) and "ugly" in entries[-1]  # the token that completed the stop
    sent_text = sent_tokens = ""
    for chunk in chunks:  # a token's logprob comes with the first of its text, never before it
        sent_text += chunk.text
        sent_tokens += "".join(lp.token for lp in chunk.logprobs)
        if chunk.finish_reason is None:
            assert sent_tokens.startswith(sent_text)
            assert not chunk.logprobs or len(sent_tokens) - len(sent_text) < len(chunk.logprobs[-1].token)


# --- extras and echo


def test_top_k_one_samples_the_greedy_answer(make: Make) -> None:
    greedy, top1 = run(
        make(), req(prompt=OPEN_PROMPT, temperature=0.0), req(prompt=OPEN_PROMPT, seed=7, extra={"top_k": 1})
    )
    sampled = run(make(), req(prompt=OPEN_PROMPT, seed=7))[0]
    assert text(top1) == text(greedy) != text(sampled)


def test_top_p_of_zero_keeps_only_the_likeliest_token(make: Make) -> None:
    greedy, nucleus = run(make(), req(prompt=OPEN_PROMPT, temperature=0.0), req(prompt=OPEN_PROMPT, seed=7, top_p=0.0))
    assert text(nucleus) == text(greedy)


def test_repetition_penalty_makes_a_long_answer_repeat_itself_less(make: Make) -> None:
    # Greedy decoding past the end token: the demo model loops over its few sentences.
    long: dict[str, Any] = {"temperature": 0.0, "max_tokens": 150, "logprobs": True}
    plain, penalised = run(
        make(),
        req(messages=HELLO, **long, extra={"ignore_eos": True}),
        req(messages=HELLO, **long, extra={"ignore_eos": True, "repetition_penalty": 1.5}),
    )
    assert text(penalised) != text(plain)
    assert distinct_tokens(penalised) > distinct_tokens(plain) + 5


def test_min_tokens_holds_off_the_end_token(make: Make) -> None:
    plain, held = run(
        make(),
        req(messages=HELLO, temperature=0.0, max_tokens=60),
        req(messages=HELLO, temperature=0.0, max_tokens=60, extra={"min_tokens": 40}),
    )
    assert plain[-1].usage is not None and plain[-1].usage.completion_tokens < 40
    assert held[-1].usage is not None and held[-1].usage.completion_tokens >= 40
    assert text(held).startswith(GREETING_REPLY)


def test_echo_returns_the_prompt_first(make: Make) -> None:
    plain, echoed = run(
        make(), req(prompt=ZEN_PROMPT, temperature=0.0), req(prompt=ZEN_PROMPT, temperature=0.0, echo=True)
    )
    assert echoed[0].text == ZEN_PROMPT
    assert text(echoed) == ZEN_PROMPT + text(plain)
    assert echoed[-1].usage == plain[-1].usage


def test_an_extra_of_the_wrong_type_is_a_bad_request_naming_it(make: Make) -> None:
    with pytest.raises(BackendError) as info:
        run(make(), req(prompt=OPEN_PROMPT, extra={"top_k": "ten"}))
    assert info.value.kind is ErrorKind.BAD_REQUEST and info.value.param == "top_k"


def test_declared_capabilities_are_what_each_engine_does() -> None:
    ct2 = capabilities_of(CTranslate2Backend)
    llama = capabilities_of(LlamaCppBackend)
    assert {SEED, LOGPROBS, TOP_LOGPROBS, TOOLS} <= ct2.features
    # CTranslate2 has no additive penalties, no logit bias from Python and no constrained decoding.
    assert not {PENALTIES, LOGIT_BIAS, JSON_OBJECT, JSON_SCHEMA, TOOL_CHOICE_REQUIRED} & ct2.features
    assert {SEED, LOGPROBS, TOP_LOGPROBS, PENALTIES, LOGIT_BIAS, JSON_OBJECT, JSON_SCHEMA, TOOLS} <= llama.features
    assert TOOL_CHOICE_REQUIRED in llama.features
    assert ct2.tools_in_prompt and llama.tools_in_prompt and not ct2.native_n and not llama.native_n


# --- llama.cpp only: logit bias, penalties, min_p and mirostat, grammars


LlamaMake = Callable[[], LlamaCppBackend]


def test_logit_bias_against_the_greedy_first_token_gives_the_runner_up(llama: LlamaMake) -> None:
    backend = llama()
    [greedy] = run(backend, req(messages=HELLO, temperature=0.0, max_tokens=3, logprobs=True, top_logprobs=2))
    first = greedy[0].logprobs[0]
    assert first.bytes is not None
    banned = token_id(backend, bytes(first.bytes))
    [biased] = run(
        llama(), req(messages=HELLO, temperature=0.0, max_tokens=3, logit_bias={banned: -100}, logprobs=True)
    )
    assert tokens(biased)[0] == first.top[1].token != first.token
    # Logprobs are the model's distribution before the bias: the banned token is still the likeliest there.
    assert biased[0].logprobs[0].logprob < first.logprob


def test_logit_bias_of_100_forces_a_token(llama: LlamaMake) -> None:
    backend = llama()
    forced = token_id(backend, b"x")
    [chunks] = run(backend, req(messages=HELLO, temperature=0.0, max_tokens=5, logit_bias={forced: 100}))
    assert text(chunks) == "xxxxx"
    [sampled] = run(llama(), req(messages=HELLO, seed=4, max_tokens=5, logit_bias={forced: 100}))
    assert text(sampled) == "xxxxx"


@pytest.mark.parametrize("penalty", ["frequency_penalty", "presence_penalty"])
def test_penalties_make_a_long_answer_repeat_itself_less(llama: LlamaMake, penalty: str) -> None:
    # Greedy decoding past the end token: the demo model loops over its few sentences.
    long = {"temperature": 0.0, "max_tokens": 150, "logprobs": True, "extra": {"ignore_eos": True}}
    plain, penalised, again = run(
        llama(),
        req(messages=HELLO, **long),
        req(messages=HELLO, **long, **{penalty: 2.0}),
        req(messages=HELLO, **long, **{penalty: 2.0}),
    )
    assert text(penalised) == text(again), "penalties are deterministic"
    assert text(penalised) != text(plain)
    assert distinct_tokens(penalised) > distinct_tokens(plain) + 5


def test_penalties_change_a_seeded_sample_reproducibly(llama: LlamaMake) -> None:
    sample = {"prompt": OPEN_PROMPT, "seed": 11, "max_tokens": 64, "logprobs": True, "extra": {"ignore_eos": True}}
    plain, penalised, again = run(
        llama(), req(**sample), req(**sample, frequency_penalty=2.0), req(**sample, frequency_penalty=2.0)
    )
    assert text(penalised) == text(again) != text(plain)
    assert max(Counter(tokens(penalised)).values()) <= max(Counter(tokens(plain)).values())


def test_min_p_of_one_keeps_only_the_likeliest_token(llama: LlamaMake) -> None:
    greedy, min_p = run(
        llama(), req(prompt=OPEN_PROMPT, temperature=0.0), req(prompt=OPEN_PROMPT, seed=7, extra={"min_p": 1.0})
    )
    assert text(min_p) == text(greedy)


def test_mirostat_and_typical_p_change_a_seeded_sample(llama: LlamaMake) -> None:
    plain, mirostat, typical = run(
        llama(),
        req(prompt=OPEN_PROMPT, seed=7, max_tokens=40),
        req(prompt=OPEN_PROMPT, seed=7, max_tokens=40, extra={"mirostat": 2, "mirostat_tau": 1.0}),
        req(prompt=OPEN_PROMPT, seed=7, max_tokens=40, extra={"typical_p": 0.2}),
    )
    assert text(mirostat) != text(plain)
    assert text(typical) != text(plain)


WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "London", "Tokyo"]},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "rain": {"type": "boolean"},
    },
    "required": ["city", "unit", "rain"],
    "additionalProperties": False,
}


def test_json_schema_output_parses_and_validates(llama: LlamaMake) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER_SCHEMA, "strict": True}}
    free, constrained, sampled = run(
        llama(),
        req(messages=HELLO, temperature=0.0, max_tokens=80),
        req(messages=HELLO, temperature=0.0, max_tokens=80, response_format=fmt),
        req(messages=HELLO, seed=3, max_tokens=80, response_format=fmt),
    )
    assert text(free) == GREETING_REPLY  # the demo model writes no JSON of its own
    for chunks in (constrained, sampled):
        assert chunks[-1].finish_reason == "stop"
        jsonschema.validate(json.loads(text(chunks)), WEATHER_SCHEMA)


def test_free_strings_in_json_hold_no_raw_control_characters(llama: LlamaMake) -> None:
    # The demo model likes newlines; inside a JSON string one must be escaped, or no parser takes it.
    schema = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 60}}, "required": ["note"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "note", "schema": schema}}
    answers = run(llama(), *(req(messages=HELLO, seed=s, max_tokens=200, response_format=fmt) for s in range(4)))
    for chunks in answers:
        assert chunks[-1].finish_reason == "stop"
        jsonschema.validate(json.loads(text(chunks)), schema)


def test_a_schema_llama_cpp_cannot_follow_is_a_bad_request(llama: LlamaMake) -> None:
    backend = llama()
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "[a-"}}}
    with pytest.raises(BackendError) as info:
        run(backend, req(messages=HELLO, response_format=fmt))
    assert info.value.kind is ErrorKind.BAD_REQUEST and info.value.param == "response_format"
    assert text(run(backend, req(messages=HELLO, temperature=0.0, max_tokens=60))[0]) == GREETING_REPLY


def test_a_bug_in_grammar_conversion_is_not_the_clients_fault(
    llama: LlamaMake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the converter's own complaints are a 400; anything else is the gateway's bug, not a bad request."""
    import backends.llamacpp_engine as engine

    def broken(request: GenerationRequest, tool_format: str | None = "hermes") -> str | None:
        raise AttributeError("a bug")

    monkeypatch.setattr(engine, "grammar_text", broken)
    fmt = {"type": "json_object"}
    with pytest.raises(AttributeError):
        run(llama(), req(messages=HELLO, response_format=fmt))


def test_json_object_output_is_a_json_object(llama: LlamaMake) -> None:
    # The demo model never closes a string of its own accord; a bias toward quotes and braces lets it end.
    backend = llama()
    bias = {token_id(backend, b'"'): 30.0, token_id(backend, b"}"): 20.0}
    free, constrained = run(
        backend,
        req(messages=HELLO, temperature=0.0, max_tokens=100, logit_bias=bias),
        req(messages=HELLO, temperature=0.0, max_tokens=100, logit_bias=bias, response_format={"type": "json_object"}),
    )
    with pytest.raises(ValueError):
        json.loads(text(free))
    assert constrained[-1].finish_reason == "stop"
    assert isinstance(json.loads(text(constrained)), dict)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "London"]}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC"]}}}},
}


def with_tools(backend: Engine) -> Engine:
    """The template the demo model carries once rebuilt with tools (tools/build_demo_model.py): the model
    file at hand may predate it. What is under test is what the engine does with the request's tools."""
    backend.use_template(CHATML)
    return backend


HERMES = re.compile(r"\A<tool_call>\n(?P<call>.*)\n</tool_call>\Z", re.S)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
def test_forced_tool_choice_writes_a_hermes_call_that_validates(llama: LlamaMake, choice: Any) -> None:
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = (TIME_TOOL, WEATHER_TOOL) if choice != "required" else (WEATHER_TOOL,)
    [chunks] = run(
        with_tools(llama()), req(messages=asked, temperature=0.0, max_tokens=200, tools=tools, tool_choice=choice)
    )
    assert chunks[-1].finish_reason == "stop"
    m = HERMES.match(text(chunks))
    assert m, text(chunks)
    call = json.loads(m["call"])
    assert call["name"] == "get_weather"
    jsonschema.validate(call["arguments"], WEATHER_TOOL["function"]["parameters"])  # type: ignore[index]
    # The gateway's Hermes parser reads it as one call, streamed a chunk at a time.
    parser = parser_for("hermes", seed=1)
    deltas = [d for c in chunks for d in parser.feed(c.text)[1]] + parser.finish()[1]
    assert parser.called and deltas[0].name == "get_weather"
    assert json.loads("".join(d.arguments for d in deltas)) == call["arguments"]


@pytest.mark.engines  # llama-cpp-python (the `llama` extra)
def test_a_forced_call_follows_the_models_llama3_json_format() -> None:
    backend = with_tools(LlamaCppBackend("under-test", "enginegate-demo", DEMO_GGUF, tool_parser="llama3_json"))
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    [chunks] = run(
        backend, req(messages=asked, temperature=0.0, max_tokens=200, tools=(WEATHER_TOOL,), tool_choice="required")
    )
    backend._workers.shutdown()
    assert chunks[-1].finish_reason == "stop"
    parser = parser_for("llama3_json", seed=1)
    deltas = [d for c in chunks for d in parser.feed(c.text)[1]] + parser.finish()[1]
    assert parser.called and deltas[0].name == "get_weather", text(chunks)
    jsonschema.validate(json.loads("".join(d.arguments for d in deltas)), WEATHER_TOOL["function"]["parameters"])  # type: ignore[index]


@pytest.mark.engines  # llama-cpp-python (the `llama` extra)
def test_a_forced_call_in_a_format_llama_cpp_cannot_write_is_a_bad_request() -> None:
    backend = with_tools(LlamaCppBackend("under-test", "enginegate-demo", DEMO_GGUF, tool_parser="mistral"))
    with pytest.raises(BackendError) as info:
        run(backend, req(messages=HELLO, tools=(WEATHER_TOOL,), tool_choice="required"))
    backend._workers.shutdown()
    assert info.value.kind is ErrorKind.BAD_REQUEST and info.value.param == "tool_choice"


def test_a_forced_call_picks_only_among_the_tools(llama: LlamaMake) -> None:
    asked = [{"role": "user", "content": "What time is it?"}]
    [chunks] = run(
        with_tools(llama()),
        req(messages=asked, seed=2, max_tokens=200, tools=(TIME_TOOL, WEATHER_TOOL), tool_choice="required"),
    )
    m = HERMES.match(text(chunks))
    assert m, text(chunks)
    assert json.loads(m["call"])["name"] in ("get_time", "get_weather")


def test_a_cancelled_seeded_request_frees_the_engine(make: Make) -> None:
    backend = make()

    async def go() -> str:
        long = req(prompt=OPEN_PROMPT, seed=1, max_tokens=2000, extra={"ignore_eos": True})
        stream = cast(AsyncGenerator[Chunk, None], backend.generate(long))
        async for _ in stream:
            break
        await stream.aclose()
        return text(await collect(backend, req(prompt=OPEN_PROMPT, seed=1)))

    after_cancel = asyncio.run(go())
    assert after_cancel == text(run(make(), req(prompt=OPEN_PROMPT, seed=1))[0])
    assert backend.generated_tokens < 1000, "the cancelled request ran on"


def test_tools_are_rendered_into_the_prompt_unless_tool_choice_is_none(make: Make) -> None:
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    history = [
        *asked,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    backend = with_tools(make())
    plain, tooled, none, follow_up = run(
        backend,
        req(messages=asked, temperature=0.0, max_tokens=1),
        req(messages=asked, temperature=0.0, max_tokens=1, tools=(WEATHER_TOOL,)),
        req(messages=asked, temperature=0.0, max_tokens=1, tools=(WEATHER_TOOL,), tool_choice="none"),
        req(messages=history, temperature=0.0, max_tokens=1, tools=(WEATHER_TOOL,)),
    )
    counts = [c[-1].usage.prompt_tokens for c in (plain, tooled, none, follow_up) if c[-1].usage]
    assert len(counts) == 4
    # The tool's name and schema are in the prompt: dozens of tokens more.
    assert counts[1] > counts[0] + 50
    assert counts[2] == counts[0]
    assert counts[3] > counts[1]  # the call and its result are rendered too
