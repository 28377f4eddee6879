"""DeepSpeed-MII, through its RESTful gateway or its OpenAI server.

- REST ``POST /mii/<deployment>``: no streaming, so the finished text arrives as
  one chunk (its time to first token is the whole generation, honestly): the
  backend ``answers_whole``, for a whole-answer deadline instead of a first-token
  one. MII samples by default (``do_sample`` true, ``top_p`` 0.9), rejects
  temperature 0, and takes ``stop`` only as one string matching a whole
  vocabulary token, which then also replaces its end-of-sequence check (a stop
  string that is not one token would make it generate to the limit): the adapter
  asks for greedy with ``do_sample: false``, sends ``top_p`` explicitly, never
  sends ``stop`` and cuts at stop strings itself. Completion tokens are then
  those of the text kept: MII's ``generated_length`` scaled by the share of the
  generated text up to the end of the stop string. The adapter never retries:
  one call, one generation.
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
OPENAI_CAPABILITIES = Capabilities(extras=frozenset({"top_k"}))


def rest_payload(req: GenerationRequest, prompt: str, default_max_tokens: int) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "prompts": [prompt],
        "max_new_tokens": req.max_tokens or default_max_tokens,
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


class MiiRestBackend(HttpBackend):
    engine = "mii_rest"
    health_path = "/healthz"
    metrics_path = None
    answers_whole: ClassVar[bool] = True
    """The whole answer arrives at once: the gateway applies a whole-answer deadline, not a first-token one."""
    capabilities: ClassVar[Capabilities] = REST_CAPABILITIES

    def __init__(self, name: str, model: str, settings: HttpSettings, deployment: str) -> None:
        super().__init__(name, model, settings)
        self.deployment = deployment

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        prompt = await self.render_prompt(request)
        payload = rest_payload(request, prompt, self.settings.default_max_tokens)
        async with self.open_stream(request, f"/mii/{self.deployment}", payload) as response:
            doc = self.json_event((await self._read(response, request.clock)).decode("utf-8", "replace"))
        if not (isinstance(doc, list) and doc and isinstance(doc[0], dict)):
            raise BackendError(ErrorKind.PROTOCOL, f"{self.name}: unexpected MII response {str(doc)[:200]}")
        result = doc[0]
        generated = str(result.get("generated_text", ""))
        stops = StopStrings(request.stop)
        text = stops.feed(generated) + stops.flush()
        raw = result.get("finish_reason")
        finish = "stop" if stops.stopped or raw != "length" else "length"
        completion = int(result.get("generated_length") or 0)
        if stops.stopped:
            rest = generated[len(text) :]
            stop_len = max((len(s) for s in request.stop if rest.startswith(s)), default=0)
            completion = kept_tokens(completion, generated, text, stop_len)
        yield Chunk(text=text, finish_reason=finish, usage=Usage(int(result.get("prompt_length") or 0), completion))


class MiiOpenAIBackend(OpenAICompatBackend):
    engine = "mii_openai"
    health_path = "/health"
    metrics_path = None
    ask_usage: ClassVar[bool] = False
    capabilities = OPENAI_CAPABILITIES
    end_texts = END_TEXTS  # MII decodes streamed tokens without skipping special ones

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        payload = to_payload(request, self.settings.served_model, self.capabilities, ask_usage=False)
        payload.pop("stop", None)
        if request.greedy:
            payload |= {"temperature": 1.0, "top_p": GREEDY_TOP_P}
        return payload
