"""Capabilities as data: choose() sends a request only to backends that honour every capability and
extra field it uses, explains the ones it leaves out, and says UNSUPPORTED when none serving the
model can; the gateway's shaping (answer length, ``n`` fan-in) behaves the same on every backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from backends.base import BackendError, Chunk, ErrorKind, GenerationRequest, Usage
from backends.capabilities import FEATURES, JSON_SCHEMA, LOGPROBS, TOOLS, Capabilities
from gateway.doors.openai_shapes import ResponseShape
from gateway.pipeline.restreams import fan_in
from gateway.pipeline.shaping import default_length, open_answer
from routing.catalog import BYTES_PER_PARAM, ENGINES, GPUS
from routing.decisions import Decision, Reason
from routing.policy import choose
from routing.rules import Rules
from routing.types import BackendProfile, BackendState, FleetSnapshot, ModelSpec, RequestFeatures

MODEL = ModelSpec("m", 8, BYTES_PER_PARAM["bf16"], 8192, 131072)


def state(name: str, features: frozenset[str] = frozenset(), extras: frozenset[str] = frozenset()) -> BackendState:
    return BackendState(
        BackendProfile(
            name=name,
            engine="vllm",
            models=frozenset({"m"}),
            gpu=GPUS["A100-80GB"],
            gpu_count=1,
            memory_gb=80,
            efficiency=ENGINES["vllm"],
            max_concurrency=64,
            features=features,
            extras=extras,
        )
    )


FLEET = FleetSnapshot(
    (
        state("tools", frozenset({TOOLS})),
        state("json", frozenset({JSON_SCHEMA, LOGPROBS}), frozenset({"top_k"})),
        state("plain"),
    ),
    {"m": MODEL},
)


def ask(
    needs: frozenset[str] = frozenset(), extras: frozenset[str] = frozenset(), max_tokens: int | None = 10
) -> Decision:
    return choose(RequestFeatures("m", 100, max_tokens, needs=needs, extras=extras), FLEET, Rules())


def test_plain_requests_may_go_anywhere() -> None:
    assert {c.backend for c in ask().candidates} == {"tools", "json", "plain"}


def test_backends_lacking_a_capability_are_excluded_and_explained() -> None:
    decision = ask(frozenset({TOOLS}))
    assert [c.backend for c in decision.candidates] == ["tools"]
    assert decision.excluded == {"json": "lacks tools", "plain": "lacks tools"}
    decision = ask(frozenset({JSON_SCHEMA}), frozenset({"top_k"}))
    assert [c.backend for c in decision.candidates] == ["json"]
    assert decision.excluded["tools"] == "lacks json_schema, top_k"


def test_no_backend_with_everything_is_unsupported() -> None:
    decision = ask(frozenset({TOOLS, JSON_SCHEMA}))
    assert decision.reason is Reason.UNSUPPORTED and not decision.candidates
    assert decision.excluded == {
        "tools": "lacks json_schema",
        "json": "lacks tools",
        "plain": "lacks json_schema, tools",
    }
    assert ask(extras=frozenset({"temprature"})).reason is Reason.UNSUPPORTED


def test_unhealthy_capable_backend_is_no_healthy_backend_not_unsupported() -> None:
    down = FleetSnapshot(tuple(replace(b, healthy=b.name != "tools") for b in FLEET.backends), FLEET.models)
    decision = choose(RequestFeatures("m", 100, 10, needs=frozenset({TOOLS})), down, Rules())
    assert decision.reason is Reason.NO_HEALTHY_BACKEND


def test_prompt_near_the_context_limit_fits_when_max_tokens_is_omitted() -> None:
    near = RequestFeatures("m", MODEL.context - 10, None)
    assert choose(near, FLEET, Rules()).candidates
    assert not choose(replace(near, max_tokens=11), FLEET, Rules()).candidates


def test_answer_length_default_is_what_the_context_leaves_capped() -> None:
    req = GenerationRequest("r", "m", prompt="x")
    assert default_length(req, cap=100, context=4096, prompt_tokens=10).max_tokens == 100
    assert default_length(req, cap=5000, context=4096, prompt_tokens=96).max_tokens == 4000
    assert default_length(req, cap=5000, context=4096, prompt_tokens=5000).max_tokens == 1
    assert default_length(replace(req, max_tokens=7), cap=5, context=4096, prompt_tokens=1).max_tokens == 7


class Counting:
    """A backend that answers each request with its seed, and remembers what it was asked."""

    name = "counting"

    def __init__(self, fail_seed: int = -1) -> None:
        self.asked: list[GenerationRequest] = []
        self.closed = 0
        self.fail_seed = fail_seed

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.asked.append(request)
        try:
            await asyncio.sleep(0)
            if request.seed == self.fail_seed:
                raise BackendError(ErrorKind.UPSTREAM, "boom")
            yield Chunk(text=f"seed {request.seed}")
            yield Chunk(finish_reason="stop", usage=Usage(5, 2))
        finally:
            self.closed += 1


def test_n_without_native_n_asks_n_times_with_distinct_seeds_and_merges_choices() -> None:
    backend = Counting()

    async def go() -> list[Chunk]:
        stream = open_answer(backend, Capabilities(), GenerationRequest("r", "m", prompt="x", n=3, seed=10))  # type: ignore[arg-type]
        return [c async for c in stream]

    chunks = asyncio.run(go())
    assert sorted(r.seed or 0 for r in backend.asked) == [10, 11, 12]
    assert all(r.n == 1 for r in backend.asked)
    doc, usage = ResponseShape(False, "r", "m", False, 3).whole(chunks)
    assert [(c["index"], c["text"]) for c in doc["choices"]] == [(0, "seed 10"), (1, "seed 11"), (2, "seed 12")]
    assert usage == Usage(5, 6)  # prompt once, completions summed
    native = Counting()
    asyncio.run(_drain(open_answer(native, Capabilities(native_n=True), GenerationRequest("r", "m", prompt="x", n=3))))  # type: ignore[arg-type]
    assert [r.n for r in native.asked] == [3]


async def _drain(stream: AsyncIterator[Chunk]) -> list[Chunk]:
    return [c async for c in stream]


def test_one_failed_choice_fails_the_answer_and_closes_every_stream() -> None:
    backend = Counting(fail_seed=11)
    with pytest.raises(BackendError):
        asyncio.run(_drain(fan_in([backend.generate(GenerationRequest("r", "m", seed=s)) for s in (10, 11, 12)])))
    assert backend.closed == 3


def test_every_feature_name_is_known_to_config() -> None:
    from gateway.config import CapabilitiesConfig

    CapabilitiesConfig(enable=sorted(FEATURES), disable=["top_k"])
    with pytest.raises(ValueError, match="unknown capabilities"):
        CapabilitiesConfig(enable=["telepathy"])


def test_more_alternatives_than_a_backend_gives_exclude_it() -> None:
    few = FleetSnapshot(
        (
            replace(
                state("five", frozenset({LOGPROBS, "top_logprobs"})),
                profile=replace(state("five", frozenset({LOGPROBS, "top_logprobs"})).profile, max_top_logprobs=5),
            ),
            state("twenty", frozenset({LOGPROBS, "top_logprobs"})),
        ),
        FLEET.models,
    )
    wanted = RequestFeatures("m", 100, 10, needs=frozenset({LOGPROBS, "top_logprobs"}), top_logprobs=8)
    decision = choose(wanted, few, Rules())
    assert [c.backend for c in decision.candidates] == ["twenty"]
    assert decision.excluded == {"five": "lacks top_logprobs above 5"}
    assert [c.backend for c in choose(replace(wanted, top_logprobs=5), few, Rules()).candidates] != []
