"""The TensorRT-LLM contract fakes (trtllm-serve and Triton with the TensorRT-LLM ensemble) over real HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import GREETING_REPLY, ZEN_CONTINUATION, ZEN_PROMPT
from tests.contract import fake_triton, fake_trtllm_serve
from tests.contract.control import FakeControl
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread
from tests.polling import passes, settles, wait_until

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]
CHAT = {"model": "enginegate-demo", "messages": HELLO, "temperature": 0}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> TinyEngine:
    return TinyEngine(tmp_path_factory.mktemp("trtllm-cache"))


@pytest.fixture(scope="module")
def greeting(engine: TinyEngine) -> tuple[int, int]:
    """Prompt and answer tokens of the greeting (the demo model's own count: it is retrained now and then)."""
    return engine.count_tokens(engine.render_chat([{"role": "user", "content": "Hello"}])), engine.count_tokens(
        GREETING_REPLY
    )


@pytest.fixture(scope="module")
def trt_control() -> FakeControl:
    return FakeControl()


@pytest.fixture(scope="module")
def triton_control() -> FakeControl:
    return FakeControl()


@pytest.fixture(scope="module")
def trt(engine: TinyEngine, trt_control: FakeControl) -> Iterator[str]:
    with serve_in_thread(fake_trtllm_serve.create_app(engine, trt_control), ready_path="/health") as url:
        yield url


@pytest.fixture(scope="module")
def triton(engine: TinyEngine, triton_control: FakeControl) -> Iterator[str]:
    with serve_in_thread(fake_triton.create_app(engine, triton_control), ready_path="/v2/health/ready") as url:
        yield url


@pytest.fixture(autouse=True)
def _reset_controls(trt_control: FakeControl, triton_control: FakeControl) -> Iterator[None]:
    yield
    for control in (trt_control, triton_control):
        control.fail_next, control.delay_s, control.healthy, control.loading = None, 0.0, True, False


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """The parser names every counter sample ``*_total``, also Triton's, whose exposition has no such suffix."""
    names = (name, name + "_total")
    return sum(v for (n, lab), v in samples.items() if n in names and labels.items() <= dict(lab).items())


def _events(body: str) -> list[str]:
    assert body.endswith("\n\n")
    return body[:-2].split("\n\n")


def _stops_generating(engine: TinyEngine, before: int) -> int:
    """Waits for the engine to go idle; returns how many tokens were generated since ``before``."""
    wait_until(lambda: engine.active_streams == 0, message="the engine stream was never closed")
    # The worker thread may finish the token it was computing; then the counter must stay put (settles
    # fails if it keeps moving).
    return settles(lambda: engine.generated_tokens, quiet_s=0.3) - before


def _while_delayed(control: FakeControl, request: Callable[[], Any], probe: Callable[[], None]) -> None:
    """Runs ``request`` held 1 s before its first token, and ``probe`` until it passes while it waits: the
    probe's state (a waiting request) only exists during that second, so a probe that never holds fails."""
    control.delay_s = 1.0
    worker = threading.Thread(target=request)
    worker.start()
    try:
        passes(probe)
    finally:
        worker.join(timeout=15)


# ---------------------------------------------------------------------------------------------- trtllm-serve


def test_openai_client_greedy_chat(trt: str, greeting: tuple[int, int]) -> None:
    client = openai.OpenAI(base_url=trt + "/v1", api_key="x", max_retries=0)
    resp = client.chat.completions.create(model="enginegate-demo", messages=HELLO, temperature=0)
    assert resp.choices[0].message.content == GREETING_REPLY
    assert resp.choices[0].finish_reason == "stop"
    assert resp.id.startswith("chatcmpl-") and resp.model == "enginegate-demo"
    assert resp.usage is not None and (resp.usage.prompt_tokens, resp.usage.completion_tokens) == greeting


def test_openai_client_stream_with_usage_chunk(trt: str, greeting: tuple[int, int]) -> None:
    client = openai.OpenAI(base_url=trt + "/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="enginegate-demo", messages=HELLO, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == GREETING_REPLY
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == greeting
    # continuous_usage_stats defaults to true in trtllm-serve: every chunk carries usage
    assert all(c.usage is not None for c in chunks)


def test_raw_stream_framing(trt: str) -> None:
    resp = httpx.post(f"{trt}/v1/chat/completions", json=CHAT | {"stream": True})
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = _events(resp.text)
    assert events[0].startswith("data: {") and events[0].endswith("} ")  # the real server's stray space
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and all("usage" not in c for c in chunks)
    assert chunks[1]["choices"][0]["delta"] == {"content": "Hello", "reasoning_content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_unknown_field_is_rejected_by_the_request_model(trt: str) -> None:
    resp = httpx.post(f"{trt}/v1/chat/completions", json=CHAT | {"frobnicate": 1})
    assert resp.status_code == 400
    body = resp.json()
    assert list(body) == ["error"] and isinstance(body["error"], str)
    assert "extra_forbidden" in body["error"] and "('body', 'frobnicate')" in body["error"]
    extras = {"top_k": 1, "min_p": 0.0, "repetition_penalty": 1.0, "stop_token_ids": [], "ignore_eos": False}
    extras |= {"include_stop_str_in_output": False, "min_tokens": 0, "skip_special_tokens": True}
    assert httpx.post(f"{trt}/v1/chat/completions", json=CHAT | extras).status_code == 200
    bad = httpx.post(
        f"{trt}/v1/completions", json={"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}
    )
    assert bad.status_code == 400 and "Stream options can only be defined when stream is true." in bad.json()["error"]


def test_any_model_name_is_served_and_echoed(trt: str) -> None:
    resp = httpx.post(f"{trt}/v1/chat/completions", json=CHAT | {"model": "not-served"})
    assert resp.status_code == 200 and resp.json()["model"] == "not-served"


def test_prompt_too_long_is_a_flat_400(trt: str, engine: TinyEngine) -> None:
    for words, expected in ((500, "`default_max_tokens` ("), (900, "should not exceed max_num_tokens (8192)")):
        prompt = "Beautiful is better than ugly. " * words
        assert (engine.count_tokens(prompt) > 8192) == (words == 900) and engine.count_tokens(prompt) > 4096
        resp = httpx.post(f"{trt}/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 4})
        body = resp.json()
        assert resp.status_code == 400 and expected in body["message"]
        assert body | {"message": ""} == {
            "object": "error",
            "message": "",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }


def test_completion_stop_strings_and_length(trt: str) -> None:
    base = {"model": "m", "prompt": ZEN_PROMPT, "temperature": 0, "stop": ["Explicit"]}
    choice = httpx.post(f"{trt}/v1/completions", json=base).json()["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (" ugly.\n", "stop", "Explicit")
    kept = httpx.post(f"{trt}/v1/completions", json=base | {"include_stop_str_in_output": True}).json()
    assert kept["choices"][0]["text"] == " ugly.\nExplicit"
    short = httpx.post(
        f"{trt}/v1/completions", json={"model": "m", "prompt": ZEN_PROMPT, "temperature": 0, "max_tokens": 3}
    )
    assert short.json()["choices"][0]["finish_reason"] == "length" and short.json()["usage"]["completion_tokens"] == 3
    assert ZEN_CONTINUATION.startswith(short.json()["choices"][0]["text"])


def test_trtllm_faults(trt: str, trt_control: FakeControl) -> None:
    trt_control.fail_next = "overloaded"
    resp = httpx.post(f"{trt}/v1/chat/completions", json=CHAT)
    assert resp.status_code == 400 and "Maximum queue size" in resp.json()["message"]
    trt_control.fail_next = "internal"
    resp = httpx.post(f"{trt}/v1/chat/completions", json=CHAT)
    assert resp.status_code == 500 and resp.json()["type"] == "InternalServerError" and resp.json()["code"] == 500
    trt_control.fail_next = "midstream"
    resp = httpx.post(f"{trt}/v1/chat/completions", json=CHAT)
    assert resp.status_code == 400 and resp.json()["object"] == "error"
    trt_control.fail_next = "midstream"
    lines: list[str] = []
    stream = httpx.stream("POST", f"{trt}/v1/chat/completions", json=CHAT | {"stream": True})
    with pytest.raises(httpx.RemoteProtocolError), stream as r:
        assert r.status_code == 200
        lines.extend(line for line in r.iter_lines() if line)
    assert len(lines) == 4 and "[DONE]" not in "".join(lines)  # role chunk + 3 tokens, then the connection drops
    assert httpx.post(f"{trt}/v1/chat/completions", json=CHAT).status_code == 200


def test_trtllm_health_version_models(trt: str, trt_control: FakeControl) -> None:
    ok = httpx.get(f"{trt}/health")
    assert (ok.status_code, ok.content) == (200, b"")
    trt_control.healthy = False
    bad = httpx.get(f"{trt}/health")
    assert bad.status_code == 503 and bad.text.startswith("LLM is unavailable")
    assert "version" in httpx.get(f"{trt}/version").json()
    models = httpx.get(f"{trt}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "enginegate-demo"
    assert models["data"][0]["owned_by"] == "tensorrt_llm"
    assert httpx.get(f"{trt}/nope").json() == {"detail": "Not Found"}


def test_trtllm_metrics_follow_real_state(trt: str, trt_control: FakeControl, greeting: tuple[int, int]) -> None:
    prompt, answer = greeting
    httpx.get(f"{trt}/metrics")  # drain
    assert httpx.post(f"{trt}/v1/chat/completions", json=CHAT).status_code == 200
    stats = httpx.get(f"{trt}/metrics").json()
    blocks = -(-(prompt + answer) // 32)  # 32 tokens per block
    assert len(stats) == answer and stats[-1]["kvCacheStats"]["usedNumBlocks"] == blocks
    assert httpx.get(f"{trt}/metrics").json() == []
    samples = _metrics(f"{trt}/prometheus/metrics")
    assert _value(samples, "trtllm_request_success_total", finished_reason="stop") >= 1
    assert (
        _value(samples, "trtllm_generation_tokens_total") >= answer
        and _value(samples, "trtllm_prompt_tokens_total") >= prompt
    )
    assert _value(samples, "trtllm_time_to_first_token_seconds_count") >= 1
    assert _value(samples, "trtllm_num_requests_running") == 0 == _value(samples, "trtllm_kv_cache_utilization")

    def waiting() -> None:
        during = _metrics(f"{trt}/prometheus/metrics")
        assert _value(during, "trtllm_num_requests_waiting") == 1

    _while_delayed(trt_control, lambda: httpx.post(f"{trt}/v1/chat/completions", json=CHAT, timeout=30), waiting)
    assert _value(_metrics(f"{trt}/prometheus/metrics"), "trtllm_num_requests_waiting") == 0


@pytest.mark.parametrize("stream", [True, False])
def test_trtllm_disconnect_stops_generation(trt: str, engine: TinyEngine, stream: bool) -> None:
    body = CHAT | {"stream": stream, "ignore_eos": True, "max_tokens": 4000}
    before = engine.generated_tokens
    if stream:
        with httpx.stream("POST", f"{trt}/v1/chat/completions", json=body) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n == 10:
                    break
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{trt}/v1/chat/completions", json=body, timeout=httpx.Timeout(5.0, read=0.1))
    assert _stops_generating(engine, before) < 2500


WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
PARIS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(autouse=True)
def _no_script_left(engine: TinyEngine) -> Iterator[None]:
    yield
    engine.scripted.clear()


def test_tool_call_answer_with_the_qwen3_parser(trt: str, engine: TinyEngine) -> None:
    client = openai.OpenAI(base_url=trt + "/v1", api_key="x", max_retries=0)
    engine.scripted.append("Let me look.\n" + CALL)
    resp = client.chat.completions.create(model="m", messages=PARIS, tools=[WEATHER], temperature=0)  # type: ignore[list-item]
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    engine.scripted.append(CALL)
    body = httpx.post(
        f"{trt}/v1/chat/completions", json=CHAT | {"messages": PARIS, "tools": [WEATHER], "stream": True}
    ).text
    chunks = [json.loads(e[6:]) for e in _events(body)[:-1]]
    pieces = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert pieces[0] == {"id": pieces[0]["id"], "type": "function", "index": 0,
                         "function": {"name": "get_weather", "arguments": ""}}  # fmt: skip
    assert pieces[1] == {"type": "function", "index": 0, "function": {"arguments": '{"city": "Paris"}'}}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == ""


def test_tool_choice_none_strips_the_markup_and_named_labels_the_text(trt: str, engine: TinyEngine) -> None:
    engine.scripted.append(CALL)
    body = CHAT | {"messages": PARIS, "tools": [WEATHER], "tool_choice": "none"}
    choice = httpx.post(f"{trt}/v1/chat/completions", json=body).json()["choices"][0]
    assert (choice["message"]["content"], choice["message"]["tool_calls"], choice["finish_reason"]) == ("", [], "stop")
    engine.scripted.append('{"city": "Paris"}')
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = CHAT | {"messages": PARIS, "tools": [WEATHER], "tool_choice": named, "stream": True}
    chunks = [json.loads(e[6:]) for e in _events(httpx.post(f"{trt}/v1/chat/completions", json=body).text)[1:-1]]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks]
    assert all("id" not in c and c["function"]["name"] == "get_weather" for c in calls)  # the name on every piece
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Paris"}


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"tool_choice": "required"}, "When using `tool_choice`, `tools` must be set."),
        ({"top_logprobs": 0}, "logprobs must be true when using top_logprobs"),
        ({"logit_bias": {"100000": 1.0}}, "Token ID 100000 out of vocabulary range [0, "),
        ({"logit_bias": {"5": 101.0}}, "logit_bias value for token ID 5 must be in [-100, 100]"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema is required"),
        ({"tools": [{"type": "function", "function": {"name": "f", "x": 1}}]}, "extra_forbidden"),
    ],
)
def test_capability_fields_are_validated_as_trtllm_serve_does(trt: str, extra: dict[str, Any], says: str) -> None:
    resp = httpx.post(f"{trt}/v1/chat/completions", json=CHAT | extra)
    body = resp.json()
    assert resp.status_code == 400 and says in (body.get("error") or body.get("message"))


def test_logprobs_shapes(trt: str, greeting: tuple[int, int]) -> None:
    chat = httpx.post(f"{trt}/v1/chat/completions", json=CHAT | {"logprobs": True, "top_logprobs": 2}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == chat["usage"]["completion_tokens"] == greeting[1]
    first = content[0]
    assert (first["token"], first["bytes"]) == ("Hello", list(b"Hello")) and first["logprob"] < 0
    assert first["top_logprobs"][0]["token"] == "Hello" and len(first["top_logprobs"]) == 2
    bare = httpx.post(f"{trt}/v1/chat/completions", json=CHAT | {"logprobs": True}).json()
    assert bare["choices"][0]["logprobs"]["content"][0]["top_logprobs"] is None  # not asked: no list
    prompt = {"model": "m", "prompt": ZEN_PROMPT, "temperature": 0, "max_tokens": 3}
    none = httpx.post(f"{trt}/v1/completions", json=prompt | {"logprobs": 0}).json()
    assert none["choices"][0]["logprobs"] is None  # 0 reads as "no logprobs"
    lp = httpx.post(f"{trt}/v1/completions", json=prompt | {"logprobs": 2}).json()["choices"][0]["logprobs"]
    assert list(lp) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"] and len(lp["tokens"]) == 3
    assert lp["text_offset"][1] == len(lp["tokens"][0]) and all(len(t) == 2 for t in lp["top_logprobs"])


def test_n_choices_share_one_request(trt: str, greeting: tuple[int, int]) -> None:
    resp = httpx.post(f"{trt}/v1/chat/completions", json=CHAT | {"n": 2}).json()
    assert [c["index"] for c in resp["choices"]] == [0, 1]
    assert all(c["message"]["content"] == GREETING_REPLY for c in resp["choices"])
    assert (resp["usage"]["prompt_tokens"], resp["usage"]["completion_tokens"]) == (greeting[0], 2 * greeting[1])
    stream = httpx.post(f"{trt}/v1/chat/completions", json=CHAT | {"n": 2, "stream": True}).text
    chunks = [json.loads(e[6:]) for e in _events(stream)[:-1]]
    assert [c["choices"][0]["index"] for c in chunks[:2]] == [0, 1]  # a role chunk per choice
    for i in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        assert "".join(c["delta"].get("content", "") for c in mine) == GREETING_REPLY


# ---------------------------------------------------------------------------------------------- Triton


def test_triton_generate_returns_prompt_then_text(triton: str) -> None:
    request = {"text_input": ZEN_PROMPT, "max_tokens": 12, "bad_words": "", "stop_words": ""}
    full = httpx.post(f"{triton}/v2/models/ensemble/generate", json=request)
    assert full.status_code == 200 and full.headers["content-type"] == "application/json"
    body = full.json()
    assert list(body) == ["model_name", "model_version", "sequence_end", "sequence_id", "sequence_start", "text_output"]
    assert (body["model_name"], body["model_version"], body["sequence_id"]) == ("ensemble", "1", 0)
    assert body["text_output"].startswith(ZEN_PROMPT + " ugly.\nExplicit")
    only = httpx.post(f"{triton}/v2/models/ensemble/generate", json=request | {"exclude_input_in_output": True})
    assert ZEN_PROMPT + only.json()["text_output"] == body["text_output"]
    stopped = httpx.post(f"{triton}/v2/models/ensemble/generate", json=request | {"stop_words": ["Explicit"]})
    assert stopped.json()["text_output"].endswith("Explicit")  # stop words stay in the output


def test_triton_generate_stream_framing(triton: str) -> None:
    request = {"text_input": ZEN_PROMPT, "max_tokens": 12, "stream": True}
    resp = httpx.post(f"{triton}/v2/models/ensemble/generate_stream", json=request)
    assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = _events(resp.text)
    assert len(events) == 12 and all(e.startswith('data: {"model_name":"ensemble"') for e in events)
    assert "[DONE]" not in resp.text
    pieces = [json.loads(e[6:])["text_output"] for e in events]
    expected = httpx.post(
        f"{triton}/v2/models/ensemble/generate", json=request | {"stream": False, "exclude_input_in_output": True}
    )
    whole = expected.json()["text_output"]
    # Each streamed response is one token decoded alone: the word-leading spaces are gone, as on the real one.
    assert "".join(pieces) == whole.replace(" ", "") and " " in whole
    once = httpx.post(f"{triton}/v2/models/ensemble/generate_stream", json=request | {"stream": False})
    assert [json.loads(e[6:])["text_output"] for e in _events(once.text)] == [ZEN_PROMPT + whole]
    many = httpx.post(f"{triton}/v2/models/ensemble/generate", json=request)
    assert many.status_code == 200 and many.json() == {"error": fake_triton.ONE_RESPONSE}


def test_triton_request_validation(triton: str) -> None:
    gen = f"{triton}/v2/models/ensemble/generate"
    missing = httpx.post(gen, json={"text_input": "hi"})
    assert missing.status_code == 400 and missing.json() == {
        "error": "[request id: <id_unknown>] expected number of inputs between 2 and 29 but got 1 inputs for model "
        "'ensemble'. Got input(s) ['text_input'], but missing required input(s) ['max_tokens']. Please provide all "
        "required input(s)."
    }
    assert httpx.post(gen, json={"text_input": "hi", "max_tokens": 2, "frobnicate": 1}).status_code == 200
    assert httpx.post(gen, json={"text_input": "hi", "parameters": {"max_tokens": 2}}).status_code == 200
    assert httpx.post(gen, json={"text_input": "hi", "max_tokens": 2, "frobnicate": {}}).status_code == 400
    assert httpx.post(gen, json={"text_input": "hi", "max_tokens": "2"}).status_code == 400
    unknown = httpx.post(f"{triton}/v2/models/llama/generate", json={"text_input": "hi", "max_tokens": 2})
    assert unknown.status_code == 404 and unknown.json() == {"error": "Request for unknown model: 'llama' is not found"}
    versioned = f"{triton}/v2/models/ensemble/versions/1/generate"
    tagged = httpx.post(versioned, json={"id": "req-7", "text_input": "hi", "max_tokens": 2}).json()
    assert list(tagged)[:2] == ["id", "model_name"] and tagged["id"] == "req-7"
    assert httpx.post(versioned, json={"id": "req-8"}).json()["error"].startswith("[request id: req-8] expected")
    assert httpx.post(f"{triton}/v2/models/ensemble/versions/2/generate", json={}).status_code == 404
    assert httpx.get(gen).json() == {"error": "Method Not Allowed"}
    assert httpx.get(f"{triton}/v2/nope").json() == {"error": "Not Found"}


def test_triton_faults(triton: str, triton_control: FakeControl) -> None:
    gen, request = f"{triton}/v2/models/ensemble/generate", {"text_input": "Hello", "max_tokens": 8, "stream": True}
    triton_control.fail_next = "unavailable"
    resp = httpx.post(gen, json=request | {"stream": False})
    assert resp.status_code == 503 and "Exceeds maximum queue size" in resp.json()["error"]
    triton_control.fail_next = "unavailable"
    resp = httpx.post(gen + "_stream", json=request)
    assert resp.status_code == 503 and resp.headers["content-type"].startswith("text/event-stream")
    (event,) = _events(resp.text)
    assert json.loads(event.removeprefix("data: "))["error"].startswith("in ensemble 'ensemble', ")
    triton_control.fail_next = "internal"
    resp = httpx.post(gen, json=request | {"stream": False})
    assert resp.status_code == 500 and "Executor failed process requestId" in resp.json()["error"]
    triton_control.fail_next = "midstream"
    resp = httpx.post(gen + "_stream", json=request)
    events = [json.loads(e[6:]) for e in _events(resp.text)]
    assert resp.status_code == 200 and [("text_output" in e) for e in events] == [True, True, True, False]
    assert events[-1]["error"].startswith("in ensemble 'ensemble', Executor failed process requestId")


def test_triton_health(triton: str, triton_control: FakeControl) -> None:
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/ensemble/ready"):
        resp = httpx.get(triton + path)
        assert (resp.status_code, resp.content) == (200, b"")
    assert httpx.get(f"{triton}/v2/models/llama/ready").json() == {"error": "Model version not ready"}
    triton_control.loading = True
    assert [httpx.get(f"{triton}/v2/health/{k}").status_code for k in ("live", "ready")] == [200, 400]
    loading = httpx.post(f"{triton}/v2/models/ensemble/generate", json={"text_input": "hi", "max_tokens": 2})
    assert loading.json() == {"error": "Request for unknown model: 'ensemble' has no available versions"}
    triton_control.loading, triton_control.healthy = False, False
    assert [httpx.get(f"{triton}/v2/health/{k}").status_code for k in ("live", "ready")] == [400, 400]


def test_triton_metrics_follow_real_state(triton: str, triton_control: FakeControl) -> None:
    request = {"text_input": "Hello", "max_tokens": 8}
    assert httpx.post(f"{triton}/v2/models/ensemble/generate", json=request).status_code == 200
    samples = _metrics(f"{triton}/metrics")
    assert _value(samples, "nv_inference_request_success", model="ensemble") >= 1
    assert _value(samples, "nv_inference_first_response_histogram_ms_count", model="ensemble") >= 1
    kinds = {dict(lab)["request_type"] for (name, lab) in samples if name == "nv_trt_llm_request_metrics"}
    assert kinds == {"active", "waiting", "scheduled", "context", "max"}
    assert _value(samples, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used") == 0

    def waiting() -> None:
        during = _metrics(f"{triton}/metrics")
        assert _value(during, "nv_trt_llm_request_metrics", request_type="waiting") == 1
        assert _value(during, "nv_inference_pending_request_count", model="ensemble") == 1

    gen = f"{triton}/v2/models/ensemble/generate"
    _while_delayed(triton_control, lambda: httpx.post(gen, json=request, timeout=30), waiting)
    after = _metrics(f"{triton}/metrics")
    assert _value(after, "nv_trt_llm_request_metrics", request_type="waiting") == 0


def test_triton_disconnect_stops_generation(triton: str, engine: TinyEngine) -> None:
    request = {"text_input": "Hello", "max_tokens": 4000, "end_id": -1, "stream": True}
    before = engine.generated_tokens
    with httpx.stream("POST", f"{triton}/v2/models/ensemble/generate_stream", json=request) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n == 10:
                break
    assert _stops_generating(engine, before) < 2500


def test_triton_log_probs_are_the_models_and_guides_are_checked(triton: str, engine: TinyEngine) -> None:
    gen = f"{triton}/v2/models/ensemble/generate"
    request = {"text_input": ZEN_PROMPT, "max_tokens": 4, "return_log_probs": True, "exclude_input_in_output": True}
    body = httpx.post(gen, json=request).json()
    ids = engine._tokenizer.encode(body["text_output"], add_special_tokens=False).ids
    expected = [lp for lp, _ in engine.alternatives(ZEN_PROMPT, ids, 1)]
    assert body["output_log_probs"] == pytest.approx(expected, abs=1e-4) and len(ids) == 4
    assert body["cum_log_probs"] == pytest.approx(sum(expected), abs=1e-4)
    guided = request | {"guided_decoding_guide_type": "json_schema"}
    missing = httpx.post(gen, json=guided)
    assert missing.status_code == 500 and "guided_decoding_guide is required" in missing.json()["error"]
    schema = guided | {"guided_decoding_guide": '{"type": "object"}'}
    assert httpx.post(gen, json=schema).status_code == 200
    assert httpx.post(gen, json=request | {"guided_decoding_guide_type": "yaml"}).status_code == 500
