"""The official ``openai`` client against a real ``enginegate serve`` process."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import GREETING_REPLY, ZEN_CONTINUATION, ZEN_PROMPT, GatewayProcess

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]


@pytest.fixture()
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_chat_non_streaming_returns_the_known_greeting(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="enginegate-demo", messages=HELLO, temperature=0)
    assert resp.object == "chat.completion"
    assert resp.model == "enginegate-demo"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == GREETING_REPLY
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == 16
    assert resp.usage.completion_tokens == 32  # the greeting's tokens and the end of turn
    assert resp.usage.total_tokens == 48


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="enginegate-demo",
        messages=HELLO,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == GREETING_REPLY
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (16, 32)
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_streaming_without_usage_sends_none(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="enginegate-demo",
            messages=HELLO,
            temperature=0,
            stream=True,
        )
    )
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_max_tokens_reached_is_finish_length(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model="enginegate-demo",
        messages=HELLO,
        temperature=0,
        max_completion_tokens=5,
    )
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 5
    assert GREETING_REPLY.startswith(resp.choices[0].message.content or "")


def test_completions_continue_the_zen(client: openai.OpenAI) -> None:
    resp = client.completions.create(model="enginegate-demo", prompt=ZEN_PROMPT, temperature=0, max_tokens=40)
    assert resp.object == "text_completion"
    assert resp.choices[0].text.startswith(ZEN_CONTINUATION)
    assert resp.choices[0].finish_reason == "length"


def test_completions_stop_string_is_not_included(client: openai.OpenAI) -> None:
    resp = client.completions.create(
        model="enginegate-demo", prompt=ZEN_PROMPT, temperature=0, max_tokens=40, stop=["Simple"]
    )
    assert resp.choices[0].text == " ugly.\nExplicit is better than implicit.\n"
    assert resp.choices[0].finish_reason == "stop"


def test_completions_streaming(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model="enginegate-demo",
        prompt=ZEN_PROMPT,
        temperature=0,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices).startswith(ZEN_CONTINUATION)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 40


def test_model_list_and_lookup(client: openai.OpenAI) -> None:
    ids = sorted(m.id for m in client.models.list())
    assert ids == ["demo-ct2", "demo-llama", "enginegate-demo"]
    assert client.models.retrieve("demo-llama").id == "demo-llama"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


@pytest.mark.parametrize(("model", "backend"), [("demo-ct2", "ct2-only"), ("demo-llama", "llama-only")])
def test_both_engines_give_the_same_greedy_answer(client: openai.OpenAI, model: str, backend: str) -> None:
    raw = client.chat.completions.with_raw_response.create(model=model, messages=HELLO, temperature=0)
    assert raw.headers["x-enginegate-backend"] == backend
    assert raw.headers["x-enginegate-route"] == "no_budget"
    assert raw.headers["x-request-id"]
    assert raw.parse().choices[0].message.content == GREETING_REPLY
    zen = client.completions.create(model=model, prompt=ZEN_PROMPT, temperature=0, max_tokens=60)
    assert zen.choices[0].text.startswith(ZEN_CONTINUATION)


def test_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=HELLO)
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 129}, "n"),
        ({"temperature": 5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 100000}, "max_tokens"),
        ({"top_p": 1.5}, "top_p"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"extra_body": {"stream_options": {"include_usage": True}}}, "stream_options"),
        ({"extra_body": {"messages": []}}, "messages"),
        ({"extra_body": {"messages": [{"role": "wizard", "content": "hi"}]}}, "messages[0].role"),
    ],
)
def test_bad_parameters_raise_bad_request(client: openai.OpenAI, kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="enginegate-demo", messages=HELLO, **kwargs)  # type: ignore[call-overload]
    assert info.value.param == param
    assert info.value.type == "invalid_request_error"


def test_prompt_longer_than_context_is_context_length_exceeded(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="enginegate-demo", prompt="Beautiful " * 3000, max_tokens=10)
    assert info.value.code == "context_length_exceeded"


def test_malformed_json_and_wrong_types_get_clear_errors_and_server_keeps_serving(
    gateway: GatewayProcess, client: openai.OpenAI
) -> None:
    url = f"{gateway.base_url}/v1/chat/completions"
    broken = b'{"model": "enginegate-demo", "messages": ['
    bad_json = httpx.post(url, content=broken, headers={"content-type": "application/json"}, timeout=10)
    assert bad_json.status_code == 400
    assert bad_json.json()["error"]["code"] == "invalid_json"
    assert bad_json.headers["x-request-id"]
    wrong_type = httpx.post(url, json={"model": "enginegate-demo", "messages": HELLO, "temperature": "hot"}, timeout=10)
    assert wrong_type.status_code == 400
    assert wrong_type.json()["error"] == {
        "message": wrong_type.json()["error"]["message"],
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "invalid_type",
    }
    not_object = httpx.post(url, json=[1, 2], timeout=10)
    assert not_object.status_code == 400
    missing = httpx.post(url, json={"model": "enginegate-demo"}, timeout=10)
    assert missing.json()["error"]["code"] == "missing_required_parameter"
    assert missing.json()["error"]["param"] == "messages"
    bad_header = httpx.post(
        url, json={"model": "enginegate-demo", "messages": HELLO}, headers={"x-ttft-budget-ms": "soon"}
    )
    assert bad_header.status_code == 400 and bad_header.json()["error"]["param"] == "x-ttft-budget-ms"
    unknown_route = httpx.get(f"{gateway.base_url}/v1/nothing", timeout=10)
    assert unknown_route.status_code == 404 and "error" in unknown_route.json()
    wrong_method = httpx.get(url, timeout=10)
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    assert gateway.alive()
    resp = client.chat.completions.create(model="enginegate-demo", messages=HELLO, temperature=0)
    assert resp.choices[0].message.content == GREETING_REPLY


def test_the_clients_request_id_is_echoed_beside_the_gateways(gateway: GatewayProcess) -> None:
    resp = httpx.get(f"{gateway.base_url}/v1/models", headers={"x-request-id": "abc-123"})
    assert resp.headers["x-client-request-id"] == "abc-123" and resp.headers["x-request-id"] != "abc-123"
    assert httpx.get(f"{gateway.base_url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{gateway.base_url}/readyz")
    assert ready.status_code == 200 and all(ready.json()["backends"].values())


def test_oversized_body_is_413_and_concurrent_requests_all_answer(gateway: GatewayProcess) -> None:
    import concurrent.futures

    url = f"{gateway.base_url}/v1/completions"
    big = httpx.post(url, json={"model": "enginegate-demo", "prompt": "x" * (5 * 1024 * 1024)}, timeout=30)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"

    def ask(_: int) -> str:
        r = httpx.post(url, json={"model": "enginegate-demo", "prompt": ZEN_PROMPT, "max_tokens": 40, "temperature": 0})
        return str(r.json()["choices"][0]["text"])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(16)))
    assert all(a.startswith(ZEN_CONTINUATION) for a in answers)
