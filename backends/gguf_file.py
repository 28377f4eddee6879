"""Read a llama-architecture GGUF file into plain numpy arrays and vocabulary lists.

The in-process engines share one model file: llama.cpp loads the GGUF itself,
CTranslate2 gets a model derived from it (``ct2_convert``), and the gateway's
tokenizer is derived from its vocabulary (``hf_tokenizer``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.gguf_vocab import Vocabulary

if TYPE_CHECKING:
    import numpy as np
    from tokenizers import Tokenizer


class GgufError(ValueError):
    """The file is not a GGUF this project can use; the message says why."""


@dataclass(frozen=True)
class GgufModel:
    path: Path
    sha256: str
    architecture: str
    n_layers: int
    n_heads: int
    n_heads_kv: int
    dim: int
    ffn_dim: int
    context_length: int
    rope_base: float
    rms_eps: float
    vocab: Vocabulary
    tensors: dict[str, np.ndarray] = field(repr=False)
    n_params: int = 0


def _field(fields: dict[str, Any], key: str, default: Any = None) -> Any:
    f = fields.get(key)
    if f is None:
        return default
    return f.contents()


def read_gguf(path: str | Path, with_tensors: bool = True) -> GgufModel:
    """Load metadata, vocabulary and (unless ``with_tensors`` is False) float tensors and content hash.
    Blocking and, with tensors, heavy: call it off the event loop (``GgufCache`` keeps the light part)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader

    path = Path(path)
    try:
        digest = file_sha256(path) if with_tensors else ""
        reader = GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise GgufError(f"{path}: cannot read GGUF file: {exc}") from exc
    fields = reader.fields
    arch = _field(fields, "general.architecture")
    if arch != "llama":
        raise GgufError(f"{path}: architecture {arch!r} is not supported (only 'llama')")
    if _field(fields, "tokenizer.ggml.model") != "llama":
        raise GgufError(f"{path}: only SentencePiece-style ('llama') vocabularies are supported")
    tensors: dict[str, np.ndarray] = {}
    n_params = sum(int(t.n_elements) for t in reader.tensors)
    for t in reader.tensors if with_tensors else ():
        if t.tensor_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            raise GgufError(f"{path}: tensor {t.name} is {t.tensor_type.name}; only F32 and F16 convert")
        tensors[t.name] = np.asarray(t.data, dtype=np.float32)
    n_heads = int(_field(fields, "llama.attention.head_count"))
    vocab = Vocabulary(
        tokens=list(_field(fields, "tokenizer.ggml.tokens")),
        scores=[float(s) for s in _field(fields, "tokenizer.ggml.scores")],
        types=[int(t) for t in _field(fields, "tokenizer.ggml.token_type")],
        bos_id=_field(fields, "tokenizer.ggml.bos_token_id"),
        eos_id=_field(fields, "tokenizer.ggml.eos_token_id"),
        eot_id=_field(fields, "tokenizer.ggml.eot_token_id"),
        unk_id=_field(fields, "tokenizer.ggml.unknown_token_id"),
        add_bos=bool(_field(fields, "tokenizer.ggml.add_bos_token", True)),
        add_space_prefix=bool(_field(fields, "tokenizer.ggml.add_space_prefix", True)),
        chat_template=_field(fields, "tokenizer.chat_template"),
    )
    return GgufModel(
        path=path,
        sha256=digest,
        architecture=arch,
        n_layers=int(_field(fields, "llama.block_count")),
        n_heads=n_heads,
        n_heads_kv=int(_field(fields, "llama.attention.head_count_kv", n_heads)),
        dim=int(_field(fields, "llama.embedding_length")),
        ffn_dim=int(_field(fields, "llama.feed_forward_length")),
        context_length=int(_field(fields, "llama.context_length")),
        rope_base=float(_field(fields, "llama.rope.freq_base", 10000.0)),
        rms_eps=float(_field(fields, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        vocab=vocab,
        tensors=tensors,
        n_params=n_params,
    )


def file_sha256(path: Path) -> str:
    """The file's content hash, read in blocks: memory stays flat however big the model."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


_Key = tuple[Path, int, int]


class GgufCache:
    """Each GGUF file parsed (and hashed, and its tokenizer derived) once while it stays the same file:
    entries are keyed by path, size and modification time, so a replaced file is read again.

    One cache serves a start and every reload after it (the catalog, the prompt counters and the
    in-process engines all ask it); it is blocking and thread-safe, meant to be called off the event loop.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._headers: dict[_Key, GgufModel] = {}
        self._hashes: dict[_Key, str] = {}
        self._tokenizers: dict[_Key, Tokenizer] = {}
        self.parsed = 0
        """Files parsed so far (tests count them)."""

    @staticmethod
    def _key(path: str | Path) -> _Key:
        p = Path(path).resolve()
        try:
            st = os.stat(p)
        except OSError as exc:
            raise GgufError(f"{p}: cannot read GGUF file: {exc}") from exc
        return p, st.st_size, st.st_mtime_ns

    def _forget_older(self, key: _Key) -> None:
        for table in (self._headers, self._hashes, self._tokenizers):
            for old in [k for k in table if k[0] == key[0] and k != key]:
                del table[old]

    def _header(self, key: _Key) -> GgufModel:
        model = self._headers.get(key)
        if model is None:
            self._forget_older(key)
            model = self._headers[key] = read_gguf(key[0], with_tensors=False)
            self.parsed += 1
        return model

    def header(self, path: str | Path) -> GgufModel:
        """Metadata and vocabulary, without tensors."""
        key = self._key(path)
        with self._lock:
            return self._header(key)

    def sha256(self, path: str | Path) -> str:
        key = self._key(path)
        with self._lock:
            digest = self._hashes.get(key)
            if digest is None:
                self._forget_older(key)
                digest = self._hashes[key] = file_sha256(key[0])
            return digest

    def tokenizer(self, path: str | Path) -> Tokenizer:
        """The Hugging Face tokenizer derived from the file's vocabulary (``hf_tokenizer``)."""
        from backends.hf_tokenizer import build_tokenizer  # it imports this module

        key = self._key(path)
        with self._lock:
            tok = self._tokenizers.get(key)
            if tok is None:
                tok = self._tokenizers[key] = build_tokenizer(self._header(key).vocab)
            return tok
