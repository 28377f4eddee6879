"""The in-process engines' shared pieces for sampling fidelity: logprobs from logits, token strings,
logprobs riding on the chunk that carries their text, llama.cpp's logits processor and grammars."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, TokenLogprob
from backends.gguf_vocab import TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, Vocabulary
from backends.inproc import InProcessEngine, check_context, extra_int, seed32
from backends.inproc_threads import Step, ThreadedGeneration
from backends.inproc_tokens import LogprobMaker, TokenStrings
from backends.llamacpp_engine import RANDOM_SEED, StepProcessor, grammar_text

TOKENS = ["</s>", "<0xC3>", "<0xA9>", "\u2581Hel", "lo", "!"]
TYPES = [TOKEN_CONTROL, TOKEN_BYTE, TOKEN_BYTE, TOKEN_NORMAL, TOKEN_NORMAL, TOKEN_NORMAL]
VOCAB = Vocabulary(TOKENS, [0.0] * 6, TYPES, None, 0, None, None, False, False, None)
PIECES = [b"", b"\xc3", b"\xa9", b" Hel", b"lo", b"!"]


def test_token_strings_are_openais_spelling() -> None:
    table = TokenStrings(VOCAB, PIECES).table
    assert table[3] == (" Hel", (32, 72, 101, 108))
    assert table[1] == ("bytes:\\xc3", (0xC3,))  # half a character: OpenAI's bytes: spelling
    assert table[0] == ("</s>", tuple(b"</s>"))  # prints nothing: named


def test_logprobs_from_logits_are_a_log_softmax_with_sorted_alternatives() -> None:
    logits = np.array([0.5, -1.0, 2.0, 3.0, 1.0, 0.0], dtype=np.float32)
    maker = LogprobMaker(TokenStrings(VOCAB, PIECES), top=3)
    lp = maker.from_logits(logits, 4)
    expected = logits - math.log(sum(math.exp(x) for x in logits))
    assert lp.token == "lo" and math.isclose(lp.logprob, expected[4], abs_tol=1e-6)
    assert [t.token for t in lp.top] == [" Hel", "bytes:\\xa9", "lo"]
    assert [round(t.logprob, 5) for t in lp.top] == [round(float(expected[i]), 5) for i in (3, 2, 4)]
    assert maker.from_logits(logits.reshape(1, -1), 4).logprob == lp.logprob  # CTranslate2's rows are 2-D
    assert LogprobMaker(TokenStrings(VOCAB, PIECES), top=0).from_logits(logits, 4).top == ()


def test_more_alternatives_than_the_vocabulary_are_all_of_it() -> None:
    lp = LogprobMaker(TokenStrings(VOCAB, PIECES), top=20).from_logits(np.zeros(6, dtype=np.float32), 3)
    assert len(lp.top) == 6 and all(math.isclose(t.logprob, -math.log(6), abs_tol=1e-6) for t in lp.top)


def lp(token: str) -> TokenLogprob:
    return TokenLogprob(token, -0.5)


def stream(steps: list[Step], stop: tuple[str, ...] = (), max_tokens: int = 50) -> list[Chunk]:
    def loop(cancelled: Callable[[], bool]) -> Iterator[Step]:
        yield from steps

    async def go() -> list[Chunk]:
        workers = ThreadedGeneration("t", 1, 1)
        request = GenerationRequest("r", "m", prompt="x", stop=stop)
        try:
            return [c async for c in workers.run(request, loop, 1, PIECES, frozenset({0}), max_tokens)]
        finally:
            workers.shutdown()

    return asyncio.run(go())


def test_a_split_character_sends_both_tokens_logprobs_with_the_character() -> None:
    chunks = stream([(3, lp(" Hel")), (1, lp("bytes:\\xc3")), (2, lp("bytes:\\xa9")), (0, lp("</s>"))])
    assert [(c.text, [x.token for x in c.logprobs]) for c in chunks] == [
        (" Hel", [" Hel"]),
        ("é", ["bytes:\\xc3", "bytes:\\xa9"]),
        ("", []),  # the end token: not a completion token, no logprob
    ]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_text_held_for_a_stop_string_that_never_comes_is_sent_with_its_logprobs() -> None:
    chunks = stream([(5, lp("!")), (4, lp("lo")), (5, lp("!"))], stop=("lo?",))
    assert [(c.text, [x.token for x in c.logprobs]) for c in chunks] == [
        ("!", ["!"]),
        ("lo!", ["lo", "!"]),  # "lo" might have begun "lo?": held until "!" settled it
        ("", []),
    ]


def test_a_token_partly_held_goes_with_the_first_of_its_text() -> None:
    chunks = stream([(3, lp(" Hel")), (4, lp("lo")), (5, lp("!"))], stop=("lo?",))
    assert [(c.text, [x.token for x in c.logprobs]) for c in chunks] == [
        (" He", [" Hel"]),  # its "l" may begin "lo?"
        ("l", ["lo"]),
        ("lo!", ["!"]),
        ("", []),
    ]


def test_the_token_completing_a_stop_string_rides_on_the_last_chunk() -> None:
    chunks = stream([(3, lp(" Hel")), (4, lp("lo")), (5, lp("!"))], stop=("lo",))
    assert "".join(c.text for c in chunks) == " Hel"
    assert [x.token for c in chunks for x in c.logprobs] == [" Hel", "lo"]
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2


def test_plain_ids_stream_without_logprobs() -> None:
    chunks = stream([3, 4, 0])
    assert "".join(c.text for c in chunks) == " Hello" and all(c.logprobs == () for c in chunks)


def test_a_prompt_with_one_token_of_room_is_accepted_without_max_tokens() -> None:
    request = GenerationRequest("r", "m", prompt="x")
    assert check_context(request, 99, 100) == 1
    with pytest.raises(BackendError):
        check_context(request, 100, 100)


def test_extras_of_the_wrong_type_are_refused_by_name() -> None:
    assert extra_int(GenerationRequest("r", "m", prompt="x", extra={"top_k": 5}), "top_k", 0) == 5
    assert extra_int(GenerationRequest("r", "m", prompt="x"), "top_k", 0) == 0
    for bad in ("5", True, 2.5):
        with pytest.raises(BackendError) as info:
            extra_int(GenerationRequest("r", "m", prompt="x", extra={"top_k": bad}), "top_k", 0)
        assert info.value.kind is ErrorKind.BAD_REQUEST and info.value.param == "top_k"


def test_any_seed_becomes_32_bits_and_never_llamas_random() -> None:
    assert seed32(1) == 1 and 0 <= seed32(-1) < RANDOM_SEED and seed32(RANDOM_SEED) != RANDOM_SEED
    assert seed32(2**40 + 3) < 2**32


def test_step_processor_biases_holds_end_tokens_and_keeps_raw_logits() -> None:
    maker = LogprobMaker(TokenStrings(VOCAB, PIECES), top=0)
    proc = StepProcessor(maker, {3: -100.0, 5: 2.5, 999: 1.0}, frozenset({0}), min_tokens=1, n_vocab=6)
    ids = np.zeros(0, dtype=np.intc)
    first = proc(ids, np.zeros(6, dtype=np.float32))
    assert proc.last is not None and list(proc.last) == [0.0] * 6  # before the bias: the model's own
    assert first[3] == -100.0 and first[5] == 2.5 and first[0] == -math.inf
    second = proc(ids, np.zeros(6, dtype=np.float32))
    assert second[0] == 0.0  # min_tokens reached: end tokens are allowed again


WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def request(**kw: object) -> GenerationRequest:
    return GenerationRequest("r", "m", messages=[{"role": "user", "content": "x"}], **kw)  # type: ignore[arg-type]


@pytest.mark.engines  # llama-cpp-python's schema converter (the `llama` extra)
def test_grammars_only_for_what_constrains_the_answer() -> None:
    assert grammar_text(request()) is None
    assert grammar_text(request(tools=(WEATHER,))) is None  # auto: the model may answer in text
    assert grammar_text(request(tools=(WEATHER,), tool_choice="none")) is None
    obj = grammar_text(request(response_format={"type": "json_object"}))
    assert obj is not None and "\nroot ::= object" in obj
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    text = grammar_text(request(response_format=fmt))
    assert text is not None and "root ::=" in text and "n-kv" in text


@pytest.mark.engines  # llama-cpp-python's schema converter (the `llama` extra)
def test_a_forced_call_grammar_wraps_the_named_tools_schema_in_hermes_tags() -> None:
    named = grammar_text(
        request(tools=(TIME, WEATHER), tool_choice={"type": "function", "function": {"name": "get_weather"}})
    )
    assert named is not None
    assert named.startswith('root ::= "<tool_call>\\n" tool-call "\\n</tool_call>"\n')
    assert named.count("root ::=") == 1 and "tool-call ::=" in named
    assert "get_weather" in named and "get_time" not in named
    either = grammar_text(request(tools=(TIME, WEATHER), tool_choice="required"))
    assert either is not None and "get_weather" in either and "get_time" in either
    json.dumps(either)  # plain text


@pytest.mark.engines  # llama-cpp-python's schema converter (the `llama` extra)
def test_json_strings_exclude_raw_control_characters() -> None:
    text = grammar_text(request(response_format={"type": "json_object"}))
    assert text is not None and 'char ::= [^"\\\\\\x7F\\x00-\\x1F]' in text


PLAIN_CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def engine(template: str | None) -> InProcessEngine:
    vocab = Vocabulary(TOKENS, [0.0] * 6, TYPES, None, 0, None, None, False, False, template)
    return InProcessEngine("e", "m", vocab, 100, 1, 1)


def test_a_template_that_cannot_render_tools_refuses_them_instead_of_dropping_them() -> None:
    plain = engine(PLAIN_CHATML)
    assert plain.prompt_text(request()) == "<|im_start|>user\nx<|im_end|>\n"
    assert plain.prompt_text(request(tools=(WEATHER,), tool_choice="none")) == "<|im_start|>user\nx<|im_end|>\n"
    with pytest.raises(BackendError) as info:
        plain.prompt_text(request(tools=(WEATHER,)))
    assert info.value.kind is ErrorKind.BAD_REQUEST and info.value.param == "tools" and info.value.retryable
    history: list[dict[str, Any]] = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": WEATHER}]},
        {"role": "tool", "tool_call_id": "c", "content": "sunny"},
    ]
    with pytest.raises(BackendError) as info:
        plain.prompt_text(GenerationRequest("r", "m", messages=history))
    assert info.value.param == "messages"


def test_tools_reach_a_template_that_renders_them() -> None:
    prompt = engine(None).prompt_text(request(tools=(WEATHER,)))
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt
    assert "get_weather" not in engine(None).prompt_text(request(tools=(WEATHER,), tool_choice="none"))


@pytest.mark.engines  # llama-cpp-python's schema converter (the `llama` extra)
def test_a_forced_call_is_written_in_the_models_tool_call_format() -> None:
    forced = request(tools=(WEATHER,), tool_choice="required")
    llama3 = grammar_text(forced, "llama3_json")
    assert llama3 is not None and llama3.startswith("root ::= tool-call\n") and "parameters-kv" in llama3
    with pytest.raises(ValueError):
        grammar_text(forced, "mistral")  # its [TOOL_CALLS] marker is a control token: not written here
    assert grammar_text(request(response_format={"type": "json_object"}), "mistral") is not None
