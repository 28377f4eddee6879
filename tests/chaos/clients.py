"""One chaos client request, sent with httpx or the official openai client, and what became of it.

Outcomes (exactly one per request):
- ``completed``: 200 and a proper end (a whole answer with a finish reason; a stream whose last event
  before ``[DONE]`` finished it);
- ``error``: a clean OpenAI error: an error status with OpenAI error JSON, or a stream whose error
  event is followed by ``data: [DONE]`` and nothing else;
- ``left``: the client left early on purpose;
- ``hung``: the client's deadline passed;
- ``truncated``: a stream that ended without ``[DONE]``, or with ``[DONE]`` after neither a finish
  reason nor an error event;
- ``unclean``: anything else (an error body that is not OpenAI's, a 200 that is not an answer, a broken
  connection before any response).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from tests.chaos.fleet import MODEL
from tests.chaos.schedule import Spec

CLIENT_DEADLINE_S = 30.0
PROBE_PROMPT = "Hello"
"""Every probe sends the same prompt: a breaker gate keyed on the prompt would admit all or none."""


@dataclass
class Result:
    spec: Spec
    outcome: str = "unclean"
    status: int = 0
    backend: str = ""
    """x-enginegate-backend of the response ("" without)."""
    detail: str = ""
    sent_at: float = 0.0
    left_at: float | None = None
    ended_at: float = 0.0


def body(spec: Spec) -> dict[str, Any]:
    text = PROBE_PROMPT if spec.probe else f"Hello, this is request {spec.rid}."
    doc: dict[str, Any] = {"model": MODEL, "max_tokens": spec.max_tokens, "temperature": 0, "stream": spec.stream}
    if spec.chat:
        doc["messages"] = [{"role": "user", "content": text}]
    else:
        doc["prompt"] = f"The Zen of Python, by Tim Peters ({text})\n\nBeautiful is better than"
    return doc


def headers(spec: Spec) -> dict[str, str]:
    out = {"x-request-id": spec.rid}
    if spec.probe:
        out["x-enginegate-class"] = f"probe-{spec.probe}"
    return out


def is_openai_error(doc: Any) -> bool:
    err = doc.get("error") if isinstance(doc, dict) else None
    return (
        isinstance(err, dict)
        and isinstance(err.get("message"), str)
        and isinstance(err.get("type"), str)
        and {"param", "code"} <= err.keys()
    )


def stream_outcome(payloads: list[str]) -> tuple[str, str]:
    """(outcome, detail) of a whole SSE stream's ``data:`` payloads, in order."""
    if not payloads or payloads[-1] != "[DONE]":
        return "truncated", f"{len(payloads)} events, no [DONE] at the end"
    if payloads.count("[DONE]") != 1:
        return "truncated", "[DONE] twice"
    docs = []
    for p in payloads[:-1]:
        try:
            docs.append(json.loads(p))
        except json.JSONDecodeError:
            return "unclean", f"event is not JSON: {p[:80]!r}"
    errors = [i for i, d in enumerate(docs) if isinstance(d, dict) and "error" in d]
    if errors:
        if errors != [len(docs) - 1] or not is_openai_error(docs[-1]):
            return "unclean", f"error event not last or not OpenAI's: {payloads[errors[0]][:120]}"
        return "error", docs[-1]["error"].get("code") or docs[-1]["error"]["type"]
    finished = [d for d in docs if any(c.get("finish_reason") for c in d.get("choices", []))]
    if not finished:
        return "truncated", "[DONE] without a finish reason or an error event"
    return "completed", ""


async def send(spec: Spec, base_url: str, client: httpx.AsyncClient, sdk: openai.AsyncOpenAI) -> Result:
    result = Result(spec, sent_at=time.monotonic())
    try:
        async with asyncio.timeout(CLIENT_DEADLINE_S):
            if spec.sdk and not spec.probe:
                await _with_sdk(spec, sdk, result)
            else:
                await _with_httpx(spec, base_url, client, result)
    except TimeoutError:
        if result.left_at is None:
            result.outcome, result.detail = "hung", f"no end within {CLIENT_DEADLINE_S:g}s"
    result.ended_at = time.monotonic()
    return result


def _left(result: Result) -> None:
    result.outcome, result.left_at = "left", time.monotonic()


async def _with_httpx(spec: Spec, base_url: str, client: httpx.AsyncClient, result: Result) -> None:
    path = "/v1/chat/completions" if spec.chat else "/v1/completions"
    request = client.build_request("POST", base_url + path, json=body(spec), headers=headers(spec))
    if not spec.stream and spec.leave_after is not None:
        try:
            async with asyncio.timeout(spec.leave_after):
                response = await client.send(request)
        except TimeoutError:
            _left(result)  # the client goes away while the gateway works: it must stop the engine
            return
        _whole(response, result)
        return
    try:
        response = await client.send(request, stream=spec.stream)
    except httpx.TransportError as exc:
        result.detail = f"{type(exc).__name__}: {exc}"
        return
    result.status, result.backend = response.status_code, response.headers.get("x-enginegate-backend", "")
    if not spec.stream:
        _whole(response, result)
        return
    try:
        if response.status_code != 200:
            await response.aread()
            _whole(response, result)
            return
        payloads: list[str] = []
        try:
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    payloads.append(line[5:].strip())
                    if spec.leave_after is not None and len(payloads) >= spec.leave_after:
                        _left(result)
                        return
        except httpx.TransportError as exc:
            result.outcome, result.detail = "truncated", f"{type(exc).__name__} after {len(payloads)} events"
            return
        result.outcome, result.detail = stream_outcome(payloads)
    finally:
        await response.aclose()


def _whole(response: httpx.Response, result: Result) -> None:
    result.status, result.backend = response.status_code, response.headers.get("x-enginegate-backend", "")
    try:
        doc = response.json()
    except ValueError:
        result.detail = f"{response.status_code}: not JSON: {response.text[:120]!r}"
        return
    if response.status_code == 200:
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if choices and choices[0].get("finish_reason"):
            result.outcome = "completed"
        else:
            result.detail = f"200 without a finish reason: {response.text[:120]!r}"
    elif is_openai_error(doc):
        result.outcome, result.detail = "error", f"{response.status_code} {doc['error'].get('code')}"
    else:
        result.detail = f"{response.status_code}: not OpenAI error JSON: {response.text[:120]!r}"


async def _with_sdk(spec: Spec, sdk: openai.AsyncOpenAI, result: Result) -> None:
    """The official client: it must parse every answer and raise its own error types for every error."""
    doc, extra = body(spec), headers(spec)
    try:
        if spec.leave_after is not None and not spec.stream:
            try:
                async with asyncio.timeout(spec.leave_after):
                    await _sdk_call(sdk, spec, doc, extra, result)
            except TimeoutError:
                _left(result)
            return
        await _sdk_call(sdk, spec, doc, extra, result)
    except openai.APIStatusError as exc:
        result.status = exc.status_code
        result.backend = exc.response.headers.get("x-enginegate-backend", "")
        try:
            clean = is_openai_error(exc.response.json())
        except ValueError:
            clean = False
        result.outcome, result.detail = ("error" if clean else "unclean"), f"{exc.status_code} {type(exc).__name__}"
    except openai.APIConnectionError as exc:  # includes the SDK's own timeout; the deadline above is longer
        result.detail = f"{type(exc).__name__}: {exc}"
    except openai.APIError as exc:  # an error event inside a stream
        result.outcome, result.detail = "error", f"stream error event: {exc.message[:80]}"


async def _sdk_call(
    sdk: openai.AsyncOpenAI, spec: Spec, doc: dict[str, Any], extra: dict[str, str], result: Result
) -> None:
    kwargs: dict[str, Any] = {k: v for k, v in doc.items() if k not in ("messages", "prompt")}
    if spec.chat:
        raw = await sdk.chat.completions.with_raw_response.create(
            messages=doc["messages"], extra_headers=extra, **kwargs
        )
    else:
        raw = await sdk.completions.with_raw_response.create(prompt=doc["prompt"], extra_headers=extra, **kwargs)
    result.status, result.backend = raw.status_code, raw.headers.get("x-enginegate-backend", "")
    parsed: Any = raw.parse()  # the legacy raw response parses synchronously, even on the async client
    if not spec.stream:
        result.outcome = "completed" if parsed.choices and parsed.choices[0].finish_reason else "unclean"
        return
    events, finished = 0, False
    try:
        async for chunk in parsed:
            events += 1
            finished = finished or any(c.finish_reason for c in chunk.choices)
            if spec.leave_after is not None and events >= spec.leave_after:
                _left(result)
                return
    finally:
        await parsed.close()
    # The SDK stops at [DONE]; a stream that merely ended is over for it too, so a missing finish is truncation.
    result.outcome = "completed" if finished else "truncated"
    result.detail = "" if finished else f"sdk stream ended after {events} chunks without a finish reason"
