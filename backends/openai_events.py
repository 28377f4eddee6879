"""An OpenAI-compatible engine's stream events, with the usual one read without parsing it.

Most of a stream's events are a delta of text alone, and within one stream they differ only in that
text: vLLM's ``{"id":"chatcmpl-..","object":"chat.completion.chunk","created":..,"model":"..",
"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}``. Once
one such event was parsed, ``TextTemplate`` keeps what came before and after its text; a later event
with the same bytes around a single JSON string is that event with another text, so only the string
is read (its bytes decoded as they are where nothing in it is escaped, else parsed by ``orjson``), not
a document of three dicts. Anything else (another shape, another choice, the finish, usage, an engine
that changes a field per event) is parsed whole, as before. Such an
event as the wire brings it (``data: ``, the event, a blank line: what an engine writes per token,
alone in a read when decode-paced, a run of them in one read when they came in a burst) is read from
the read's bytes, without the SSE parser and without decoding them first (``EventBatches._scan``).

Written here rather than taken from a library: no JSON library reads "this document, but for one
string" (orjson and the standard library parse whole documents; a streaming parser costs more per
event than orjson's whole parse).
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from backends.base import EngineClock
from backends.event_batches import EventBatches, EventSource
from backends.httpclient import Response
from backends.sse import Event
from values.calls import json_dumps, json_loads

_PROBE: Final = "\x00enginegate-probe\x00"
_PROBE_JSON: Final = json_dumps(_PROBE).decode()
_PLAIN: Final = bytes(0 if byte < 0x20 or byte in b'"\\' else 1 for byte in range(256))
"""A ``bytes.translate`` table: a string's bytes that JSON writes as they are to 1, the rest to NUL."""


def text_alone(choice: Any) -> str | None:
    """The text of a stream chunk's choice that is a delta of text alone (no finish, tool calls,
    logprobs or stop reason), else None: read as ``parse_choice`` would read it, without its record."""
    if not isinstance(choice, dict):
        return None
    delta = choice.get("delta")
    if not isinstance(delta, dict) or choice.get("finish_reason") or choice.get("logprobs") is not None:
        return None
    content = delta.get("content")
    if type(content) is not str or not content or delta.get("tool_calls") or choice.get("stop_reason") is not None:
        return None
    return content


def lone_text(doc: dict[str, Any]) -> str | None:
    """The text of a stream chunk that is one delta of text alone (of any choice), with no usage."""
    choices = doc.get("choices")
    if type(choices) is not list or len(choices) != 1 or doc.get("usage") is not None:
        return None
    return text_alone(choices[0])


def first_text(doc: dict[str, Any]) -> str | None:
    """``lone_text`` of choice 0: what a ``TextTemplate`` reads."""
    text = lone_text(doc)
    return text if text is not None and not doc["choices"][0].get("index") else None


class TextTemplate:
    """The bytes around one stream's text deltas (see the module)."""

    __slots__ = ("after", "before", "least", "wire_after", "wire_before")

    def __init__(self, before: str, after: str) -> None:
        self.before = before
        self.after = after
        self.least = len(before) + len(after) + 2  # the shortest event it reads: an empty string
        # The event's line as the network brings it (``data: ``, without its line break); none (b"") where the
        # event's data spans lines, which the wire would not show as they are here.
        wire = "\n" not in before and "\n" not in after
        self.wire_before = b"data: " + before.encode() if wire else b""
        self.wire_after = after.encode() if wire else b""

    @staticmethod
    def learn(data: str, doc: dict[str, Any], text: str) -> TextTemplate | None:
        """The template of event ``data`` (parsed: ``doc``, a delta of ``text`` alone of choice 0, as
        ``first_text`` reads it), or None where the text is not found once, as this encoder writes it,
        right after the delta's key, or where another string there would not be read as the delta's
        text."""
        encoded = json_dumps(text).decode()
        at = data.find(encoded)
        if at < 0 or data.find(encoded, at + 1) >= 0:
            return None
        before = data[:at]
        if not before.rstrip().endswith('"content":'):
            return None
        template = TextTemplate(before, data[at + len(encoded) :])
        try:  # the same event with another text must read as exactly that: nothing else moved
            probe = json_loads(before + _PROBE_JSON + template.after)
        except orjson.JSONDecodeError:
            return None
        delta = doc["choices"][0]["delta"]
        delta["content"] = _PROBE  # the document with the probe's text, compared, then as it was
        same = probe == doc
        delta["content"] = text
        return template if same else None

    def read(self, data: str) -> str | None:
        """The text of an event that is this template around one JSON string (not empty); else None."""
        before, after = self.before, self.after
        if len(data) < self.least or not data.startswith(before) or not data.endswith(after):
            return None
        middle = data[len(before) : len(data) - len(after)]
        if middle[:1] != '"':
            return None
        try:
            text = json_loads(middle)
        except orjson.JSONDecodeError:  # more than one string: another document, parsed whole
            return None
        return text if type(text) is str and text else None

    def read_event(self, line: bytes, texts: list[Any]) -> bool:
        """Whether the event of one line ``line`` (as the wire brings it, without its line break) is this
        template around one JSON string (not empty), its text then added to ``texts``. The event is not
        decoded: only its string is parsed."""
        before, after = self.wire_before, self.wire_after
        if not before or len(line) < len(before) + len(after) + 2 or not line.startswith(before):
            return False
        if not line.endswith(after):
            return False
        start, end = len(before), len(line) - len(after)
        if line[start] != 34:  # a quote
            return False
        if line[end - 1] == 34 and end - start > 2:
            inner = line[start + 1 : end - 1]
            if 0 not in inner.translate(_PLAIN):  # no quote, backslash or control (0: see values.calls)
                try:
                    text = inner.decode()
                except UnicodeDecodeError:  # as orjson: parsed whole, decoded with replacements
                    return False
                texts.append(text)
                return True
        middle = line[start:end]
        try:
            text = json_loads(middle)
        except orjson.JSONDecodeError:  # more than one string, or bytes that are not UTF-8: parsed whole
            return False
        if type(text) is not str or not text:
            return False
        texts.append(text)
        return True


class TextBatches(EventBatches):
    """``EventBatches`` of an OpenAI-compatible stream in which a delta of text alone of choice 0 comes
    as its text (a ``str``) instead of its document, once one such event taught its ``TextTemplate``."""

    def __init__(self, source: EventSource, response: Response, clock: EngineClock, trust_status: bool) -> None:
        super().__init__(source, response, clock, trust_status)
        self._template: TextTemplate | None = None
        self._learning = True  # one try per stream: an engine that does not fit costs one attempt

    def _wire_item(self, line: bytes, batch: list[Any]) -> bool:
        template = self._template
        return template is not None and template.read_event(line, batch)

    def _item(self, event: Event) -> Any:
        template = self._template
        if template is not None and event.field == "data":
            text = template.read(event.data)
            if text is not None:
                return text
        doc = self._doc(event)
        if self._learning:
            text = first_text(doc)
            if text is not None:
                self._learning = False
                self._template = TextTemplate.learn(event.data, doc, text)
        return doc
