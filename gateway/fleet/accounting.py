"""Per-backend accounting: what the requests sent to each backend report, kept on its fleet entry.

In flight and prompt tokens awaiting prefill, observed latencies and the breaker's outcomes, the
prompt blocks the engine is expected to hold (and, with ``routing.prefix.share``, what the other
replicas sent there). Attempts are counted on the entry they were sent to, not by name: a reload may
replace the entry of that name meanwhile, and the retired one must still see its requests end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from gateway.config import CTranslate2Config, LlamaCppConfig
from gateway.fleet.catalog import with_context
from gateway.fleet.entry import Entry
from gateway.fleet.prefix_share import PrefixShare
from routing.estimator import kv_capacity_tokens, observe
from routing.prefix import PrefixIndex
from routing.types import ModelSpec, RequestFeatures

log = logging.getLogger("enginegate.fleet")


class Accounts:
    """The fleet's books (``Fleet.accounts``); ``entries`` and ``models`` read the fleet's current
    ones, which a reload replaces."""

    def __init__(
        self, entries: Callable[[], Mapping[str, Entry]], models: Callable[[], Mapping[str, ModelSpec]]
    ) -> None:
        self._entries = entries
        self._models = models
        self.share: PrefixShare | None = None
        """``routing.prefix.share``: the other replicas hear where this one sent each prompt's blocks."""

    def sending(self, entry: Entry, prompt_tokens: int) -> None:
        """An attempt on ``entry`` starts: it is in flight and its prompt waits to be prefilled."""
        entry.in_flight += 1
        entry.prefill_backlog += prompt_tokens

    def remember(self, entry: Entry, features: RequestFeatures, cached_blocks: int) -> list[float]:
        """The prompt of ``features`` goes to ``entry``: its blocks join what the engine is expected to
        hold. Returns the ages of the ``cached_blocks`` blocks routing expected there (to judge the
        engine's report with)."""
        index = self._index(entry)
        ages = index.ages(features.prefix_blocks, cached_blocks)
        index.add(features.prefix_blocks, features.block_tokens, features.prefix_hash)
        if self.share is not None and not _in_process(entry):
            self.share.sent(entry.name, features.prefix_blocks, features.block_tokens, features.prefix_hash)
        return ages

    def learn(self, backend: str, keys: Sequence[int], block_tokens: float, conversation: int | None = None) -> None:
        """Another replica sent a prompt of ``keys`` to ``backend``: the engine holds its blocks now."""
        entry = self._entries().get(backend)
        if entry is not None and not _in_process(entry):
            self._index(entry).add(keys, block_tokens, conversation)

    def _index(self, entry: Entry) -> PrefixIndex:
        """The entry's prefix index, made with its first prompt, sized by its model's KV capacity."""
        if entry.prefix is None:
            model = self._models().get(entry.config.model)
            entry.prefix = PrefixIndex(kv_capacity_tokens(model, entry.profile) if model else 0.0)
        return entry.prefix

    def cached(self, entry: Entry, ages: list[float], cached_tokens: int, block_tokens: float) -> None:
        """The engine reported the prompt tokens it reused: the expected cache size follows."""
        if entry.prefix is not None:
            entry.prefix.reported(ages, cached_tokens, block_tokens)

    def first_token(self, entry: Entry, prompt_tokens: int) -> None:
        entry.prefill_backlog = max(0, entry.prefill_backlog - prompt_tokens)

    def end(self, entry: Entry, prompt_tokens: int = 0) -> None:
        """An attempt ended; ``prompt_tokens`` when it ended before its first token."""
        entry.in_flight = max(0, entry.in_flight - 1)
        entry.prefill_backlog = max(0, entry.prefill_backlog - prompt_tokens)
        if entry.in_flight == 0 and entry.drained is not None:
            entry.drained.set()

    def succeeded(
        self, entry: Entry, prior_ttft_ms: float, ttft_ms: float, tpot_ms: float | None, out_tokens: int | None = None
    ) -> None:
        entry.observed = observe(entry.observed, prior_ttft_ms, ttft_ms, tpot_ms, out_tokens)
        entry.breaker.success()

    def answered(self, entry: Entry) -> None:
        """An answer ended well, but with no timing to learn from (an endpoint picker that saw only a
        whole document, never its first token): the breaker hears the success, the estimator nothing."""
        entry.breaker.success()

    def failed(self, entry: Entry) -> None:
        entry.breaker.failure()

    def note_context(self, entry: Entry, tokens: int | None, published: bool = True) -> None:
        """``note_context`` with the entry's model as this fleet knows it."""
        model = self._models().get(entry.config.model)
        note_context(entry, tokens, published, model.context if model is not None else None)


def _in_process(entry: Entry) -> bool:
    """An engine inside this process (CTranslate2, llama.cpp): every replica has its own under the same
    backend name, so what one sent to its engine says nothing of what another's holds."""
    return isinstance(entry.config, CTranslate2Config | LlamaCppConfig)


def note_context(entry: Entry, tokens: int | None, published: bool = True, model_context: int | None = None) -> None:
    """The engine's own context: ``published`` by the engine (it replaces what was known), or named
    by one of its context refusals (it only ever lowers what is known). Placement and the answer's
    default length use it from the next request on; a context below the model entry's is logged."""
    if not isinstance(tokens, int) or tokens <= 0:
        return
    known = entry.profile.context
    if published:
        if tokens == entry.published_context:
            return  # read again at every poll: only a change (a relaunched engine) replaces what is known
        entry.published_context = tokens
    elif known is not None:
        tokens = min(tokens, known)
    if tokens == known:
        return
    entry.profile = with_context(entry.profile, tokens)
    if model_context is not None and tokens < model_context:
        log.warning(
            "backend %s serves %s with a context of %d tokens, smaller than the model entry's %d: "
            "answers there are sized to %d tokens with their prompt (%s)",
            entry.name, entry.config.model, tokens, model_context, tokens,
            "the engine says so" if published else "learned from the engine refusing a request",
            extra={"backend": entry.name},
        )  # fmt: skip
