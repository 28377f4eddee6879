"""Text helpers every engine family needs: chat templates and stop strings on streamed text."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# Without the model's tokenizer at hand: about four characters per token for English text.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """Tokens in ``text`` for engines that never say; an estimate, used only where no count exists."""
    return len(text) // CHARS_PER_TOKEN + 1


class ChatRenderer:
    """Renders messages with a model's chat template (ChatML when it has none), for engines that take text."""

    def __init__(self, template: str | None) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._template = env.from_string(template or CHATML)

    def render(self, messages: list[dict[str, Any]]) -> str:
        return self._template.render(messages=messages, add_generation_prompt=True)


class StopStrings:
    """Cuts streamed text at the first stop string; holds back what may still become one."""

    def __init__(self, stop: Iterable[str]) -> None:
        self._stop = tuple(s for s in stop if s)
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Text that may be sent now; sets ``stopped`` when a stop string completes."""
        self._held += text
        if not self._stop:
            out, self._held = self._held, ""
            return out
        cut = min((i for i in (self._held.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self._held = self._held[:cut], ""
            return out
        keep = max((k for s in self._stop for k in range(1, len(s)) if self._held.endswith(s[:k])), default=0)
        cut = len(self._held) - keep
        out, self._held = self._held[:cut], self._held[cut:]
        return out

    def flush(self) -> str:
        """At the end of generation: whatever was held back is plain text after all."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out
