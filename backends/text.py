"""Text helpers every engine family needs: chat templates, prompt work sized off the loop, stop strings."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from backends.base import GenerationRequest

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# Without the model's tokenizer at hand: about four characters per token for English text.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """Tokens in ``text`` for engines that never say; an estimate, used only where no count exists."""
    return len(text) // CHARS_PER_TOKEN + 1


# Prompts up to this many characters are rendered and tokenized inline: about 0.1 ms of work, less
# than a hop to a thread costs. Bigger ones (a 100 kB prompt tokenizes in ~150 ms) go to a thread.
INLINE_PROMPT_CHARS = 8192

T = TypeVar("T")


def prompt_chars(request: GenerationRequest) -> int:
    if request.messages is not None:
        return sum(len(str(m.get("content") or "")) for m in request.messages)
    return len(request.prompt or "")


async def sized_work(request: GenerationRequest, work: Callable[[GenerationRequest], T]) -> T:
    """``work(request)`` (template rendering, tokenizing: CPU only) inline for a small prompt, else
    in a thread so the event loop keeps serving other requests meanwhile."""
    if prompt_chars(request) <= INLINE_PROMPT_CHARS:
        return work(request)
    return await asyncio.to_thread(work, request)


class ChatRenderer:
    """Renders messages with a model's chat template (ChatML when it has none), for engines that take text."""

    def __init__(self, template: str | None) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._template = env.from_string(template or CHATML)

    def render(self, messages: list[dict[str, Any]]) -> str:
        return self._template.render(messages=messages, add_generation_prompt=True)


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
                cut = start if cut < 0 else min(cut, start)
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
