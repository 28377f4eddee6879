"""Token ids to text and logprobs for the in-process engines (``backends.inproc``), on the event loop.

- ``TextAssembler`` maps ids to bytes with llama.cpp's piece rules, decodes UTF-8 incrementally, and
  holds back text that may still become a stop string (``StopStrings``), so no engine streams half a
  character or part of a stop.
- ``LogprobMaker`` turns an engine's per-step numbers into OpenAI's logprobs on the worker thread (a
  log-softmax over the vocabulary is CPU work: never the event loop's).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from functools import cached_property
from typing import TYPE_CHECKING

from backends.base import TokenLogprob, TopLogprob
from backends.gguf_vocab import TOKEN_BYTE, TOKEN_NORMAL, TOKEN_USER_DEFINED, Vocabulary
from backends.text import StopStrings

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

SPACE = "\u2581"


def piece_table(vocab: Vocabulary) -> list[bytes]:
    """Bytes each token id prints as: control and unknown tokens print nothing."""
    table: list[bytes] = []
    for tok, ttype in zip(vocab.tokens, vocab.types, strict=True):
        if ttype == TOKEN_BYTE:
            table.append(bytes([int(tok[3:-1], 16)]))
        elif ttype in (TOKEN_NORMAL, TOKEN_USER_DEFINED):
            table.append(tok.replace(SPACE, " ").encode())
        else:
            table.append(b"")
    return table


def _token_string(piece: bytes, name: str) -> tuple[str, tuple[int, ...]]:
    """OpenAI's ``token`` and ``bytes`` for one id. A control token prints nothing, so it goes by its
    name (an alternative may be ``</s>``); a piece that is not whole UTF-8 (a byte token) is spelt
    ``bytes:\\xNN`` as OpenAI spells such tokens."""
    if not piece:
        return name, tuple(name.encode())
    try:
        return piece.decode(), tuple(piece)
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in piece), tuple(piece)


class TokenStrings:
    """Each id's token string and bytes for logprobs, built on first use (O(vocabulary), once)."""

    def __init__(self, vocab: Vocabulary, pieces: list[bytes]) -> None:
        self._names = vocab.tokens
        self._pieces = pieces

    @cached_property
    def table(self) -> list[tuple[str, tuple[int, ...]]]:
        return [_token_string(p, name) for p, name in zip(self._pieces, self._names, strict=True)]


class LogprobMaker:
    """Builds ``TokenLogprob``s on the worker thread: from the engine's own log probability of the chosen
    token, or from the step's logits over the whole vocabulary (a log-softmax and ``top`` passes of
    argmax: O(vocabulary) per token, in numpy)."""

    def __init__(self, strings: TokenStrings, top: int) -> None:
        self._strings = strings  # its table is built by the first worker that needs it, never on the loop
        self.top = top

    def known(self, token_id: int, logprob: float) -> TokenLogprob:
        token, raw = self._strings.table[token_id]
        return TokenLogprob(token, logprob, raw)

    def from_logits(self, logits: npt.ArrayLike, token_id: int) -> TokenLogprob:
        import numpy as np

        row: npt.NDArray[np.float32] = np.asarray(logits, dtype=np.float32).reshape(-1)
        peak = row.max()
        norm = float(peak + np.log(np.exp(row - peak).sum()))
        table = self._strings.table
        token, raw = table[token_id]
        top: tuple[TopLogprob, ...] = ()
        if self.top:
            # k passes of argmax: exact, in order, ties to the lower id, and about four times faster than
            # argpartition for k <= 20 over a 128k vocabulary (0.2-0.7 ms against 2.7 ms).
            work = row.copy()
            alternatives = []
            for _ in range(min(self.top, row.size)):
                i = int(work.argmax())
                if work[i] == -np.inf:
                    break  # the rest cannot be generated at all
                work[i] = -np.inf
                name, spelt = table[i]
                alternatives.append(TopLogprob(name, float(row[i]) - norm, spelt))
            top = tuple(alternatives)
        return TokenLogprob(token, float(row[token_id]) - norm, raw, top)


class TextAssembler:
    """Turns generated ids into safe-to-send text deltas, honouring stop strings."""

    def __init__(self, pieces: list[bytes], stop: Iterable[str]) -> None:
        self._pieces = pieces
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopStrings(stop)

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    @property
    def matched(self) -> str | None:
        """The stop string that ended the text, once ``stopped``."""
        return self._stops.matched

    def feed(self, token_id: int) -> str:
        """Text that may be sent now; sets ``stopped`` when a stop string completes."""
        return self._stops.feed(self._decoder.decode(self._pieces[token_id]))

    def flush(self) -> str:
        """At the end of generation: whatever was held back is plain text after all."""
        # The decoder's last characters first: fed after the flush, a partial stop among them was lost.
        out = self._stops.feed(self._decoder.decode(b"", final=True))
        return out + self._stops.flush()
