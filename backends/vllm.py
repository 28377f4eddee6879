"""vLLM's OpenAI server: the thin path, health from ``/health``, load from ``/metrics``, the context it
was launched with (``--max-model-len``) from ``/v1/models``' ``max_model_len``.

Every capability field goes out as OpenAI spells it: vLLM's request models take them all (checked
against vLLM 0.32 on CPU, the engine ``make test`` runs). What each needs from the deployment:

- ``tools``, ``tool_choice`` "required" / a named function: vLLM answers tools only when started with
  ``--enable-auto-tool-choice --tool-call-parser <parser>`` (hermes for the demo model); without the
  parser even a named ``tool_choice`` is a 400 ("requires --tool-call-parser to be set"). A deployment
  without them narrows the backend in config (``disable: [tools, tool_choice_required]``). Forced
  calls are constrained decoding (the demo model calls get_weather even for "Hello"), but vLLM's
  hermes grammar does not hold the arguments to the tool's schema (an earlier demo model answered
  ``"arguments": "false"``).
- ``parallel_tool_calls: false``: vLLM keeps only the first call of the answer (read in vLLM's
  serving code and accepted by the engine; the demo model never makes two calls, so not seen).
- ``json_object`` / ``json_schema``: vLLM's structured outputs. xgrammar's default allows any
  whitespace between JSON tokens, and a small model can loop on it until ``max_tokens`` (an earlier
  demo model did): such deployments start vLLM with ``--structured-outputs-config '{"backend":
  "xgrammar", "disable_any_whitespace": true}'`` (a server setting: vLLM ignores the request field).
- ``logprobs`` / ``top_logprobs`` (up to ``--max-logprobs``, 20 by default), penalties, ``logit_bias``,
  ``seed`` (reproducible run to run), ``echo`` (completions), ``n`` (native: usage comes once, summed;
  vLLM refuses ``n`` > 1 at temperature 0, so greedy choices are asked as ``top_k`` 1 sampling).
- images: ``image_url`` parts go as they are; vLLM answers them only for a multimodal model ("... is
  not a multimodal model" otherwise), which the model entry says.
- ``assistant_prefill`` (a final assistant message continued): ``continue_final_message: true`` with
  ``add_generation_prompt: false``, vLLM's own fields (the template renders that turn open).
- Cached prompt tokens (``usage.prompt_tokens_details.cached_tokens``) are reported only with
  ``--enable-prompt-tokens-details``.

Extras: vLLM's own sampling fields (``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos``...).
``include_stop_str_in_output: true`` keeps the stop string in the answer: the adapter then leaves
stop strings to the engine instead of cutting them itself. Beam search and ``length_penalty`` are
left out: vLLM's beam search answers no streams.
"""

from __future__ import annotations

from typing import Any, ClassVar

from backends import capabilities as cap
from backends.base import BackendError, ErrorKind, GenerationRequest
from backends.capabilities import Capabilities
from backends.openai_compat import OpenAICompatBackend
from backends.prom_text import Gauge, LoadMap

# kv_cache_usage_perc since 0.9.2; gpu_cache_usage_perc before (and until 0.10.x beside it).
LOAD = LoadMap(
    running=Gauge(("vllm:num_requests_running",)),
    waiting=Gauge(("vllm:num_requests_waiting",)),
    kv_cache=Gauge(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
)

FEATURES = frozenset(
    {
        cap.TOOLS, cap.TOOL_CHOICE_REQUIRED, cap.PARALLEL_TOOL_CALLS, cap.JSON_OBJECT, cap.JSON_SCHEMA,
        cap.LOGPROBS, cap.TOP_LOGPROBS, cap.PENALTIES, cap.LOGIT_BIAS, cap.SEED, cap.ECHO, cap.IMAGES, cap.PREFILL,
    }
)  # fmt: skip
EXTRAS = frozenset(
    {
        "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids",
        "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
        "truncate_prompt_tokens",
    }
)  # fmt: skip
CAPABILITIES = Capabilities(FEATURES, EXTRAS, native_n=True)


def tokenize_count(name: str, doc: Any) -> int:
    """``count`` of vLLM's TokenizeResponse (``{count, max_model_len, tokens}``)."""
    count = doc.get("count") if isinstance(doc, dict) else None
    if not isinstance(count, int) or isinstance(count, bool):
        raise BackendError(ErrorKind.PROTOCOL, f"{name}: /tokenize answered without a count")
    return count


class VLLMBackend(OpenAICompatBackend):
    engine = "vllm"
    health_path = "/health"
    metrics_path = "/metrics"
    load_map = LOAD
    context_path = "/v1/models"
    capabilities: ClassVar[Capabilities] = CAPABILITIES

    async def count_prompt(self, request: GenerationRequest) -> int:
        """vLLM's ``POST /tokenize``: a chat is rendered there with the served model's own template, tools
        and prefill as ``generate`` sends them, so the count is the ``usage.prompt_tokens`` vLLM reports."""
        body: dict[str, Any] = {"model": self.settings.served_model}
        if request.messages is None:
            body["prompt"] = request.prompt or ""
        else:
            body["messages"] = request.messages
            if request.tools and cap.TOOLS in self.capabilities.features:
                body["tools"] = list(request.tools)
            if request.continue_final:
                body |= {"continue_final_message": True, "add_generation_prompt": False}
        doc = await self.post_json(request, "/tokenize", body)
        return tokenize_count(self.name, doc)

    def read_context(self, doc: Any) -> int | None:
        cards = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(cards, list):
            return None
        # The served model's card (a LoRA adapter's card carries the base model's limit too).
        lengths = {c.get("id"): c.get("max_model_len") for c in cards if isinstance(c, dict)}
        value = lengths.get(self.settings.served_model, next(iter(lengths.values()), None))
        return value if isinstance(value, int) else None

    def engine_fields(self, request: GenerationRequest) -> dict[str, Any]:
        fields = super().engine_fields(request)
        if request.continue_final and request.messages is not None:
            fields |= {"continue_final_message": True, "add_generation_prompt": False}
        if request.n > 1 and request.greedy:
            # vLLM refuses n > 1 at temperature 0; sampling from the single likeliest token is greedy.
            fields |= {"temperature": 1.0, "top_k": 1}
        return fields
