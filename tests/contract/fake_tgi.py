"""Contract fake of Hugging Face TGI 3.3.x (router 3.3.6-dev0) over the TinyEngine; behaviour from router/src.

POST ``/generate``, ``/generate_stream``, ``/`` (the compat route the ``text-generation`` client uses:
``stream`` switches, the non-stream answer is a one-item list, ``return_full_text`` defaults to true),
``/v1/chat/completions``, ``/v1/completions``, ``/tokenize`` (a GenerateRequest's inputs as SimpleTokens),
``/chat_tokenize`` (a ChatRequest templated as the chat route templates it, then tokenized); GET ``/health``
(``/``, ``/ping``), ``/info``, ``/v1/models``, ``/metrics``.

* SSE is ``data:<json>\\n\\n``, ``:\\n\\n`` keep-alive every 15 s while queued. ``/generate_stream`` has
  no ``[DONE]``; whatever fails after the 200 (validation too) is an ``{"error","error_type"}`` event;
  ``details`` only with ``parameters.details``. OpenAI routes send ``{"error": {"message",
  "http_status_code": 422}}`` (always 422) and end with ``data:[DONE]``.
* No ``parameters`` object means ``do_sample: true``; ``max_new_tokens`` defaults to
  ``max_total_tokens - input_length``; generation runs in chunks of at most 1024 tokens, re-queued
  while the request wants more and still validates. Bodies serde rejects (missing field, null for a
  non-Option field, wrong JSON type) get axum's plain-text 422; the wording only approximates serde's.
* Stop order: length, EOS, stop strings (regex ``re.escape(s) + "$"``); the stop string stays in the
  text. EOS is a generated token, streamed with its text (``<|im_end|>``) and ``special: true``.
* Messages API: temperature 0 is greedy, anything else (or none) samples; ``model`` is echoed unless
  absent or ``"tgi"``; ``eos_token`` reads ``stop`` (not in the completions stream's last chunk).

Capabilities (router/src/lib.rs, chat.rs, infer/tool_grammar.rs, validation.rs; schema docs/openapi.json):

* Grammars: ``parameters.grammar`` and chat ``response_format`` are TGI's ``GrammarType``, adjacently
  tagged ``{"type": "json" (alias "json_object") | "regex" | "json_schema", "value": ...}``; serde
  rejects other shapes (422, plain text). Validation as the router's: a ``json`` value that is a string
  is parsed again, a schema must pass the draft 2020-12 meta-schema and have ``properties`` ("grammar
  is not valid: Grammar must have a 'properties' field"). Reproduced as well: serde_json without
  ``preserve_order`` sorts object keys, so the constrained output has its properties in key order.
* Tools (chat): ``tools`` (``function.arguments`` or its alias ``parameters`` required), ``tool_choice``
  ("auto", "none", "required", ``{"type": "function", "function": {"name"}}``, any other string
  naming a function), ``tool_prompt``; ``tools`` with ``response_format`` is a 422 ``tool_error``.
  ToolGrammar's schema (``$functions`` with a ``_name`` const, "auto" adding ``no_tool``); the prompt as
  ChatTemplate::apply makes it: a template that uses ``tools`` gets them as serde writes them (each
  function's schema under ``arguments``, a JSON string: a template reading ``parameters`` shows none)
  and ``\\n---\\n<tool_prompt>`` goes onto the last message, else ``\\n---\\n<tools JSON>\\n<tool_prompt>``;
  history as TextMessage makes it (tool calls become their JSON as content);
  the output parsed as ``{"function": {"_name", ...arguments}}``: a call answers
  ``message.tool_calls`` (id "0", ``arguments`` a JSON string, ``finish_reason`` "stop"); ``no_tool``
  generates again without tools. Streams follow ChatState: nothing until the name parses, then one
  ``delta.tool_calls`` piece per token (the first with the name and ``{`` for arguments, every one
  with the id of ``next_tool_call_id``, ``name`` null after the first, the last ``}`` trimmed), and no
  chunk with a finish reason after a call.
* Logprobs: each token's ``logprob`` is the demo model's; ``top_n_tokens`` (chat ``top_logprobs``, at
  most 5) gives ``top_tokens`` (native stream events, ``details.top_tokens``) from one forward pass per
  token; chat ``logprobs: true`` gives ``choices[].logprobs.content`` (streams: the token of each
  chunk, the end token's too). ``n`` and ``logit_bias`` (a list of floats in TGI's schema: OpenAI's map
  is a 422) are accepted and unused, as in TGI.

Stand-ins (the fake's own choices where a real model and outlines decide):

* Constrained decoding: a grammar request says a fixed document instead of the model's choice, teacher
  forced through the demo model (token ids, counts and log probabilities are the model's): for a JSON
  schema the smallest instance it can build (every property, sorted; strings "Paris", numbers their
  minimum or 0, the first ``enum``/``anyOf`` member), for a regex the first of a few candidate
  documents it fully matches (none: the model's free text).
* ``tool_choice`` "auto" picks ``no_tool`` (a tiny model answering in text) unless the app is made with
  ``auto_tool_call=True``; "required" calls the first tool.

Not reproduced: ``prefill`` ([]), ``truncate`` (only validated and counted), ``best_of`` > 1, seeded
sampling (``seed`` is validated and echoed in ``details.seed``; the demo model's sampling is not
seeded), ``top_k``, ``typical_p``, ``watermark`` and penalties (validated only), the wording of serde's
errors (approximate), ``FakeControl.loading`` (TGI's router does not listen before its model is loaded).
The body of every generation request is recorded in ``received`` when ``create_app`` is given that list.

``FakeControl.fail_next`` names, taken at the start of each generation request:
``overloaded`` 429 before validation (in a stream, the first and only event); ``overloaded_midstream``
and ``generation``: 3 tokens, then that error event (429 / 424 when not streaming); ``incomplete``:
the last token never comes (500 ``incomplete_generation`` / an ``incomplete_generation_stream``
event); ``validation``: a 422 validation error; and the generic faults of control.py. ``delay_s`` and waiting
for one of ``control.max_running`` slots are spent queued (``tgi_queue_size``).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, fields
from typing import Any

import anyio
import jsonschema
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from backends.text import CHATML
from tests.contract.control import FakeControl, with_faults
from tests.contract.tiny_engine import TinyEngine

VERSION = "3.3.6-dev0"
FINGERPRINT = f"{VERSION}-native"
CHUNK = 1024  # DEFAULT_GENERATION_LENGTH, router/src/validation.rs
FAULTS = ("overloaded", "overloaded_midstream", "generation", "incomplete", "validation")
STATUS = {"validation": 422, "overloaded": 429, "generation": 424, "template_error": 422, "tool_error": 422}
FAIL_LABEL = {"template_error": "template", "suffix not supported": "validation", "batch size exceeded": "validation"}
NO_BUFFERING = {"x-accel-buffering": "no"}
DESERIALIZE = "Failed to deserialize the JSON body into the target type: "
EXPECTED = {"f": "f32", "i": "u32", "j": "i32", "b": "a boolean", "s": "a string", "l": "a sequence", "m": "a map"}
KINDS: dict[str, Callable[[Any], bool]] = {
    "f": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "i": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "j": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "b": lambda v: isinstance(v, bool),
    "s": lambda v: isinstance(v, str),
    "l": lambda v: isinstance(v, list),
    "m": lambda v: isinstance(v, dict),
}


def spec(text: str) -> dict[str, str]:
    """``name:kind`` as serde sees the field; ``!`` marks a non-Option field (null rejected)."""
    return {k: v for k, v in (item.split(":") for item in text.split())}


GEN_SPEC = spec(
    "best_of:i temperature:f repetition_penalty:f frequency_penalty:f top_k:j top_p:f typical_p:f do_sample:b!"
    " max_new_tokens:i return_full_text:b stop:l! truncate:i watermark:b! seed:i details:b! decoder_input_details:b!"
    " top_n_tokens:i adapter_id:s grammar:m"
)
OAI_SPEC = spec("model:s max_tokens:i temperature:f top_p:f stream:b! seed:i stop:l frequency_penalty:f")
CHAT_SPEC = OAI_SPEC | spec(
    "messages:l! presence_penalty:f stream_options:m! max_completion_tokens:i top_logprobs:i logprobs:b logit_bias:l"
    " n:i tools:l tool_prompt:s response_format:m"
)
COMPLETION_SPEC = OAI_SPEC | spec("suffix:s repetition_penalty:f")


class TGIError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.kind}


class BadBody(Exception):
    """axum's Json extractor rejecting the body before the handler runs."""


def invalid(message: str) -> TGIError:
    return TGIError("validation", f"Input validation error: {message}")


def dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def sse(obj: object) -> bytes:
    return f"data:{dumps(obj)}\n\n".encode()


def json_response(obj: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(obj), status, headers, media_type="application/json")


def check(obj: Any, types: dict[str, str], path: str = "", required: tuple[str, ...] = ()) -> dict[str, Any]:
    """serde's verdict: the first bad field in document order, then missing fields; unknown fields pass."""
    at = f"{path}: " if path else ""
    if not isinstance(obj, dict):
        raise BadBody(f"{DESERIALIZE}{at}invalid type: {type(obj).__name__}, expected a struct")
    for key, v in obj.items():
        kind = types.get(key, "")
        if kind and (v is not None or kind.endswith("!")) and not KINDS[kind[0]](v):
            got, where = "null" if v is None else f"{type(v).__name__} `{v}`", f"{path}.{key}" if path else key
            raise BadBody(f"{DESERIALIZE}{where}: invalid type: {got}, expected {EXPECTED[kind[0]]}")
    for key in required:
        if key not in obj:
            raise BadBody(f"{DESERIALIZE}{at}missing field `{key}`")
    return obj


async def read_json(request: Request) -> Any:
    if "json" not in request.headers.get("content-type", ""):
        raise BadBody("Expected request with `Content-Type: application/json`")
    try:
        return json.loads(await request.body())
    except ValueError as exc:
        raise BadBody(f"Failed to parse the JSON body into the target type: {exc}") from None


async def read_chat(
    request: Request,
) -> tuple[dict[str, Any], list[dict[str, Any]] | None, str | tuple[str, str], dict[str, Any] | None]:
    """A ChatRequest as serde reads it: the body, its tools, tool choice and grammar; ``BadBody`` if not."""
    body = check(await read_json(request), CHAT_SPEC, required=("messages",))
    check(body.get("stream_options", {}), spec("include_usage:b!"), "stream_options")
    check_messages(body["messages"])
    tools = parse_tools(body.get("tools"))
    return (
        body,
        tools,
        parse_tool_choice(body.get("tool_choice")),
        parse_grammar(body.get("response_format"), "response_format"),
    )


def rejected(exc: BadBody) -> Response:
    text = str(exc)
    return PlainTextResponse(text, 422 if text.startswith(DESERIALIZE) else 415 if "Content-Type" in text else 400)


@dataclass
class GenRequest:
    """GenerateRequest: inputs and GenerateParameters (router/src/lib.rs)."""

    inputs: str
    max_new_tokens: int | None = None
    do_sample: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    typical_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool | None = None
    best_of: int | None = None
    truncate: int | None = None
    top_n_tokens: int | None = None
    grammar: dict[str, Any] | None = None
    """``GrammarType`` as serde read it: ``{"type": "json" | "regex" | "json_schema", "value"}``."""

    @classmethod
    def parse(cls, body: Any, compat: bool) -> GenRequest:
        check(body, spec("inputs:s! parameters:m!" + (" stream:b!" if compat else "")), required=("inputs",))
        if "parameters" not in body:  # serde default_parameters(): do_sample true
            return cls(body["inputs"], do_sample=True)
        params, names = check(body["parameters"], GEN_SPEC, "parameters"), {f.name for f in fields(cls)}
        params = params | {"grammar": parse_grammar(params.get("grammar"), "parameters.grammar")}
        return cls(body["inputs"], **{k: v for k, v in params.items() if k in names and v is not None})


def oai_request(body: dict[str, Any], prompt: str, max_tokens: Any, repetition: float | None) -> GenRequest:
    """ChatRequest::try_into_generate and completions: temperature 0 is greedy, anything else samples."""
    t = body.get("temperature")
    req = GenRequest(prompt, max_tokens, t != 0, None if t == 0 else t, body.get("top_p"), details=True)
    req.stop, req.seed, req.frequency_penalty = body.get("stop") or [], body.get("seed"), body.get("frequency_penalty")
    req.repetition_penalty = repetition
    return req


# --- grammars: serde's reading, the router's validation, the fake's stand-in for constrained decoding ---

GRAMMAR_TYPES = {"json": "json", "json_object": "json", "regex": "regex", "json_schema": "json_schema"}
STAND_IN_TEXT = "Paris"
FORMATS = {
    "date": "2024-05-01", "date-time": "2024-05-01T12:00:00Z", "time": "12:00:00", "email": "someone@example.com",
    "uri": "https://example.com/", "uuid": "00000000-0000-4000-8000-000000000000",
}  # fmt: skip
# What a regex grammar is tried with, in order: the first the regex fully matches is the answer.
REGEX_CANDIDATES = ('{"answer": "Paris"}', "{}", "Paris", "0", "true")


def describe(v: Any) -> str:
    return "null" if v is None else f"{type(v).__name__} `{v}`"


def parse_grammar(obj: Any, path: str) -> dict[str, Any] | None:
    """serde's verdict on an ``Option<GrammarType>`` (adjacently tagged by ``type``, content ``value``)."""
    if obj is None:
        return None
    at = f"{DESERIALIZE}{path}: "
    if not isinstance(obj, dict):
        raise BadBody(f"{at}invalid type: {describe(obj)}, expected adjacently tagged enum GrammarType")
    kind = obj.get("type")
    if kind is None:
        raise BadBody(f"{at}missing field `type`")
    if kind not in GRAMMAR_TYPES:
        expected = ", ".join(f"`{k}`" for k in GRAMMAR_TYPES)
        raise BadBody(f"{at}unknown variant `{kind}`, expected one of {expected}")
    if "value" not in obj:
        raise BadBody(f"{at}missing field `value`")
    value = obj["value"]
    if kind == "regex" and not isinstance(value, str):
        raise BadBody(f"{at}invalid type: {describe(value)}, expected a string")
    if kind == "json_schema":
        if not isinstance(value, dict):
            raise BadBody(f"{at}invalid type: {describe(value)}, expected struct JsonSchemaConfig")
        if "schema" not in value:
            raise BadBody(f"{at}missing field `schema`")
    return {"type": GRAMMAR_TYPES[kind], "value": value}


def grammar_schema(grammar: dict[str, Any]) -> Any:
    """The JSON schema of a ``json``/``json_schema`` grammar, validated as the router does."""
    value = grammar["value"]
    if grammar["type"] == "json_schema":
        schema = value["schema"]
    elif isinstance(value, str):
        try:
            schema = json.loads(value)
        except ValueError as exc:
            raise invalid(f"grammar is not valid: {exc}") from None
    elif isinstance(value, dict):
        schema = value
    else:
        raise invalid("grammar is not supported")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise invalid(f"grammar is not valid: {exc.message}") from None
    if not isinstance(schema, dict) or "properties" not in schema:
        raise invalid("grammar is not valid: Grammar must have a 'properties' field")
    return schema


def resolve(ref: str, root: Any) -> Any:
    node = root
    for part in ref.removeprefix("#/").split("/") if ref.startswith("#/") else ():
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def instance(schema: Any, root: Any, depth: int = 0) -> Any:
    """A small document valid against ``schema``: the fake's stand-in for what outlines would let the
    model write. Properties in key order (serde_json's maps are sorted), every one of them."""
    if not isinstance(schema, dict) or depth > 16:
        return {}
    if "$ref" in schema:
        return instance(resolve(schema["$ref"], root), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return instance(schema[key][0], root, depth + 1)
    if schema.get("allOf"):
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            merged |= resolve(part["$ref"], root) if "$ref" in part else part
        return instance(merged, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: instance(props[k], root, depth + 1) for k in sorted(props)}
    if kind == "array":
        n = max(int(schema.get("minItems", 1 if "items" in schema else 0)), 0)
        n = min(n, int(schema.get("maxItems", n)))
        return [instance(schema.get("items", {}), root, depth + 1) for _ in range(n)]
    if kind in ("integer", "number"):
        if "minimum" in schema or "exclusiveMinimum" in schema:
            value = schema["minimum"] if "minimum" in schema else schema["exclusiveMinimum"] + 1
        else:
            value = min(0, schema.get("maximum", 0), schema.get("exclusiveMaximum", 1) - 1)
        return int(value) if kind == "integer" else value
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if schema.get("format") in FORMATS:
        return FORMATS[schema["format"]]
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    text = STAND_IN_TEXT.ljust(low, "s")
    return text if high is None else text[: max(int(high), low)]


def stand_in(grammar: dict[str, Any]) -> str | None:
    """What a grammar request says instead of the model's free choice (None: the model's own text)."""
    if grammar["type"] == "regex":
        try:
            pattern = re.compile(grammar["value"])
        except re.error:
            return None
        return next((c for c in REGEX_CANDIDATES if pattern.fullmatch(c)), None)
    schema = grammar_schema(grammar)
    return json.dumps(instance(schema, schema), ensure_ascii=False)


# --- tools: serde's reading, ToolGrammar, ChatState ---

NO_TOOL = {
    "type": "function",
    "function": {
        "name": "no_tool",
        "description": "Open ended response with no specific tool selected",
        "arguments": {"type": "object"},
    },
}
DEFAULT_TOOL_PROMPT = (
    "\nGiven the functions available, please respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt. Respond in the format {name: function name, parameters: dictionary of "
    "argument name and its value}.Do not use variables.\n"
)


def parse_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """``Vec<Tool>``: ``type`` and ``function`` ({description, name, arguments alias parameters})."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        check(tool, spec("type:s! function:m!"), f"tools[{i}]", required=("type", "function"))
        fn = check(tool["function"], spec("description:s name:s!"), f"tools[{i}].function", required=("name",))
        if "arguments" not in fn and "parameters" not in fn:
            raise BadBody(f"{DESERIALIZE}tools[{i}].function: missing field `arguments`")
        args = fn["arguments"] if "arguments" in fn else fn["parameters"]
        out.append({"type": tool["type"], "function": {"name": fn["name"], "description": fn.get("description")}})
        out[-1]["function"]["arguments"] = args
    return out


CHUNKS = ("text", "image_url")


def check_messages(messages: list[Any]) -> None:
    """``Vec<Message>``: a role, and a body that is ``content`` (text or chunks) or else ``tool_calls``
    (an untagged enum tried in that order: an empty ``content`` beside ``tool_calls`` hides the calls)."""
    for i, m in enumerate(messages):
        check(m, spec("role:s! name:s"), f"messages[{i}]", required=("role",))
        content = m.get("content")
        chunks = isinstance(content, list) and all(isinstance(c, dict) and c.get("type") in CHUNKS for c in content)
        if isinstance(content, str) or chunks:
            continue
        calls = m.get("tool_calls")
        ok = isinstance(calls, list) and all(
            isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("type"), str)
            and isinstance(c.get("function"), dict)
            and isinstance(c["function"].get("name"), str)
            and ("arguments" in c["function"] or "parameters" in c["function"])
            for c in calls
        )  # fmt: skip
        if not ok:
            raise BadBody(f"{DESERIALIZE}messages[{i}]: data did not match any variant of untagged enum MessageBody")


def parse_tool_choice(value: Any) -> str | tuple[str, str]:
    """ToolTypeDeserializer: null is "auto", a string other than the three modes names a function."""
    if value is None:
        return "auto"
    if isinstance(value, str):
        return value if value in ("auto", "none", "required") else ("function", value)
    fn = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        return ("function", fn["name"])
    raise BadBody(f"{DESERIALIZE}tool_choice: data did not match any variant of untagged enum ToolTypeDeserializer")


def tool_grammar(
    tools: list[dict[str, Any]], choice: str | tuple[str, str]
) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """ToolGrammar::apply: the tools to show and the JSON schema that forces one call of one of them."""
    if isinstance(choice, tuple):
        use = [t for t in tools if t["function"]["name"] == choice[1]][:1]
        if not use:
            raise TGIError("tool_error", f"Tool with name {choice[1]} not found")
    else:
        use = {"required": tools, "auto": [*tools, NO_TOOL], "none": []}[choice]
    if not use:
        return None
    functions = {}
    for tool in use:
        fn = tool["function"]
        params: dict[str, Any] = {"description": fn.get("description") or ""}
        props: dict[str, Any] = {"_name": {"type": "string", "const": fn["name"]}}
        required: list[Any] = ["_name"]
        args = fn["arguments"]
        if isinstance(args, dict):
            more, needed = args.get("properties"), args.get("required")
            props |= more if isinstance(more, dict) else {}
            required += needed if isinstance(needed, list) else []
            params["additionalProperties"] = args.get("additionalProperties") == "true"  # sic: only the string
        functions[fn["name"]] = params | {"properties": props, "required": required}
    refs = [{"$ref": f"#/$functions/{t['function']['name']}"} for t in use]
    return use, {"$functions": functions, "properties": {"function": {"anyOf": refs}}}


def tool_call_doc(schema: dict[str, Any], name: str) -> str:
    """The stand-in call of ``name`` under ToolGrammar's schema, keys sorted as serde_json writes them."""
    doc = {"function": instance(schema["$functions"][name], schema)}
    return json.dumps(doc, ensure_ascii=False)


def parse_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """serde's ``Call``: ``{"function": {"_name": str, ...arguments}}`` (trailing text refused)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    fn = doc.get("function") if isinstance(doc, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("_name"), str):
        return None
    return fn["_name"], {k: v for k, v in sorted(fn.items()) if k != "_name"}


def next_tool_call_id(messages: list[Any]) -> str:
    """ChatRequest::next_tool_call_id: one more than the largest numeric id in the history, else a UUID."""
    best = 0
    for m in messages:
        if isinstance(m, dict) and m.get("content") is None:
            for call in m.get("tool_calls") or ():
                try:
                    best = max(best, int(str(call.get("id"))) + 1)
                except ValueError:
                    return str(uuid.uuid4())
    return str(best)


def chat_logprobs(tokens: list[dict[str, Any]], tops: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """ChatCompletionLogprobs from tokens and their top tokens (missing tops: none)."""
    content = []
    for i, t in enumerate(tokens):
        alts = tops[i] if i < len(tops) else []
        top = [{"token": a["text"], "logprob": a["logprob"]} for a in alts]
        content.append({"token": t["text"], "logprob": t["logprob"], "top_logprobs": top})
    return {"content": content}


class ChatState:
    """chat.rs ChatState: turns native stream events into chat chunks; a tool stream is held
    (Buffering) until the function's name parses, then streamed as argument pieces (Tool)."""

    def __init__(self, using_tools: bool, include_usage: bool, head: dict[str, Any], logprobs: bool, call_id: str):
        self.state = "buffering" if using_tools else "content"
        self.text, self.include_usage, self.head = "", include_usage, head
        self.logprobs, self.call_id = logprobs, call_id

    def push(self, ev: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The chunks for one event; None is ``ChatEvent::NoTool`` (the model chose ``no_tool``)."""
        tok, out = ev["token"], []
        if self.state == "buffering":
            self.text += tok["text"]
            call = parse_call(self.text.rstrip(" \t\n\r\x0b\x0c,}") + "}}")
            if call is not None:
                if call[0] == "no_tool":
                    return None
                out.append(self.chunk(ev, "{", tool=True, name=call[0]))
                self.state = "tool"
        elif self.state == "tool":
            self.text += tok["text"]
            if parse_call(self.text) is not None:
                self.state = "buffering"
                text = tok["text"].rstrip()
                out.append(self.chunk(ev, text[:-1] if text.endswith("}") else text, tool=True))
            else:
                out.append(self.chunk(ev, tok["text"], tool=True))
        else:
            out.append(self.chunk(ev, tok["text"], tool=False))
        d = ev["details"]
        if d and self.include_usage:
            kind = {"object": "chat.completion.chunk"}
            out.append(kind | self.head | {"choices": [], "usage": usage(d["input_length"], d)})
        return out

    def chunk(self, ev: dict[str, Any], text: str, tool: bool, name: str | None = None) -> dict[str, Any]:
        """create_event_from_stream_token, with the token's text as ChatState rewrote it."""
        tok, d = ev["token"], ev["details"]
        logprobs = chat_logprobs([tok | {"text": text}], [ev.get("top_tokens", [])]) if self.logprobs else None
        content = None if tok["special"] else text
        delta: dict[str, Any]
        if tool and content is not None:
            function = {"name": name, "arguments": content}
            call = {"index": 0, "id": self.call_id, "type": "function", "function": function}
            delta = {"role": "assistant", "tool_calls": [call]}
        else:
            delta = {"role": "assistant", "content": "" if tool or content is None else content}
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": d and openai_finish(d)}
        return {"object": "chat.completion.chunk"} | self.head | {"choices": [choice], "usage": None}


@dataclass
class Plan:
    """What validation resolved a request into."""

    prompt: str
    input_length: int
    budget: int
    sample: bool
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    script: str | None = None
    """The grammar's stand-in answer (see the module's docstring), said instead of the model's choice."""
    top_n: int = 0


@dataclass
class Step:
    index: int
    token: dict[str, Any]
    finish: str | None
    text: str
    plan: Plan
    times: tuple[float, float, float]  # received, validated (queued), scheduled
    top: list[dict[str, Any]] = field(default_factory=list)
    """``top_tokens`` at this place (``top_n_tokens`` of them)."""


class Histogram:
    def __init__(self, buckets: list[float]) -> None:
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, v: float) -> None:
        self.counts = [c + (v <= b) for c, b in zip(self.counts, self.buckets, strict=True)]
        self.sum, self.count = self.sum + v, self.count + 1

    def lines(self, name: str) -> list[str]:
        def num(v: float) -> str:
            return str(int(v)) if float(v).is_integer() else repr(float(v))

        rows: list[tuple[str, object]] = [
            (f'_bucket{{le="{num(b)}"}}', c) for b, c in zip(self.buckets, self.counts, strict=True)
        ]
        rows += [('_bucket{le="+Inf"}', self.count), ("_sum", num(self.sum)), ("_count", self.count)]
        return [f"# TYPE {name} histogram", *(f"{name}{suffix} {v}" for suffix, v in rows), ""]


class FakeTGI:
    def __init__(
        self,
        engine: TinyEngine,
        control: FakeControl,
        model_id: str,
        max_input: int,
        max_total: int,
        received: list[tuple[str, Any]] | None,
        auto_tool_call: bool,
    ) -> None:
        self.engine, self.control, self.model_id = engine, control, model_id
        self.max_input, self.max_total, self.queued = max_input, max_total, 0
        self.received, self.auto_tool_call = received, auto_tool_call
        self.counters: dict[tuple[str, str], int] = {}
        seconds = [0.0001 * 1.5]
        while len(seconds) < 35:
            seconds.append(seconds[-1] * 1.5)
        self.hists = {f"tgi_request_{n}duration": Histogram(seconds) for n in ("", "queue_", "inference_")}
        self.hists["tgi_request_input_length"] = Histogram([max_input / 100 * (x + 1) for x in range(100)])
        self.hists["tgi_request_generated_tokens"] = Histogram([max_total / 100 * (x + 1) for x in range(100)])

    def record(self, path: str, body: Any) -> None:
        if self.received is not None:  # only when a test asked: a long chaos run keeps no bodies
            self.received.append((path, body))

    def count(self, name: str, label: str = "") -> None:
        self.counters[(name, label)] = self.counters.get((name, label), 0) + 1

    def fail(self, err: TGIError) -> TGIError:
        label = "incomplete" if "incomplete" in err.kind else FAIL_LABEL.get(err.kind, err.kind)
        self.count("tgi_request_failure", label)
        return err

    def take_fault(self) -> str | None:
        fault = self.control.take_fault()
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"fake TGI knows no fault {fault!r}; it knows {FAULTS}")
        return fault

    def validate(self, req: GenRequest) -> Plan:
        """Validation::validate and validate_input, in the router's order."""
        best_of, top_p = req.best_of or 1, 1.0 if req.top_p is None else req.top_p
        temperature = 1.0 if req.temperature is None else req.temperature
        asked = req.do_sample or any(v is not None for v in (req.temperature, req.top_k, req.top_p, req.typical_p))
        for bad, message in (
            (best_of > 1 and not asked, "you must use sampling when `best_of` is > 1"),
            (temperature <= 0.0, "`temperature` must be strictly positive"),
            ((req.repetition_penalty or 1.0) <= 0.0, "`repetition_penalty` must be strictly positive"),
            (not -2.0 <= (req.frequency_penalty or 0.0) <= 2.0, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
            (req.top_p is not None and not 0.0 < req.top_p < 1.0, "`top_p` must be > 0.0 and < 1.0"),
            (req.typical_p is not None and not 0.0 < req.typical_p < 1.0, "`typical_p` must be > 0.0 and < 1.0"),
            (req.top_k is not None and req.top_k <= 0, "`top_k` must be strictly positive"),
            (req.max_new_tokens == 0, "`max_new_tokens` must be strictly positive"),
            (len(req.stop) > 4, f"`stop` supports up to 4 stop sequences. Given: {len(req.stop)}"),
            (req.seed is not None and best_of > 1, "`seed` must not be set when `best_of` > 1"),
            ((req.top_n_tokens or 0) > 5, f"`top_n_tokens` must be >= 0 and <= 5. Given: {req.top_n_tokens}"),
            (not req.inputs, "`inputs` cannot be empty"),
            (req.truncate is not None and not 0 < req.truncate <= self.max_input, self.bad_truncate(req.truncate)),
        ):
            if bad:
                raise invalid(message)
        n_in = min(self.engine.count_tokens(req.inputs), req.truncate or 1 << 62)
        chunk = min(self.max_total - n_in if req.max_new_tokens is None else req.max_new_tokens, CHUNK)
        if n_in + chunk > self.max_total:
            raise invalid(self.too_long(n_in, chunk))
        if n_in > self.max_input:
            raise invalid(f"`inputs` must have less than {self.max_input} tokens. Given: {n_in}")
        self.hists["tgi_request_input_length"].observe(n_in)
        script = None if req.grammar is None else self.stand_in(req.grammar)
        sample = req.do_sample or temperature != 1.0 or bool(req.top_k) or top_p < 1.0 or (req.typical_p or 1) < 1
        seed = (random.getrandbits(64) if req.seed is None else req.seed) if sample else None
        budget = self.budget(n_in, req.max_new_tokens)
        plan = Plan(req.inputs, n_in, budget, sample, temperature, top_p, seed, req.stop, script, req.top_n_tokens or 0)
        return plan

    def stand_in(self, grammar: dict[str, Any]) -> str | None:
        """The answer a grammar forces here; ToolGrammar's schema gets the fake's tool choice."""
        value = grammar["value"]
        functions = value.get("$functions") if grammar["type"] == "json" and isinstance(value, dict) else None
        if not isinstance(functions, dict):
            return stand_in(grammar)
        schema = grammar_schema(grammar)
        names = [r["$ref"].rsplit("/", 1)[-1] for r in schema["properties"]["function"]["anyOf"]]
        tools = [n for n in names if n != "no_tool"]
        pick = tools[0] if tools and ("no_tool" not in names or self.auto_tool_call) else names[-1]
        return tool_call_doc(schema, pick)

    def bad_truncate(self, given: int | None) -> str:
        return f"`truncate` must be strictly positive and less than {self.max_input}. Given: {given}"

    def too_long(self, n_in: int, new: int) -> str:
        limit = f"`inputs` tokens + `max_new_tokens` must be <= {self.max_total}"
        return f"{limit}. Given: {n_in} `inputs` tokens and {new} `max_new_tokens`"

    def budget(self, n_in: int, requested: int | None) -> int:
        """Infer::generate_stream re-queues a request that stopped on length while it wants more and validates."""
        goal, total = (self.max_total - n_in if requested is None else requested), 0
        while True:
            n = n_in + total
            chunk = min(self.max_total - n if requested is None else requested, CHUNK)
            if total and (n > self.max_input or n + chunk > self.max_total or chunk <= 0):
                return total
            total += chunk
            if total >= goal:
                return total

    async def steps(self, req: GenRequest, fault: str | None) -> AsyncGenerator[Step | None, None]:
        """Validated, queued, generated tokens; ``None`` is a keep-alive tick while queued."""
        t0 = time.monotonic()
        if fault == "overloaded":
            raise TGIError("overloaded", "Model is overloaded")
        if fault == "validation":
            raise invalid(self.too_long(self.max_total, 1))
        plan, queued, left = self.validate(req), time.monotonic(), self.control.delay_s
        self.queued += 1
        admitted = False
        try:
            try:
                while left > 15:
                    await asyncio.sleep(15)
                    left -= 15
                    yield None
                await asyncio.sleep(left)
                await self.control.admit()  # queued while the batch is full (max_running)
                admitted = True
            finally:
                self.queued -= 1
            async for step in self._generate(plan, fault, (t0, queued)):
                yield step
        finally:
            if admitted:
                self.control.release()

    async def _generate(self, plan: Plan, fault: str | None, times0: tuple[float, float]) -> AsyncGenerator[Step, None]:
        t0, queued = times0
        times, text, window = (t0, queued, time.monotonic()), "", ""
        p, ids = plan, []
        opts: dict[str, Any] = {"greedy": not p.sample, "temperature": p.temperature, "top_p": p.top_p}
        gen = self.engine.stream(p.prompt, p.budget, script=p.script, **opts)
        assert isinstance(gen, AsyncGenerator)
        async with aclosing(gen) as tokens:
            async for tok in tokens:
                shown = str(self.engine._tokenizer.id_to_token(tok.id)) if tok.special else tok.text
                ids.append(tok.id)
                text, window = text + ("" if tok.special else tok.text), window + shown
                window = window[-200:] if len(window) > 300 else window  # StoppingCriteria keeps a tail
                finish = "length" if tok.index >= plan.budget else "eos_token" if tok.special else None
                if finish is None and any(re.search(re.escape(s) + "$", window) for s in plan.stop):
                    finish = "stop_sequence"
                if fault == "generation" and (tok.index > 3 or finish):
                    raise TGIError("generation", "Request failed during generation: Server error: CUDA out of memory")
                if fault == "overloaded_midstream" and (tok.index > 3 or finish):
                    raise TGIError("overloaded", "Model is overloaded")
                if fault == "incomplete" and finish:
                    break
                token = {"id": tok.id, "text": shown, "logprob": tok.logprob, "special": tok.special}
                top = await self.top_tokens(p, ids) if p.top_n else []
                yield Step(tok.index, token, finish, text, plan, times, top)
                if finish:
                    return
        raise TGIError("incomplete_generation_stream", "Incomplete generation stream")

    async def top_tokens(self, plan: Plan, ids: list[int]) -> list[dict[str, Any]]:
        """The ``top_n`` most likely tokens where the last of ``ids`` was chosen (a forward pass, off the loop)."""
        rows = await asyncio.to_thread(self.engine.alternatives, plan.prompt, ids, plan.top_n)
        special = self.engine._stop_ids
        return [
            {"id": i, "text": self.engine.decode_alone(i), "logprob": lp, "special": i in special}
            for i, lp in rows[-1][1]
        ]

    def succeed(self, last: Step) -> dict[str, str]:
        """Success metrics, and /generate's timing headers."""
        (t0, queued, start), now = last.times, time.monotonic()
        spans = {"total": now - t0, "validation": queued - t0, "queue": start - queued, "inference": now - start}
        for name, span in (("", "total"), ("queue_", "queue"), ("inference_", "inference")):
            self.hists[f"tgi_request_{name}duration"].observe(spans[span])
        self.hists["tgi_request_generated_tokens"].observe(last.index)
        self.count("tgi_request_success")
        headers = {"x-compute-time": repr(now - t0)} | {f"x-{k}-time": str(int(v * 1000)) for k, v in spans.items()}
        return headers | {"x-time-per-token": str(int(spans["inference"] * 1000 / last.index))}

    async def generate_internal(self, req: GenRequest, fault: str | None) -> tuple[dict[str, str], int, dict[str, Any]]:
        """server.rs generate_internal: headers, input length and GenerateResponse, or a TGIError."""
        self.count("tgi_request_count")
        try:
            async with aclosing(self.steps(req, fault)) as it:
                steps = [s async for s in it if s is not None]
        except TGIError as exc:
            incomplete = TGIError("incomplete_generation", "Incomplete generation")
            raise self.fail(incomplete if "incomplete" in exc.kind else exc) from None
        last, n_in = steps[-1], steps[-1].plan.input_length
        headers = {"x-compute-type": "gpu+optimized", "x-compute-characters": str(len(req.inputs))} | self.succeed(last)
        headers |= {"x-prompt-tokens": str(n_in), "x-generated-tokens": str(last.index)}
        out: dict[str, Any] = {"generated_text": (req.inputs if req.return_full_text else "") + last.text}
        if req.details or req.decoder_input_details:
            details = {"finish_reason": last.finish, "generated_tokens": last.index, "seed": last.plan.seed}
            out["details"] = details | {"prefill": [], "tokens": [s.token for s in steps]}
            if last.plan.top_n:
                out["details"]["top_tokens"] = [s.top for s in steps]
        return headers, n_in, out

    async def stream_internal(
        self, req: GenRequest, fault: str | None
    ) -> AsyncGenerator[dict[str, Any] | TGIError | None]:
        """server.rs generate_stream_internal: StreamResponse dicts (None: keep-alive), then at most one error."""
        self.count("tgi_request_count")
        try:
            if (req.best_of or 1) != 1:
                raise invalid("`best_of` != 1 is not supported when streaming tokens")
            if req.decoder_input_details:
                raise invalid("`decoder_input_details` == true is not supported when streaming tokens")
            async with aclosing(self.steps(req, fault)) as it:
                async for s in it:
                    if s is None:
                        yield None
                        continue
                    event: dict[str, Any] = {"index": s.index, "token": s.token}
                    if s.top:
                        event["top_tokens"] = s.top
                    event |= {"generated_text": None, "details": None}
                    if s.finish:
                        self.succeed(s)
                        event["generated_text"] = (req.inputs if req.return_full_text else "") + s.text
                        details = {"finish_reason": s.finish, "generated_tokens": s.index, "seed": s.plan.seed}
                        event["details"] = details | {"input_length": s.plan.input_length} if req.details else None
                    yield event
        except TGIError as exc:
            yield self.fail(exc)

    def stream_headers(self, req: GenRequest) -> dict[str, str]:
        return {"x-compute-type": "gpu+optimized", "x-compute-characters": str(len(req.inputs))} | NO_BUFFERING

    async def native_sse(self, req: GenRequest, fault: str | None) -> AsyncGenerator[bytes]:
        async with aclosing(self.stream_internal(req, fault)) as events:
            async for ev in events:
                yield b":\n\n" if ev is None else sse(ev.body() if isinstance(ev, TGIError) else ev)

    async def openai_sse(self, reqs: list[GenRequest], fault: str | None, render: Render) -> AsyncGenerator[bytes]:
        """Chat/completions streams: ``render(i, event)`` gives the chunks; errors in OpenAI shape; then [DONE]."""
        for i, req in enumerate(reqs):  # the router interleaves several prompts; here they take turns
            async with aclosing(self.stream_internal(req, fault if i == 0 else None)) as events:
                async for ev in events:
                    if ev is None:
                        yield b":\n\n"
                    elif isinstance(ev, TGIError):
                        yield sse({"error": {"message": ev.message, "http_status_code": 422}})
                    else:
                        for chunk in render(i, ev):
                            yield sse(chunk)
        yield b"data:[DONE]\n\n"

    async def native(self, request: Request) -> Response:
        """/generate, /generate_stream and the compat route /."""
        path = request.url.path
        try:
            body = await read_json(request)
            req = GenRequest.parse(body, compat=path == "/")
        except BadBody as exc:
            return rejected(exc)
        self.record(path, body)
        if path == "/" and req.return_full_text is None:
            req.return_full_text = True  # the model's pipeline tag is text-generation
        fault = self.take_fault()
        if path == "/generate_stream" or (path == "/" and body.get("stream")):
            return SSEResponse(self.native_sse(req, fault), self.stream_headers(req))
        try:
            headers, _, out = await self.generate_internal(req, fault)
        except TGIError as exc:
            return json_response(exc.body(), STATUS.get(exc.kind, 500))
        return json_response([out] if path == "/" else out, headers=headers)

    async def chat(self, request: Request) -> Response:
        try:
            body, tools, choice, fmt = await read_chat(request)
        except BadBody as exc:
            return rejected(exc)
        opts = body.get("stream_options", {})
        self.record("/v1/chat/completions", body)
        self.count("tgi_request_count")
        model = self.model_id if body.get("model") in (None, "tgi") else body["model"]
        call_id, logprobs = next_tool_call_id(body["messages"]), bool(body.get("logprobs"))
        try:
            req, using_tools = self.chat_request(body, tools, choice, fmt)
        except TGIError as exc:
            return json_response((self.fail(exc) if exc.kind == "template_error" else exc).body(), 422)
        fault = self.take_fault()
        head = {"id": "", "created": int(time.time()), "model": model, "system_fingerprint": FINGERPRINT}
        if body.get("stream"):
            state = ChatState(using_tools, bool(opts.get("include_usage")), head, logprobs, call_id)
            return SSEResponse(self.chat_sse(body, req, state, fault), self.stream_headers(req))
        try:
            headers, n_in, out = await self.generate_internal(req, fault)
            calls = None
            if using_tools:
                called = parse_call(out["generated_text"])
                if called is None:
                    why = f"Failed to parse generated text: {json.dumps(out['generated_text'])}"
                    raise TGIError("tool_error", why)
                if called[0] == "no_tool":  # generated again without tools, as TGI does
                    headers, n_in, out = await self.generate_internal(
                        self.chat_request(body, None, "none", None)[0], None
                    )
                else:
                    function = {"description": None, "name": called[0], "arguments": dumps(called[1])}
                    calls = [{"id": "0", "type": "function", "function": function}]
        except TGIError as exc:
            return json_response(exc.body(), STATUS.get(exc.kind, 500))
        d = out["details"]
        message = {"role": "assistant"} | ({"tool_calls": calls} if calls else {"content": out["generated_text"]})
        lp = chat_logprobs(d["tokens"], d.get("top_tokens", [])) if logprobs else None
        choice_out = {"index": 0, "message": message, "logprobs": lp, "finish_reason": openai_finish(d)}
        answer = {"object": "chat.completion"} | head | {"choices": [choice_out], "usage": usage(n_in, d)}
        return json_response(answer, headers=headers)

    def chat_request(
        self,
        body: dict[str, Any],
        tools: list[dict[str, Any]] | None,
        choice: str | tuple[str, str],
        fmt: dict[str, Any] | None,
    ) -> tuple[GenRequest, bool]:
        """ChatRequest::try_into_generate: the generate request and whether it is using tools."""
        if fmt is not None and tools is not None:
            raise TGIError("tool_error", "Grammar and tools are mutually exclusive")
        grammar, shown = fmt, None
        if fmt is None and tools is not None:
            applied = tool_grammar(tools, choice)
            if applied is not None:
                shown, schema = applied
                grammar = {"type": "json", "value": schema}
        messages = [flatten(m) for m in body["messages"]]
        template_tools = None
        if shown is not None:
            # ChatTemplate::apply: a template that uses ``tools`` gets them (as serde writes them) and the
            # tool prompt goes after the last message; otherwise the tools' JSON goes there too.
            tool_prompt, as_json = body.get("tool_prompt") or DEFAULT_TOOL_PROMPT, [tool_json(t) for t in shown]
            if "tools" in (self.engine.chat_template or CHATML):
                template_tools, text = as_json, f"\n---\n{tool_prompt}"
            else:
                text = f"\n---\n{dumps(as_json)}\n{tool_prompt}"
            if messages and body["messages"][-1].get("content") is not None:  # a text body takes the push
                messages[-1]["content"] += text
        try:
            prompt_text = self.engine.render_chat(messages, template_tools)
        except Exception as exc:
            raise TGIError("template_error", f"Template error: {exc}") from None
        presence, max_tokens = body.get("presence_penalty"), body.get("max_tokens", body.get("max_completion_tokens"))
        req = oai_request(body, prompt_text, max_tokens, None if presence is None else presence + 2.0)
        req.top_n_tokens, req.grammar = body.get("top_logprobs"), grammar
        return req, shown is not None

    async def chat_sse(
        self, body: dict[str, Any], req: GenRequest, state: ChatState, fault: str | None
    ) -> AsyncGenerator[bytes]:
        """The chat stream: ChatState's chunks; on ``no_tool`` the request starts again without tools."""
        while True:
            again = None
            async with aclosing(self.stream_internal(req, fault)) as events:
                async for ev in events:
                    if ev is None:
                        yield b":\n\n"
                    elif isinstance(ev, TGIError):
                        yield sse({"error": {"message": ev.message, "http_status_code": 422}})
                    elif (chunks := state.push(ev)) is None:
                        again = self.chat_request(body, None, "none", None)[0]
                        break
                    else:
                        for chunk in chunks:
                            yield sse(chunk)
            if again is None:
                break
            req, fault = again, None
            state = ChatState(False, state.include_usage, state.head, state.logprobs, state.call_id)
        yield b"data:[DONE]\n\n"

    async def completions(self, request: Request) -> Response:
        try:
            body = check(await read_json(request), COMPLETION_SPEC, required=("prompt",))
            prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
            if not prompts or not all(isinstance(p, str) for p in prompts):
                why = "did not match any variant of untagged enum PromptDeserializer"
                raise BadBody(f"{DESERIALIZE}prompt: {'Empty array detected' if not prompts else why}")
        except BadBody as exc:
            return rejected(exc)
        self.record("/v1/completions", body)
        self.count("tgi_request_count")
        if body.get("suffix") is not None:
            msg = "Suffix is not supported and can be achieved by preprocessing the prompt."
            return json_response(self.fail(TGIError("suffix not supported", msg)).body(), 422)
        if len(prompts) > 4:
            msg = "Number of prompts exceeds the maximum allowed batch size of 4"
            return json_response(self.fail(TGIError("batch size exceeded", msg)).body(), 422)
        reqs = [oai_request(body, p, body.get("max_tokens"), body.get("repetition_penalty")) for p in prompts]
        fault, head = self.take_fault(), {"object": "text_completion", "id": "", "created": int(time.time())}
        tail = {"model": self.model_id, "system_fingerprint": FINGERPRINT}

        def render(i: int, ev: dict[str, Any]) -> list[dict[str, Any]]:
            d = ev["details"]  # the last event becomes a CompletionFinal whose finish reason stays unmapped
            choice = {"index": i, "text": ev["token"]["text"], "logprobs": None}
            choice["finish_reason"] = d["finish_reason"] if d else ""
            if d is None:
                return [head | {"choices": [choice]} | tail]
            return [head | tail | {"choices": [choice], "usage": usage(d["input_length"], d)}]

        if body.get("stream"):
            return SSEResponse(self.openai_sse(reqs, fault, render), self.stream_headers(reqs[0]))
        choices, totals = [], {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        for i, req in enumerate(reqs):
            try:
                _, n_in, out = await self.generate_internal(req, fault if i == 0 else None)
            except TGIError as exc:
                return json_response(exc.body(), STATUS.get(exc.kind, 500))
            totals = {k: totals[k] + v for k, v in usage(n_in, out["details"]).items()}
            finish = openai_finish(out["details"])
            choices.append({"index": i, "text": out["generated_text"], "logprobs": None, "finish_reason": finish})
        return json_response(head | tail | {"choices": choices, "usage": totals})

    def simple_tokens(self, text: str) -> list[dict[str, Any]]:
        """TokenizeResponse: one SimpleToken per id with its character span (``text`` is that span)."""
        enc = self.engine._tokenizer.encode(text, add_special_tokens=False)
        return [
            {"id": i, "text": text[start:stop], "start": start, "stop": stop}
            for i, (start, stop) in zip(enc.ids, enc.offsets, strict=True)
        ]

    async def tokenize(self, request: Request) -> Response:
        """server.rs tokenize: a GenerateRequest's ``inputs`` tokenized by the router's tokenizer."""
        try:
            req = GenRequest.parse(await read_json(request), compat=False)
        except BadBody as exc:
            return rejected(exc)
        return json_response(self.simple_tokens(req.inputs))

    async def chat_tokenize(self, request: Request) -> Response:
        """server.rs get_chat_tokenize: the ChatRequest made into its generate request (template, tools and
        tool prompt as the chat route makes them), its inputs tokenized."""
        try:
            body, tools, choice, fmt = await read_chat(request)
        except BadBody as exc:
            return rejected(exc)
        self.count("tgi_request_count")
        try:
            req, _ = self.chat_request(body, tools, choice, fmt)
        except TGIError as exc:
            return json_response(exc.body(), 422)
        return json_response({"tokenize_response": self.simple_tokens(req.inputs), "templated_text": req.inputs})

    async def health(self, request: Request) -> Response:
        if self.control.healthy:
            return Response(status_code=200)
        return json_response({"error": "unhealthy", "error_type": "healthcheck"}, 503)

    async def info(self, request: Request) -> Response:
        info: dict[str, Any] = {"model_id": self.model_id, "model_sha": None, "model_pipeline_tag": "text-generation"}
        info |= {"max_concurrent_requests": 128, "max_best_of": 2, "max_stop_sequences": 4}
        info |= {"max_input_tokens": self.max_input, "max_total_tokens": self.max_total, "validation_workers": 2}
        info |= {"max_client_batch_size": 4, "router": "text-generation-router", "version": VERSION}
        return json_response(info | {"sha": None, "docker_label": None})

    async def models(self, request: Request) -> Response:
        model = {"id": self.model_id, "object": "model", "created": 0, "owned_by": self.model_id}
        return json_response({"object": "list", "data": [model]})

    async def metrics(self, request: Request) -> Response:
        """metrics-exporter-prometheus text: counters keep their bare names; a blank line ends each family."""
        out: list[str] = []
        for name in sorted({n for n, _ in self.counters}):
            samples = [
                f'{n}{{err="{lab}"}} {v}' if lab else f"{n} {v}" for (n, lab), v in self.counters.items() if n == name
            ]
            out += [f"# TYPE {name} counter", *samples, ""]
        for name, value in (("tgi_batch_current_size", self.engine.active_streams), ("tgi_queue_size", self.queued)):
            out += [f"# TYPE {name} gauge", f"{name} {value}", ""]
        for name, hist in sorted(self.hists.items()):
            out += hist.lines(name) if hist.count else []
        return PlainTextResponse("\n".join(out) + "\n")


Render = Callable[[int, dict[str, Any]], list[dict[str, Any]]]


class SSEResponse(StreamingResponse):
    """axum's Sse headers; the generator (so the engine stream) is closed however the response ends."""

    def __init__(self, gen: AsyncGenerator[bytes], headers: dict[str, str]) -> None:
        super().__init__(gen, headers={"content-type": "text/event-stream", "cache-control": "no-cache"} | headers)
        self.gen = gen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.gen.aclose()


def tool_json(tool: dict[str, Any]) -> dict[str, Any]:
    """A Tool as serde writes it: FunctionDefinition's ``arguments`` serialized as a JSON string."""
    fn = tool["function"]
    return {"type": tool["type"], "function": fn | {"arguments": dumps(fn["arguments"])}}


def flatten(message: Any) -> dict[str, Any]:
    """TextMessage::from(Message): text chunks joined, images as markdown links, tool calls as JSON."""
    content = message.get("content")
    if content is None and message.get("tool_calls") is not None:
        calls = [
            c | {"function": c["function"] | {"arguments": dumps(c["function"].get("arguments"))}}
            for c in message["tool_calls"]
        ]
        content = dumps(calls)
    if isinstance(content, list):
        parts = (c.get("text", "") if c.get("type") == "text" else f"![]({c['image_url']['url']})" for c in content)
        content = "".join(parts)
    return {"role": message["role"], "content": content or ""}


def openai_finish(details: dict[str, Any]) -> str:
    return "stop" if details["finish_reason"] == "eos_token" else str(details["finish_reason"])


def usage(prompt_tokens: int, details: dict[str, Any]) -> dict[str, int]:
    n = details["generated_tokens"]
    return {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}


def create_app(
    engine: TinyEngine,
    control: FakeControl,
    *,
    model_id: str = "enginegate-demo",
    max_input_tokens: int = 1024,
    max_total_tokens: int = 2048,
    received: list[tuple[str, Any]] | None = None,
    auto_tool_call: bool = False,
) -> ASGIApp:
    """The fake's app; ``received`` collects (path, body) of every generation request it parsed."""
    tgi = FakeTGI(engine, control, model_id, max_input_tokens, max_total_tokens, received, auto_tool_call)
    posts = {"/": tgi.native, "/generate": tgi.native, "/generate_stream": tgi.native}
    posts |= {"/v1/chat/completions": tgi.chat, "/v1/completions": tgi.completions}
    posts |= {"/tokenize": tgi.tokenize, "/chat_tokenize": tgi.chat_tokenize}
    gets = {"/": tgi.health, "/health": tgi.health, "/ping": tgi.health, "/info": tgi.info}
    gets |= {"/v1/models": tgi.models, "/metrics": tgi.metrics}
    routes = [Route(p, f, methods=["POST"]) for p, f in posts.items()]
    return with_faults(Starlette(routes=routes + [Route(p, f, methods=["GET"]) for p, f in gets.items()]), control)
