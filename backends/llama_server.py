"""llama.cpp's ``llama-server`` over HTTP (OpenAI routes), beside the in-process mode.

Health: ``/health`` answers 503 while the model loads. Load: ``/metrics``
(only with ``--metrics``): requests processing and deferred; the kv-cache
gauges were removed from llama-server in 2025 and are read only when present. Context: a slot's
``n_ctx`` from ``/props`` (``default_generation_settings``), what one request may fill.

Capabilities, checked against the llama-server ``make test`` builds (llama-cpp-python 0.3.36's
vendored llama.cpp, build ``b1-0c1e570``); every field goes out as OpenAI spells it:

- ``tools`` (``tool_choice`` "auto"/"none", tool-call history): with ``--jinja``, through the model's
  chat template; the calls come back as OpenAI's ``tool_calls`` when the template's format is one
  llama.cpp parses.
- Not ``tool_choice`` "required" or a named function: a named choice is refused as not a string
  (logged, then ignored), and "required" does not force a call from the first token: the grammar lets
  free text run first, so the demo model wrote text until ``max_tokens`` without calling.
- Not ``parallel_tool_calls: false`` as a capability: not checked against an engine answer.
- ``json_object`` / ``json_schema``: grammars made from the schema (``response_format``).
- ``logprobs`` / ``top_logprobs``: chat's format on both routes (``/v1/completions`` too); chat
  without ``top_logprobs`` still lists alternatives, and completions' ``logprobs: 0`` returns none,
  so the adapter asks for one alternative and keeps what the client asked for.
- Penalties, ``logit_bias`` (token ids as string keys), ``seed`` (reproducible run to run).
- Sampling: llama-server's own defaults cut the distribution (``top_k`` 40, ``top_p`` 0.95,
  ``min_p`` 0.05), so a sampled request without them is sent OpenAI's (the whole distribution).
- ``n``: native, one slot per choice; usage comes once per choice and is added up.
- images: ``image_url`` parts go as they are; llama-server answers them only with ``--mmproj`` ("image
  input is not supported" otherwise), which the model entry says.
- Not ``assistant_prefill``: the llama-server this project builds (llama-cpp-python 0.3.36's llama.cpp)
  answers a final assistant message from the start of a new turn instead of continuing it (the
  conformance test saw "Hello! I am the" + the whole reply); a build that continues it (newer
  llama.cpp's ``prefill_assistant``) can declare it with ``capabilities.enable: [assistant_prefill]``.
- Not ``echo``: the answer never repeats the prompt.
- Cached prompt tokens: ``usage.prompt_tokens_details.cached_tokens`` (also ``timings.cache_n``).

Extras: llama.cpp's sampling fields (``top_k``, ``min_p``, ``repeat_penalty``, ``typical_p``,
``mirostat``...), ``ignore_eos``, ``cache_prompt`` and a GBNF ``grammar``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from backends import capabilities as cap
from backends.base import GenerationRequest
from backends.capabilities import Capabilities
from backends.openai_compat import OpenAICompatBackend
from backends.prom_text import Gauge, LoadMap

LOAD = LoadMap(
    running=Gauge(("llamacpp:requests_processing",)),
    waiting=Gauge(("llamacpp:requests_deferred",)),
    kv_cache=Gauge(("llamacpp:kv_cache_usage_ratio",)),
)

FEATURES = frozenset(
    {
        cap.TOOLS, cap.JSON_OBJECT, cap.JSON_SCHEMA, cap.LOGPROBS, cap.TOP_LOGPROBS, cap.PENALTIES,
        cap.LOGIT_BIAS, cap.SEED, cap.IMAGES,
    }
)  # fmt: skip
EXTRAS = frozenset(
    {
        "top_k", "min_p", "repeat_penalty", "typical_p", "mirostat", "mirostat_tau", "mirostat_eta",
        "ignore_eos", "cache_prompt", "grammar",
    }
)  # fmt: skip
CAPABILITIES = Capabilities(FEATURES, EXTRAS, native_n=True)


class LlamaServerBackend(OpenAICompatBackend):
    engine = "llama_server"
    health_path = "/health"
    metrics_path = "/metrics"
    load_map = LOAD
    context_path = "/props"
    capabilities: ClassVar[Capabilities] = CAPABILITIES
    usage_per_choice = True
    closes_streams = True  # its HTTP server ends the connection after a stream, without Connection: close

    def read_context(self, doc: Any) -> int | None:
        # A slot's context (``-c`` over ``-np`` slots unless the KV cache is unified): what one request gets.
        settings = doc.get("default_generation_settings") if isinstance(doc, dict) else None
        value = settings.get("n_ctx") if isinstance(settings, dict) else None
        return value if isinstance(value, int) else None

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        body = super().payload(request)
        if not request.greedy:
            # llama-server samples from top_k 40, top_p 0.95 and min_p 0.05 unless told: OpenAI's sampling
            # is the whole distribution (a client's own top_k/min_p extras are already in the body).
            body.setdefault("top_p", 1.0)
            body.setdefault("top_k", 0)
            body.setdefault("min_p", 0.0)
        return body

    def engine_fields(self, request: GenerationRequest) -> dict[str, Any]:
        fields = super().engine_fields(request)
        if request.messages is None and fields.get("logprobs") == 0:
            fields["logprobs"] = 1  # 0 would return no log probabilities at all
        return fields
