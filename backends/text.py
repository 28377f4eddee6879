"""Text helpers every engine family needs: chat templates, prompt work sized off the loop, stop strings."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from backends.base import BackendError, ErrorKind, GenerationRequest

# ChatML, with tools rendered as Qwen2.5's template renders them (Hermes-style <tool_call> answers):
# the template for models that bring none, and the demo model's own. Without tools a conversation
# renders as plain ChatML. One line on purpose: no literal whitespace outside the tags, so engines
# with or without trim_blocks/lstrip_blocks (jinja2, transformers, llama.cpp's minja) agree byte for byte.
# Each tool is written field by field rather than ``tool | tojson``: engines re-serialise tools
# differently (vLLM adds ``"description": null``, llama-server ``"description": ""``).
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTSCRIPT = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)


def _jinja_str(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


CHATML = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}"
    "{{- " + _jinja_str(TOOLS_PREAMBLE) + " -}}"
    "{%- for tool in tools -%}"
    "{%- if tool.function is defined -%}{%- set tool = tool.function -%}{%- endif -%}"
    '{{- \'\\n{"type": "function", "function": {"name": \' + (tool.name | tojson) -}}'
    "{%- if tool.description -%}{{- ', \"description\": ' + (tool.description | tojson) -}}{%- endif -%}"
    "{%- if tool.parameters is defined and tool.parameters is not none -%}"
    "{{- ', \"parameters\": ' + (tool.parameters | tojson) -}}{%- endif -%}"
    "{{- '}' + '}' -}}"
    "{%- endfor -%}"
    "{{- " + _jinja_str(TOOLS_POSTSCRIPT + "<|im_end|>\n") + " -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' and loop.first and tools -%}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif message.role == 'assistant' and message.tool_calls -%}"
    "{{- '<|im_start|>assistant' -}}"
    "{%- if message.content -%}{{- '\\n' + message.content -}}{%- endif -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- if call.function is defined -%}{%- set call = call.function -%}{%- endif -%}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' -}}'
    "{%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


# Without the model's tokenizer at hand: about four characters per token for English text.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """Tokens in ``text`` for engines that never say; an estimate, used only where no count exists."""
    return estimate_for(len(text))


def estimate_for(chars: int) -> int:
    """``estimate_tokens`` of a text of ``chars`` characters."""
    return chars // CHARS_PER_TOKEN + 1


# Prompts up to this many characters are rendered and tokenized inline: about 0.1 ms of work, less
# than a hop to a thread costs. Bigger ones (a 100 kB prompt tokenizes in ~150 ms) go to a thread.
INLINE_PROMPT_CHARS = 8192

T = TypeVar("T")


def prompt_chars(request: GenerationRequest) -> int:
    if request.messages is not None:
        chars = sum(len(str(m.get("content") or "")) for m in request.messages)
        return chars + len(str(request.tools)) if request.tools else chars  # tools render into the prompt too
    return len(request.prompt or "")


async def sized_work(request: GenerationRequest, work: Callable[[GenerationRequest], T]) -> T:
    """``work(request)`` (template rendering, tokenizing: CPU only) inline for a small prompt, else
    in a thread so the event loop keeps serving other requests meanwhile."""
    if prompt_chars(request) <= INLINE_PROMPT_CHARS:
        return work(request)
    return await asyncio.to_thread(work, request)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, sort_keys: bool = False) -> str:
    """transformers' ``tojson``: json.dumps as it is. Jinja's own sorts keys and escapes ``<>&'``, which
    would render tools differently from every engine that applies the same template."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


def _plain(messages: list[dict[str, Any]]) -> bool:
    return all(type(m.get("content")) is str and "tool_calls" not in m for m in messages)


def _arguments(raw: Any) -> Any:
    """A tool call's arguments as templates expect them (a mapping), from OpenAI's JSON string."""
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except ValueError:
            return raw  # not JSON: the template prints the string as it is
        return parsed if isinstance(parsed, dict) else raw
    return raw


def _call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, dict) or "arguments" not in function:
        return call
    return {**call, "function": {**function, "arguments": _arguments(function["arguments"])}}


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI message as Hugging Face chat templates expect it: content a string (None is "", text
    parts joined by newlines as vLLM and llama-server join them; parts with images stay a list) and
    assistant tool calls' arguments a mapping."""
    content = message.get("content")
    out = message
    if content is None:
        out = {**message, "content": ""}
    elif isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        out = {**message, "content": "\n".join(str(p.get("text", "")) for p in content)}
    calls = message.get("tool_calls")
    if calls:
        out = {**out, "tool_calls": [_call(c) if isinstance(c, dict) else c for c in calls]}
    return out


class ChatRenderer:
    """Renders messages (and tools) with a model's chat template, ChatML when it has none, for engines
    that take text."""

    def __init__(self, template: str | None) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson
        self._template = env.from_string(template or CHATML)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        continue_final: bool = False,
    ) -> str:
        """The prompt for ``messages`` with the generation prompt appended; ``tools`` are OpenAI function
        tools, passed to the template as ``tools`` the way transformers passes them. ``continue_final``:
        the last message (the assistant's) is left open for the answer to continue (``open_final``)."""
        final = messages[-1].get("content") if continue_final and messages else None
        if continue_final and final:
            shown = [template_message(m) for m in messages]
            text = self._template.render(
                messages=shown, tools=list(tools) if tools else None, add_generation_prompt=False
            )
            return open_final(text, shown[-1].get("content"))
        if not tools and _plain(messages):  # the common request: nothing to copy
            return self._template.render(messages=messages, add_generation_prompt=True)
        return self._template.render(
            messages=[template_message(m) for m in messages],
            tools=list(tools) if tools else None,
            add_generation_prompt=True,
        )


def open_final(rendered: str, content: Any) -> str:
    """``rendered`` cut just after the final message's text, so its end-of-turn and whatever the template
    writes after it are gone: the rule of transformers' ``continue_final_message``, which vLLM applies
    too (a template that trims the text is matched by the trimmed text)."""
    if isinstance(content, list):  # parts with images: the last text part ends the message
        texts = [str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"]
        content = texts[-1] if texts else ""
    text = str(content or "")
    for wanted in (text, text.strip()):
        at = rendered.rfind(wanted) if wanted else -1
        if at >= 0:
            return rendered[: at + len(wanted)]
    raise BackendError(
        ErrorKind.BAD_REQUEST,
        "The final assistant message cannot be continued: the chat template does not show its text.",
        param="messages",
    )


class _Prefix:
    """Incremental Knuth-Morris-Pratt matcher for one stop string: ``state`` is how many of its first
    characters the text seen so far ends with. Its failure table grows only as far as ``state`` has
    reached, so a 100 KB stop costs nothing until generated text actually follows it."""

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.state = 0
        self._fail: list[int] = []

    def _fail_at(self, q: int) -> int:
        """Longest proper border of ``stop[:q]`` (q >= 1), extending the table on demand."""
        s, fail = self.stop, self._fail
        while len(fail) < q:
            i = len(fail)
            k = fail[i - 1] if i else 0
            while k and s[i] != s[k]:
                k = fail[k - 1]
            fail.append(k + 1 if i and s[i] == s[k] else 0)
        return fail[q - 1]

    def scan(self, text: str) -> int:
        """Advance over ``text``; the index in ``text`` just past the first complete match, or -1."""
        s, q, m, first = self.stop, self.state, len(self.stop), self.stop[0]
        i, n = 0, len(text)
        while i < n:
            if q == 0:  # nothing matched: skip in C to the next place the stop could begin
                i = text.find(first, i)
                if i < 0:
                    break
            c = text[i]
            while q and s[q] != c:
                q = self._fail_at(q)
            if s[q] == c:
                q += 1
            i += 1
            if q == m:
                self.state = 0
                return i
        self.state = q
        return -1


class StopStrings:
    """Cuts streamed text at the first stop string; holds back what may still become one.

    Work per ``feed`` is linear in the new text (times the number of stops) plus at most the held
    text, never the square of a stop's length: long stops cannot stall the event loop."""

    def __init__(self, stop: Iterable[str]) -> None:
        self._stop = tuple(_Prefix(s) for s in dict.fromkeys(stop) if s) if stop else ()
        self._held = ""
        self.stopped = False
        self.matched: str | None = None
        """The stop string that ended the text (the one that begins first), once ``stopped``."""

    def feed(self, text: str) -> str:
        """Text that may be sent now; sets ``stopped`` when a stop string completes."""
        if self.stopped:
            return ""
        if not self._stop:
            return text
        held = self._held
        cut = -1  # where in held + text the earliest complete stop begins
        for p in self._stop:
            end = p.scan(text)
            if end >= 0:
                start = len(held) + end - len(p.stop)
                if cut < 0 or start < cut:
                    cut, self.matched = start, p.stop
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return (held + text)[:cut]
        keep = max(p.state for p in self._stop)  # every state is at most len(held) + len(text)
        if keep <= len(text):
            self._held = text[len(text) - keep :]
            return held + text[: len(text) - keep]
        window = held + text
        self._held = window[len(window) - keep :]
        return window[: len(window) - keep]

    def flush(self) -> str:
        """At the end of generation: whatever was held back is plain text after all."""
        out, self._held = ("" if self.stopped else self._held), ""
        for p in self._stop:
            p.state = 0
        return out
