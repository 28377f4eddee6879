"""The DeepSpeed-MII contract fakes speak MII's wire format, over a real uvicorn, with real tokens."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp

from tests.conftest import GREETING_REPLY
from tests.contract.control import FakeControl
from tests.contract.fake_mii import create_openai_app, create_rest_app
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread
from tests.polling import settles

MODEL = "enginegate-demo"
HELLO: Any = [{"role": "user", "content": "Hello"}]  # Any: both the client and render_chat take it
EOS_TEXT = "<|im_end|>"  # the demo model's end-of-turn token, as MII streams it
# MII's OpenAI server always samples (do_sample: true) and rejects temperature 0; a nucleus this
# small keeps only the most likely token, so sampling is greedy in effect.
TOP_P = 1e-6
NEVER = "\u2603"  # not a vocabulary piece: as MII's stop, it only switches the EOS check off
INTERNAL = '{"message": "Internal Server Error"}\n'


def _with_readyz(app: ASGIApp) -> Starlette:
    """serve_in_thread polls /readyz, which MII lacks: a test-only probe in front of the untouched fake."""

    async def ready(request: Request) -> Response:
        return PlainTextResponse("ready")

    return Starlette(routes=[Route("/readyz", ready), Mount("/", app=app)])


def _reset(control: FakeControl) -> FakeControl:
    control.fail_next, control.delay_s, control.healthy, control.loading = None, 0.0, True, False
    return control


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> TinyEngine:
    return TinyEngine(tmp_path_factory.mktemp("mii-cache"))


@pytest.fixture(scope="module")
def rest_server(engine: TinyEngine) -> Iterator[tuple[str, FakeControl]]:
    control = FakeControl()
    with serve_in_thread(_with_readyz(create_rest_app(engine, control))) as url:
        yield url, control


@pytest.fixture(scope="module")
def openai_server(engine: TinyEngine) -> Iterator[tuple[str, FakeControl]]:
    control = FakeControl()
    with serve_in_thread(_with_readyz(create_openai_app(engine, control))) as url:
        yield url, control


@pytest.fixture
def rest(rest_server: tuple[str, FakeControl]) -> tuple[str, FakeControl]:
    return rest_server[0], _reset(rest_server[1])


@pytest.fixture
def oai(openai_server: tuple[str, FakeControl]) -> tuple[str, FakeControl]:
    return openai_server[0], _reset(openai_server[1])


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def _greedy_token_count(engine: TinyEngine, prompt: str, max_new_tokens: int) -> int:
    """Tokens the engine itself emits for a greedy run, the end-of-turn token included."""

    async def run() -> int:
        return len([tok async for tok in engine.stream(prompt, max_new_tokens, greedy=True)])

    return asyncio.run(run())


def _post_rest(url: str, body: Any) -> httpx.Response:
    return httpx.post(f"{url}/mii/{MODEL}", json=body, timeout=60)


def _events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


# --- REST gateway ---------------------------------------------------------------------------


def test_rest_greedy_greeting(rest: tuple[str, FakeControl], engine: TinyEngine) -> None:
    url, _ = rest
    prompt = engine.render_chat(HELLO)
    resp = _post_rest(url, {"prompts": prompt, "do_sample": False, "max_new_tokens": 60})
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json"
    expected = {
        "generated_text": GREETING_REPLY,
        "prompt_length": engine.count_tokens(prompt),
        "generated_length": _greedy_token_count(engine, prompt, 60),  # MII counts the EOS token
        "finish_reason": "stop",
    }
    assert resp.json() == [expected]
    assert expected["generated_length"] == engine.count_tokens(GREETING_REPLY) + 1
    assert resp.text == json.dumps([expected], sort_keys=True, separators=(",", ":")) + "\n"  # Flask's jsonify


def test_rest_prompt_list(rest: tuple[str, FakeControl], engine: TinyEngine) -> None:
    url, _ = rest
    prompts = [engine.render_chat(HELLO), "The Zen"]
    resp = _post_rest(url, {"prompts": prompts, "do_sample": False, "max_new_tokens": 5})
    first, second = resp.json()
    assert GREETING_REPLY.startswith(first["generated_text"]) and first["generated_text"]
    assert (first["generated_length"], first["finish_reason"]) == (5, "length")
    assert second["generated_text"].startswith(" of")
    assert (second["prompt_length"], second["generated_length"]) == (engine.count_tokens("The Zen"), 5)


def test_rest_max_length_counts_the_prompt(rest: tuple[str, FakeControl], engine: TinyEngine) -> None:
    url, _ = rest
    n_prompt = engine.count_tokens("The Zen")
    [reply] = _post_rest(url, {"prompts": "The Zen", "max_length": 12, "do_sample": False}).json()
    assert (reply["generated_length"], reply["finish_reason"]) == (12 - n_prompt, "length")
    too_short = _post_rest(url, {"prompts": "The Zen", "max_length": n_prompt})
    assert (too_short.status_code, too_short.text) == (500, INTERNAL)


def test_rest_stop_is_one_vocabulary_piece(rest: tuple[str, FakeControl], engine: TinyEngine) -> None:
    url, _ = rest
    body = {"prompts": engine.render_chat(HELLO), "do_sample": False, "max_new_tokens": 40}
    [hit] = _post_rest(url, {**body, "stop": "▁ugly."}).json()
    assert (hit["generated_text"], hit["finish_reason"]) == (GREETING_REPLY.removesuffix(" ugly."), "stop")
    # Text that is no vocabulary piece never matches, and a stop replaces the EOS check.
    [miss] = _post_rest(url, {**body, "stop": " ugly."}).json()
    assert (miss["generated_length"], miss["finish_reason"]) == (40, "length")
    assert miss["generated_text"].startswith(GREETING_REPLY + EOS_TEXT)


def test_rest_stream_kwarg_answers_the_first_token(rest: tuple[str, FakeControl], engine: TinyEngine) -> None:
    url, _ = rest
    [reply] = _post_rest(url, {"prompts": engine.render_chat(HELLO), "do_sample": False, "stream": True}).json()
    assert reply == {
        "generated_text": "Hello",
        "prompt_length": engine.count_tokens(engine.render_chat(HELLO)),
        "generated_length": 1,
        "finish_reason": "none",
    }


@pytest.mark.parametrize(
    "body",
    [
        {"prompts": "The Zen", "stop": ["x"]},  # lists cannot cross MII's gRPC kwargs
        {"prompts": "The Zen", "top_k": None},
        {"prompts": "The Zen", "temperature": 0},
        {"prompts": "The Zen", "top_p": 1.5},
        {"prompts": "The Zen", "beam_width": 2},
        {"max_new_tokens": 4},
        ["The Zen"],
    ],
)
def test_rest_bad_requests_are_flask_restful_500s(rest: tuple[str, FakeControl], body: Any) -> None:
    resp = _post_rest(rest[0], body)
    assert (resp.status_code, resp.text, resp.headers["content-type"]) == (500, INTERNAL, "application/json")


def test_rest_routes(rest: tuple[str, FakeControl]) -> None:
    url, _ = rest
    health = httpx.get(f"{url}/healthz")
    assert (health.status_code, health.text) == (200, "ok")
    for path in (f"/mii/{MODEL}-other", "/metrics", "/v1/models", f"/mii/{MODEL}/"):
        page = httpx.post(url + path, json={"prompts": "x"})
        assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
        assert page.text.startswith("<!doctype html>\n<html lang=en>\n<title>404 Not Found</title>")
    not_allowed = httpx.get(f"{url}/mii/{MODEL}")
    assert not_allowed.status_code == 405
    assert not_allowed.json() == {"message": "The method is not allowed for the requested URL."}
    form = httpx.post(f"{url}/mii/{MODEL}", data={"prompts": "x"})
    assert form.status_code == 415 and "Content-Type was not 'application/json'" in form.json()["message"]


def test_rest_faults(rest: tuple[str, FakeControl]) -> None:
    url, control = rest
    body = {"prompts": "The Zen", "max_new_tokens": 2}
    control.fail_next = "internal"
    assert (_post_rest(url, body).status_code, _post_rest(url, body).status_code) == (500, 200)
    control.healthy = False  # the model server is down: /healthz does not know
    assert httpx.get(f"{url}/healthz").text == "ok"
    assert _post_rest(url, body).text == INTERNAL
    control.healthy, control.delay_s = True, 0.5
    start = time.monotonic()
    assert _post_rest(url, body).status_code == 200
    assert time.monotonic() - start >= 0.5


# --- OpenAI-compatible server -------------------------------------------------------------


def test_openai_chat(oai: tuple[str, FakeControl], engine: TinyEngine) -> None:
    resp = _client(oai[0]).chat.completions.create(model=MODEL, messages=HELLO, max_tokens=60, top_p=TOP_P)
    assert resp.choices[0].message.content == GREETING_REPLY
    assert resp.choices[0].finish_reason == "stop" and resp.object == "chat.completion"
    assert resp.id.startswith("chatcmpl-") and resp.model == MODEL
    assert resp.usage is not None
    # MII counts only the message contents as the prompt, not the rendered template.
    assert resp.usage.prompt_tokens == engine.count_tokens("Hello")
    assert resp.usage.completion_tokens == engine.count_tokens(GREETING_REPLY)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_openai_chat_stream(oai: tuple[str, FakeControl]) -> None:
    stream = _client(oai[0]).chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=60,
        stream=True,
        stream_options={"include_usage": True},  # MII ignores it
        top_p=TOP_P,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == GREETING_REPLY + EOS_TEXT
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].choices[0].delta.content == ""
    assert all(c.usage is None and c.choices for c in chunks)


def test_openai_temperature_zero_is_a_backend_error(oai: tuple[str, FakeControl]) -> None:
    with pytest.raises(openai.InternalServerError):
        _client(oai[0]).chat.completions.create(model=MODEL, messages=HELLO, temperature=0)
    lines, cut = _stream_lines(oai[0], {"model": MODEL, "messages": HELLO, "stream": True, "temperature": 0})
    assert cut and [e["choices"][0]["delta"] for e in _events(lines)] == [{"role": "assistant"}]


def _stream_lines(url: str, body: dict[str, Any], path: str = "/v1/chat/completions") -> tuple[list[str], bool]:
    """The SSE lines, and whether the server cut the connection before the body was complete."""
    lines: list[str] = []
    with httpx.stream("POST", url + path, json=body, timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        try:
            lines.extend(line for line in resp.iter_lines() if line)
        except httpx.RemoteProtocolError:
            return lines, True
    return lines, False


def test_openai_raw_chat_stream_framing(oai: tuple[str, FakeControl]) -> None:
    body = {"model": MODEL, "messages": HELLO, "stream": True, "stream_options": {"include_usage": True}}
    lines, cut = _stream_lines(oai[0], {**body, "max_tokens": 60, "top_p": TOP_P})
    assert not cut and lines[-1] == "data: [DONE]"
    events = _events(lines)
    assert len(events) == len(lines) - 1
    rid = events[0]["id"]
    assert rid.startswith("chatcmpl-") and len(rid) == len("chatcmpl-") + 22
    role = '{"index":0,"delta":{"role":"assistant"},"finish_reason":null}'
    assert lines[0] == f'data: {{"id":"{rid}","model":"{MODEL}","choices":[{role}]}}'
    assert all(set(e) == {"id", "model", "choices"} and e["id"] == rid for e in events)  # no object, created, usage
    assert events[-2]["choices"] == [{"index": 0, "delta": {"content": EOS_TEXT}, "finish_reason": None}]
    assert events[-1]["choices"] == [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}]


def test_openai_raw_completion_stream_framing(oai: tuple[str, FakeControl]) -> None:
    body = {"model": MODEL, "prompt": "The Zen", "stream": True, "max_tokens": 4, "top_p": TOP_P}
    lines, cut = _stream_lines(oai[0], body, "/v1/completions")
    assert not cut and lines[-1] == "data: [DONE]"
    events = _events(lines)
    assert all(list(e) == ["id", "object", "model", "choices"] and e["object"] == "text_completion" for e in events)
    assert [e["choices"][0]["finish_reason"] for e in events] == [None, None, None, None, "length"]
    assert events[0]["choices"][0]["logprobs"] is None and events[-1]["choices"][0]["text"] == ""
    assert "".join(e["choices"][0]["text"] for e in events).startswith(" of")


def test_openai_completion(oai: tuple[str, FakeControl], engine: TinyEngine) -> None:
    resp = _client(oai[0]).completions.create(model=MODEL, prompt=["The Zen", "The Zen"], max_tokens=3, top_p=TOP_P)
    assert [c.index for c in resp.choices] == [0, 1] and resp.object == "text_completion"
    assert resp.choices[0].text == resp.choices[1].text and resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.prompt_tokens == 2 * engine.count_tokens("The Zen")


def test_openai_wrong_model(oai: tuple[str, FakeControl]) -> None:
    url, _ = oai
    resp = httpx.post(f"{url}/v1/chat/completions", json={"model": "x", "messages": HELLO})
    assert resp.status_code == 400
    assert resp.json() == {"object": "error", "message": f'Model "x" not found. Please use "{MODEL}".', "code": 40301}
    resp = httpx.post(f"{url}/v1/completions", json={"model": "x", "prompt": "hi"})
    assert resp.json() == {"object": "error", "message": "Model x not found.", "code": 40301}
    with pytest.raises(openai.BadRequestError) as err:
        _client(url).chat.completions.create(model="x", messages=HELLO)
    assert err.value.status_code == 400 and err.value.code == "40301"  # the client keeps codes as strings


def test_openai_validation_and_routes(oai: tuple[str, FakeControl]) -> None:
    url, _ = oai
    missing = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL})
    assert missing.status_code == 400
    assert missing.json()["code"] == 40001 and "Field required" in missing.json()["message"]
    broken = httpx.post(f"{url}/v1/chat/completions", content=b"{", headers={"content-type": "application/json"})
    assert (broken.status_code, broken.json()["code"]) == (400, 40001)
    empty_stop = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": HELLO, "stop": []})
    assert (empty_stop.status_code, empty_stop.text) == (500, "Internal Server Error")
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    card = httpx.get(f"{url}/v1/models").json()["data"][0]
    assert (card["id"], card["owned_by"], card["root"]) == (MODEL, "deepspeed-mii", MODEL)
    assert httpx.get(f"{url}/metrics").json() == {"detail": "Not Found"}


def test_openai_faults(oai: tuple[str, FakeControl]) -> None:
    url, control = oai
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 60, "top_p": TOP_P}
    control.fail_next = "internal"
    first = httpx.post(f"{url}/v1/chat/completions", json=body)
    assert (first.status_code, first.text) == (500, "Internal Server Error")
    assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 200
    control.fail_next = "internal"
    lines, cut = _stream_lines(url, {**body, "stream": True})
    assert cut and len(lines) == 1  # the role chunk, then the connection drops
    control.fail_next = "midstream"
    lines, cut = _stream_lines(url, {**body, "stream": True})
    assert cut and "data: [DONE]" not in lines
    assert [e["choices"][0]["delta"] for e in _events(lines)] == [
        {"role": "assistant"},
        {"content": "Hello"},
        {"content": "!"},
        {"content": " "},
    ]
    control.healthy = False  # the model server is down: /health does not know
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 500


def test_openai_disconnect_stops_generation(oai: tuple[str, FakeControl], engine: TinyEngine) -> None:
    max_tokens = 4000  # about three seconds of generation here if nobody stopped it
    before = engine.generated_tokens
    client = _client(oai[0])
    stream = client.completions.create(model=MODEL, prompt="The Zen", max_tokens=max_tokens, stop=NEVER, stream=True)
    received = 0
    for _ in stream:
        received += 1
        if received == 3:
            break
    stream.close()
    # Stopped means the counter comes to rest (settles fails if it keeps moving) and stays there.
    settled = settles(lambda: engine.generated_tokens, quiet_s=0.7, message="the engine kept generating")
    assert received <= settled - before < max_tokens / 4
    assert engine.active_streams == 0


def test_openai_uncancelled_request_runs_to_max_tokens(oai: tuple[str, FakeControl], engine: TinyEngine) -> None:
    """The control for the test above: with that stop, EOS does not end the run, so it fills max_tokens."""
    before = engine.generated_tokens
    resp = _client(oai[0]).completions.create(model=MODEL, prompt="The Zen", max_tokens=300, stop=NEVER)
    assert resp.choices[0].finish_reason == "length"
    assert engine.generated_tokens - before == 300
