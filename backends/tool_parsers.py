"""The tool-call formats' parsers (``hermes``, ``llama3_json``, ``mistral``): text deltas in, content and
``ToolCallDelta``s out. ``backends.tool_calls`` picks one per model and applies it to a chunk stream;
the formats are described there. Pure: no I/O; work per ``feed`` is linear in the new text.
"""

from __future__ import annotations

import json
import random
import secrets
import string
from typing import Any

from backends.base import ToolCallDelta

_ID_ALPHABET = string.ascii_letters + string.digits


def _held_prefix(text: str, tag: str) -> int:
    """How many of ``text``'s last characters are a proper prefix of ``tag`` (could still become it)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _call(obj: Any) -> tuple[str, dict[str, Any]] | None:
    """(name, arguments) of one call object, or None when it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return (obj["name"], args) if isinstance(args, dict) else None


def _json_values(text: str) -> list[Any] | None:
    """The JSON values ``text`` consists of, separated by whitespace or ``;``; None if it is not that."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t\r\n;":
            i += 1
        if i == n:
            return values or None
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        values.append(value)


class _Base:
    """Call ids and numbering, and the content around calls: whitespace that ends content is held
    (dropped when a call follows, the way templates render ``content\\n<tool_call>``), and
    whitespace that follows a call is dropped."""

    def __init__(self, seed: int | None) -> None:
        self.called = False
        self.over = False
        self._rng = random.Random(seed) if seed is not None else None
        self._index = 0
        self._ws = ""
        self._after_call = False

    def _id(self) -> str:
        if self._rng is not None:
            return "call_" + "".join(self._rng.choice(_ID_ALPHABET) for _ in range(24))
        return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))

    def _deltas(self, name: str, arguments: dict[str, Any]) -> list[ToolCallDelta]:
        index = self._index
        self._index += 1
        self.called = True
        self._after_call = True
        self._ws = ""
        first = ToolCallDelta(index=index, id=self._id(), name=name, arguments="")
        return [first, ToolCallDelta(index=index, arguments=json.dumps(arguments, ensure_ascii=False))]

    def _content(self, piece: str) -> str:
        if not piece:
            return ""
        text = self._ws + piece
        if self._after_call:
            text = text.lstrip()
        body = text.rstrip()
        self._ws = text[len(body) :]
        if body:
            self._after_call = False
        return body

    def _end(self) -> str:
        """Held whitespace at the end of the answer: content when no call was made."""
        ws, self._ws = self._ws, ""
        return "" if self.called else ws


class _ObjectEnd:
    """Where a JSON object that text begins with ends, found incrementally: each character is read
    once (strings and escapes tracked, nesting counted), so a call is known complete the moment its
    closing brace arrives, without its end tag. ``bad`` when the text does not start an object."""

    def __init__(self) -> None:
        self.depth = 0
        self.bad = False
        self._string = False
        self._escape = False

    def feed(self, text: str) -> int:
        """The index in ``text`` just past the object's closing brace, or -1 (not yet, or ``bad``)."""
        for i, c in enumerate(text):
            if self.bad:
                return -1
            if self._string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._string = False
            elif self.depth == 0:
                if c == "{":
                    self.depth = 1
                elif not c.isspace():
                    self.bad = True
            elif c == '"':
                self._string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return -1


class HermesParser(_Base):
    """Hermes calls, read the way llama.cpp's lazy tool-call grammar lets a model write them: once
    ``<tool_call>`` opens, the call is one JSON object; it counts from its closing brace (the end tag
    may be cut by a stop); after it only whitespace, the end tag and further calls may follow. Text a
    model writes there instead (a small model may not close the tag) ends the answer (``over``): it is
    dropped, as llama.cpp's grammar would never let it be generated and vLLM's parser drops text after
    calls. A body that is not an object is the model's text, without the tags."""

    START, END = "<tool_call>", "</tool_call>"

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(seed)
        self._held = ""  # the start of a tag, maybe
        self._inside = False
        self._body: list[str] = []
        self._object = _ObjectEnd()
        self._calls_only = False  # a call is complete: only tags and whitespace may follow

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        if self.over:
            return "", []
        data, self._held = self._held + text, ""
        out: list[str] = []
        calls: list[ToolCallDelta] = []
        while data and not self.over:
            if self._calls_only:
                data = self._between_calls(data)
                continue
            if not self._inside:
                data = self._outside(data, out)
                continue
            at = data.find(self.END)
            piece = data if at < 0 else data[:at]
            if at < 0:
                keep = _held_prefix(data, self.END)
                self._held = data[len(data) - keep :]
                piece = data[: len(data) - keep]
            end = self._object.feed(piece)
            if end >= 0 and self._complete("".join(self._body) + piece[:end], calls):
                data = piece[end:] + self._held + (data[at:] if at >= 0 else "")
                self._held = ""
                continue
            self._body.append(piece)
            if at < 0:
                break
            self._close(out, calls)
            data = data[at + len(self.END) :]
        return "".join(out), calls

    def _outside(self, data: str, out: list[str]) -> str:
        """Content up to the next tag, sent; what follows the tag returned. A start tag opens a call;
        an end tag with no call open is dropped (a sampled model may write one among its text, and
        tag text is never content); a tag's first characters at the end are held."""
        start, end = data.find(self.START), data.find(self.END)
        if start < 0 and end < 0:
            keep = max(_held_prefix(data, self.START), _held_prefix(data, self.END))
            self._held = data[len(data) - keep :]
            out.append(self._content(data[: len(data) - keep]))
            return ""
        opens = start >= 0 and (end < 0 or start < end)
        at, tag = (start, self.START) if opens else (end, self.END)
        out.append(self._content(data[:at]))
        self._inside = opens  # held whitespace before a start tag goes if a call follows, else it is content
        return data[at + len(tag) :]

    def _complete(self, body: str, calls: list[ToolCallDelta]) -> bool:
        """The call whose object ``body`` ends with, emitted; False when the object is not a call."""
        values = _json_values(body)
        call = _call(values[0]) if values is not None and len(values) == 1 else None
        if call is None:
            self._object.bad = True  # not a call: the body is read to the end tag as text
            return False
        calls.extend(self._deltas(*call))
        self._reset_call()
        self._calls_only = True
        return True

    def _between_calls(self, data: str) -> str:
        """After a complete call: whitespace and end tags are skipped, a start tag opens the next call,
        a tag's first characters are held, and anything else ends the answer."""
        rest = data.lstrip()
        for tag in (self.END, self.START):
            if rest.startswith(tag):
                if tag == self.START:
                    self._calls_only, self._inside = False, True
                return rest[len(tag) :]
            if tag.startswith(rest):
                self._held = rest
                return ""
        if rest:
            self.over = True
        return ""

    def _reset_call(self) -> None:
        self._body = []
        self._inside = False
        self._object = _ObjectEnd()

    def _close(self, out: list[str], calls: list[ToolCallDelta]) -> None:
        body = "".join(self._body)
        self._reset_call()
        values = _json_values(body)
        call = _call(values[0]) if values is not None and len(values) == 1 else None
        if call is None:  # not a call after all: the model's text, without any tags
            out.append(self._content(body.replace(self.START, "").replace(self.END, "")))
        else:
            calls.extend(self._deltas(*call))

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        out: list[str] = []
        calls: list[ToolCallDelta] = []
        held, self._held = self._held, ""
        if self.over or self._calls_only:
            pass  # a tag's first characters after a call: nothing to send
        elif self._inside:  # no end tag: a complete call still counts (the stop may have cut the tag)
            self._body.append(held)
            self._close(out, calls)
        else:
            out.append(self._content(held))
        out.append(self._end())
        return "".join(out), calls


class Llama3JsonParser(_Base):
    """The answer is either calls from its first character on, or content: the first characters decide."""

    TAG = "<|python_tag|>"

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(seed)
        self._mode = "start"  # then "json" (buffered to the end) or "text" (passed through)
        self._buf: list[str] = []

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        if self._mode == "text":
            return text, []
        self._buf.append(text)
        if self._mode == "json":
            return "", []
        head = "".join(self._buf)
        lead = head.lstrip()
        if not lead or (len(lead) < len(self.TAG) and self.TAG.startswith(lead)):
            return "", []  # still undecided
        self._buf = [head]
        if lead.startswith((self.TAG, "{")):
            self._mode = "json"
            return "", []
        self._mode = "text"
        self._buf = []
        return head, []

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        text = "".join(self._buf)
        self._buf = []
        if self._mode != "json":
            return text, []
        body = text.lstrip().removeprefix(self.TAG)
        values = _json_values(body)
        found = [_call(v) for v in values] if values is not None else [None]
        if any(c is None for c in found):
            return body, []
        calls = [d for c in found if c is not None for d in self._deltas(*c)]
        return "", calls


class MistralParser(_Base):
    TAG, ARGS = "[TOOL_CALLS]", "[ARGS]"

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(seed)
        self._held = ""
        self._calls: list[str] | None = None  # text after the tag, buffered to the end

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        if self._calls is not None:
            self._calls.append(text)
            return "", []
        data, self._held = self._held + text, ""
        at = data.find(self.TAG)
        if at >= 0:
            self._calls = [data[at + len(self.TAG) :]]
            return self._content(data[:at]), []
        keep = _held_prefix(data, self.TAG)
        self._held = data[len(data) - keep :]
        return self._content(data[: len(data) - keep]), []

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        if self._calls is None:
            held, self._held = self._held, ""
            return self._content(held) + self._end(), []
        body = "".join(self._calls)
        self._calls = None
        found = self._parse(body)
        if found is None:
            return self._content(body.replace(self.TAG, "")) + self._end(), []
        return "", [d for name, args in found for d in self._deltas(name, args)]

    def _parse(self, body: str) -> list[tuple[str, dict[str, Any]]] | None:
        found: list[tuple[str, dict[str, Any]]] = []
        for part in body.split(self.TAG):
            if not part.strip():
                continue
            if self.ARGS in part:  # v11+: name[ARGS]{json}
                name, _, raw = part.partition(self.ARGS)
                values = _json_values(raw)
                if values is None or len(values) != 1:
                    return None
                call = _call({"name": name.strip(), "arguments": values[0]})
                if call is None:
                    return None
                found.append(call)
                continue
            values = _json_values(part)
            if values is None:
                return None
            for value in values:
                for item in value if isinstance(value, list) else [value]:
                    call = _call(item)
                    if call is None:
                        return None
                    found.append(call)
        return found or None
