"""DeepSpeed-MII, through its RESTful gateway or its OpenAI server.

- REST ``POST /mii/<deployment>``: no streaming, so the finished text arrives as
  one chunk (its time to first token is the whole generation, honestly): the
  backend ``answers_whole``, for a whole-answer deadline instead of a first-token
  one. MII samples by default (``do_sample`` true, ``top_p`` 0.9), rejects
  temperature 0, and has no usable stop field: its generate kwargs cross gRPC as
  scalars (a list, the type the reference gives ``stop``, fails the request), and
  the one string that passes is matched against a single vocabulary token, which
  then also replaces its end-of-sequence check (a stop string that is not one
  token would make it generate to the limit). So the adapter asks for greedy with
  ``do_sample: false``, sends ``top_p`` explicitly, never sends ``stop``, and
  applies stop strings itself. With nothing to stop mid-answer (no stream, no
  cancellation), a request with stop strings is generated in rounds: 16 tokens
  (``stop_round_tokens``), then twice as many each round, each round's prompt the
  prompt and the answer so far; after each the adapter looks for the stop strings
  and asks no more once one appears, the engine ends the answer or the limit is
  reached. The engine so generates at most about twice what the answer needed
  (and one round beyond a stop), not the rest of a long answer to its end, for a
  prompt read again each round (rounds: at most 1 + log2 of the answer's
  length over 16). A round that ends inside a multi-byte character (U+FFFD) leaves
  that character to the next. Greedy rounds continue exactly where one request
  would have (the prompt and the answer so far tokenize as they were generated,
  here the demo model's SentencePiece text); MII decodes each round alone, so
  with a tokenizer that drops the first token's space (Llama 2's) a round that
  starts a word loses that space: set ``stop_round_tokens: 0`` for one request
  and an engine that runs to its end. Completion tokens are MII's
  ``generated_length`` of every round, the last one's scaled by the share of its
  generated text up to the end of the stop string. The adapter never retries a
  round: one call, one generation.
- OpenAI server: always samples, so greedy becomes nucleus sampling with a tiny
  ``top_p`` (the most likely token alone); uses only the first stop string
  (enforced here instead); sends no usage in streams (one token per chunk is
  counted, prompt tokens estimated); streams the end token's text, which is cut.

MII exposes no metrics: load is what this gateway has in flight there.

What each carries beyond plain text (``capabilities``), read from MII v0.3.x:

- REST: tools, rendered into the prompt with the model's chat template (the gateway parses the
  model's calls from the text); ``ignore_eos`` and ``top_k`` as generate kwargs. MII's generate
  kwargs (GenerateParamsConfig, unknown ones refused) have no seed, penalties, logit bias, logprobs
  or guided decoding, so none is declared; ``min_new_tokens`` counts the prompt too (MII compares it
  with the whole sequence length), so OpenAI-style ``min_tokens`` cannot be expressed.
- OpenAI server: only ``top_k`` beyond plain text. Its request models accept ``presence_penalty``,
  ``frequency_penalty``, ``user``, completions' ``logprobs``/``echo``/``best_of`` and ignore every
  other field, but never use them (no logprobs in answers, no penalties in its generate kwargs): none
  is declared. ``n`` is not native: its stream carries only the first of the ``n`` prompts, and this
  adapter always streams, so the gateway asks ``n`` times. No tools (its messages must be
  string-to-string maps, so tool-call history does not even validate) and no ``response_format``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from backends import capabilities as cap
from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Usage
from backends.capabilities import Capabilities
from backends.http_base import HttpBackend, HttpSettings
from backends.openai_compat import END_TEXTS, OpenAICompatBackend, to_payload
from backends.text import StopStrings

GREEDY_TOP_P = 1e-6

REST_CAPABILITIES = Capabilities(
    features=frozenset({cap.TOOLS}), extras=frozenset({"ignore_eos", "top_k"}), tools_in_prompt=True
)
OPENAI_CAPABILITIES = Capabilities(extras=frozenset({"top_k"}), token_counts="estimate")  # no usage in streams


def rest_payload(req: GenerationRequest, prompt: str, max_new_tokens: int) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "prompts": [prompt],
        "max_new_tokens": max_new_tokens,
        "return_full_text": False,
    }
    if req.greedy:
        payload["do_sample"] = False
    else:
        payload |= {"do_sample": True, "temperature": req.temperature, "top_p": req.top_p}
        top_k = req.extra.get("top_k")
        if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > 0:  # MII refuses 0 (no limit)
            payload["top_k"] = top_k
    if isinstance(req.extra.get("ignore_eos"), bool):
        payload["ignore_eos"] = req.extra["ignore_eos"]
    return payload


def kept_tokens(generated: int, text: str, kept: str, stop_len: int) -> int:
    """Tokens of ``kept`` (plus its stop string) when MII generated ``generated`` for ``text``: MII counts
    only the whole, so the count is shared out by characters."""
    if not text or len(kept) >= len(text):
        return generated
    return min(generated, max(1, math.ceil(generated * min(len(text), len(kept) + stop_len) / len(text))))


STOP_ROUND_TOKENS = 16
"""The first round's tokens when a request with stop strings is generated in rounds (each next doubles)."""


class MiiRestBackend(HttpBackend):
    engine = "mii_rest"
    health_path = "/healthz"
    metrics_path = None
    capabilities: ClassVar[Capabilities] = REST_CAPABILITIES

    def __init__(
        self, name: str, model: str, settings: HttpSettings, deployment: str, stop_round_tokens: int = STOP_ROUND_TOKENS
    ) -> None:
        super().__init__(name, model, settings)
        self.deployment = deployment
        self.stop_round_tokens = stop_round_tokens
        """Tokens of the first round for requests with stop strings; 0: one request, generated to its end."""

    def answers_whole(self, request: GenerationRequest, whole: bool | None = None) -> bool:
        """Always: the REST gateway has no stream."""
        return True

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt = await self.render_prompt(request)
        limit = request.max_tokens or self.settings.default_max_tokens
        stops = StopStrings(request.stop)
        size = self.stop_round_tokens if request.stop and self.stop_round_tokens > 0 else limit
        answer, emitted, counted, prompt_tokens = "", 0, 0, None  # emitted: characters of answer sent on
        while True:
            ask = min(size, limit - counted)
            result = await self._generate_once(request, prompt + answer, ask)
            if prompt_tokens is None:
                prompt_tokens = int(result.get("prompt_length") or 0)
            generated = str(result.get("generated_text", ""))
            length = int(result.get("generated_length") or 0)
            reason = result.get("finish_reason")
            more = reason == "length" and counted + length < limit and length > 0
            if more:  # a character cut at the round's end is left to the next round whole
                generated = generated.rstrip("\ufffd")
            text = stops.feed(generated)
            if stops.stopped:  # the stop may have begun in an earlier round's text, held back until now
                whole, stop_at = answer + generated, emitted + len(text)
                stop_len = max((len(s) for s in request.stop if whole.startswith(s, stop_at)), default=0)
                here = max(0, stop_at - len(answer))  # of this round's text, kept
                counted += kept_tokens(length, generated, generated[:here], stop_at + stop_len - len(answer) - here)
            else:
                counted += length
            if not more or stops.stopped:
                finish = "stop" if stops.stopped or reason != "length" else "length"
                usage = Usage(prompt_tokens, counted)
                yield Chunk(text=text + stops.flush(), finish_reason=finish, usage=usage)
                return
            if text:
                yield Chunk(text=text)
            answer, emitted = answer + generated, emitted + len(text)
            size *= 2

    async def _generate_once(self, request: GenerationRequest, prompt: str, max_new_tokens: int) -> dict[str, Any]:
        """One generate call: MII's reply for ``prompt``."""
        payload = rest_payload(request, prompt, max_new_tokens)
        async with self.open_stream(request, f"/mii/{self.deployment}", payload) as response:
            doc = self.json_event((await self.read_body(response, request.clock)).decode("utf-8", "replace"))
        if not (isinstance(doc, list) and doc and isinstance(doc[0], dict)):
            raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: unexpected MII response {str(doc)[:200]}")
        result: dict[str, Any] = doc[0]
        return result


class MiiOpenAIBackend(OpenAICompatBackend):
    engine = "mii_openai"
    health_path = "/health"
    metrics_path = None
    ask_usage: ClassVar[bool] = False
    asks_whole: ClassVar[bool] = False  # its whole answers count prompt tokens its own way (the stream's are estimated)
    capabilities = OPENAI_CAPABILITIES
    end_texts = END_TEXTS  # MII decodes streamed tokens without skipping special ones

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        payload = to_payload(request, self.settings.served_model, self.capabilities, ask_usage=False)
        payload.pop("stop", None)
        if request.greedy:
            payload |= {"temperature": 1.0, "top_p": GREEDY_TOP_P}
        return payload
