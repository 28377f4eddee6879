"""Engine error bodies to BackendError kinds, and kinds to OpenAI errors the openai client classifies."""

from __future__ import annotations

import httpx2  # the HTTP library the openai client is built on (openai >= 3)
import openai
import pytest

from backends.base import BackendError, ErrorKind
from backends.http_errors import from_event, from_response
from gateway.http.errors import from_backend

# Bodies as each engine writes them (the engine references, and the real engines run here).
CASES = [
    # vLLM >= 0.10.1 and before
    (
        400,
        b'{"error":{"message":"max_tokens=5000 cannot be greater than max_model_len=4096.","type":"BadRequestError",'
        b'"param":"max_tokens","code":400}}',
        ErrorKind.CONTEXT_LENGTH,
    ),
    (
        404,
        b'{"error":{"message":"The model `foo` does not exist.","type":"NotFoundError","param":"model","code":404}}',
        ErrorKind.UPSTREAM,
    ),
    (
        400,
        b'{"object":"error","message":"This model\'s maximum context length is 2048 tokens.","type":"BadRequestError",'
        b'"param":null,"code":400}',
        ErrorKind.CONTEXT_LENGTH,
    ),
    # llama-server
    (
        400,
        b'{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it",'
        b'"type":"exceed_context_size_error"}}',
        ErrorKind.CONTEXT_LENGTH,
    ),
    (503, b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}', ErrorKind.OVERLOADED),
    # TGI native
    (
        422,
        b'{"error":"Input validation error: `top_p` must be > 0.0 and < 1.0","error_type":"validation"}',
        ErrorKind.BAD_REQUEST,
    ),
    (429, b'{"error":"Model is overloaded","error_type":"overloaded"}', ErrorKind.OVERLOADED),
    (424, b'{"error":"Request failed during generation","error_type":"generation"}', ErrorKind.UPSTREAM),
    # trtllm-serve: validation (a string) and a full queue reported as a 400
    (400, b"{\"error\":\"[{'type': 'extra_forbidden', 'loc': ('body', 'foo')}]\"}", ErrorKind.BAD_REQUEST),
    (
        400,
        b'{"object":"error","message":"Maximum queue size of 64 has been reached, please try again later",'
        b'"type":"BadRequestError","param":null,"code":400}',
        ErrorKind.OVERLOADED,
    ),
    # Triton
    (503, b'{"error":"in ensemble \'ensemble\', server is unavailable"}', ErrorKind.OVERLOADED),
    (500, b'{"error":"error message"}', ErrorKind.UPSTREAM),
    # DeepSpeed-MII: REST (flask-restful) and the OpenAI server (fastchat codes, always 400)
    (500, b'{"message": "Internal Server Error"}', ErrorKind.UPSTREAM),
    (400, b'{"object":"error","message":"Model \\"x\\" not found.","code":40301}', ErrorKind.BAD_REQUEST),
    # a body that is not JSON at all
    (502, b"<html>Bad Gateway</html>", ErrorKind.UPSTREAM),
    # A content policy (OpenAI's code, and Azure's content filter): another model's to try (docs/traffic.md).
    (
        400,
        b'{"error":{"message":"Your request was rejected by the safety system.","type":"invalid_request_error",'
        b'"code":"content_policy_violation"}}',
        ErrorKind.CONTENT_REFUSED,
    ),
    (400, b'{"error":{"message":"filtered","code":"content_filter","status":400}}', ErrorKind.CONTENT_REFUSED),
    # A type or code that is an object (unhashable): read as any other failure, never an adapter crash.
    (500, b'{"error":{"message":"x","type":{"nested":1},"code":[1]}}', ErrorKind.UPSTREAM),
]


@pytest.mark.parametrize(("status", "body", "kind"), CASES)
def test_engine_error_bodies(status: int, body: bytes, kind: ErrorKind) -> None:
    err = from_response("e", status, body, {})
    assert err.kind is kind
    assert err.message.startswith(f"e answered {status}: ")


def test_clients_get_no_engine_internals_and_logs_keep_them() -> None:
    body = (
        b'{"error":"Executor failed at /opt/tritonserver/backends/tensorrtllm/model_state.cc:812 calling '
        b"http://10.1.2.3:8001/v2 on gpu-7.triton.svc.cluster.local\\nTraceback (most recent call last):\\n"
        b'  File \\"/usr/lib/python3/x.py\\", line 3"}'
    )
    err = from_response("b1", 500, body, {})
    assert err.kind is ErrorKind.UPSTREAM and err.message == "b1 answered 500: the engine failed"
    assert "10.1.2.3" in err.detail and "Traceback" in err.detail
    rendered = from_backend(err).body()["error"]["message"]
    assert rendered == "The engine serving the model failed while answering."  # the gateway's words, no name


def test_a_refusal_reaches_the_client_without_the_backend_name_or_raw_bytes() -> None:
    body = b'{"object":"error","message":"top_p must be in (0, 1], got 7.","code":400}'
    vllm = from_response("gpu-b1", 400, body, {})
    assert from_backend(vllm).message == "top_p must be in (0, 1], got 7."
    for raw in (b"<html><body>400 Bad Request</body></html>", b"\x00\x9f\xff binary"):
        err = from_response("gpu-b1", 400, raw, {})
        assert err.kind is ErrorKind.BAD_REQUEST
        assert from_backend(err).message == "The engine refused the request as invalid."
    named = BackendError(ErrorKind.BAD_REQUEST, "tgi-7: TGI cannot take tools and response_format together")
    named.failures = [("tgi-7", named)]
    assert from_backend(named).message == "TGI cannot take tools and response_format together"


def test_a_bad_request_keeps_the_engines_words_without_hosts_or_paths() -> None:
    body = (
        b'{"object":"error","message":"This model\'s maximum context length is 2048 tokens (see '
        b'https://docs.internal/limits, /srv/models/llama/config.json, node gpu-3:8000).","code":400}'
    )
    err = from_response("b1", 400, body, {})
    assert err.kind is ErrorKind.CONTEXT_LENGTH
    assert err.message.startswith("b1 answered 400: This model's maximum context length is 2048 tokens")
    for secret in ("docs.internal", "/srv/models", "gpu-3", "8000"):
        assert secret not in err.message and secret in err.detail
    event = from_event("b1", {"error": {"message": "boom at 192.168.0.9:9000", "type": "InternalServerError"}})
    assert "192.168" not in event.message and "192.168" in event.detail


def test_retry_after_is_read_and_overloads_always_carry_one() -> None:
    assert from_response("e", 429, b"{}", {"retry-after": "7"}).retry_after == 7.0
    assert from_response("e", 503, b"", {}).retry_after == 1.0


def test_stream_error_events() -> None:
    assert from_event("e", {"error": "Model is overloaded", "error_type": "overloaded"}).kind is ErrorKind.OVERLOADED
    tgi_chat = {"error": {"message": "Request failed during generation: CUDA OOM", "http_status_code": 422}}
    assert from_event("e", tgi_chat, trust_status=False).kind is ErrorKind.UPSTREAM
    assert from_event("e", tgi_chat).kind is ErrorKind.BAD_REQUEST
    vllm_stream = {"error": {"message": "...", "type": "InternalServerError", "param": None, "code": 500}}
    assert from_event("e", vllm_stream).kind is ErrorKind.UPSTREAM


@pytest.mark.parametrize(
    ("kind", "status", "exc"),
    [
        (ErrorKind.BAD_REQUEST, 400, openai.BadRequestError),
        (ErrorKind.CONTEXT_LENGTH, 400, openai.BadRequestError),
        (ErrorKind.OVERLOADED, 429, openai.RateLimitError),
        (ErrorKind.TIMEOUT, 504, openai.InternalServerError),
        (ErrorKind.CONNECT, 502, openai.InternalServerError),
        (ErrorKind.UPSTREAM, 502, openai.InternalServerError),
        (ErrorKind.PROTOCOL, 502, openai.InternalServerError),
    ],
)
def test_every_kind_becomes_the_openai_error_the_client_expects(
    kind: ErrorKind, status: int, exc: type[openai.APIStatusError]
) -> None:
    api = from_backend(BackendError(kind, "boom", retry_after=1.0 if kind is ErrorKind.OVERLOADED else None))
    assert api.status == status
    request = httpx2.Request("POST", "http://x/v1/chat/completions")
    response = httpx2.Response(status, json=api.body(), request=request)
    client = openai.OpenAI(api_key="x", base_url="http://x/v1")
    err = client._make_status_error_from_response(response)
    assert isinstance(err, exc)
    assert err.body == api.body()["error"]
