"""A llama GGUF file's vocabulary: what the tokenizer (``hf_tokenizer``) and the in-process engines
read of it, apart from the file reader (``gguf_file``), which builds it."""

from __future__ import annotations

from dataclasses import dataclass

# llama.cpp's token types
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class Vocabulary:
    tokens: list[str]
    scores: list[float]
    types: list[int]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    unk_id: int | None
    add_bos: bool
    add_space_prefix: bool
    chat_template: str | None

    @property
    def stop_ids(self) -> list[int]:
        """Tokens that end a generation: end of sequence and end of turn."""
        return sorted({i for i in (self.eos_id, self.eot_id) if i is not None})
