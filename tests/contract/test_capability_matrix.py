"""The capability matrix in docs/engines.md is what the adapters declare, and the routing explains each gap.

Every adapter kind's ``capabilities`` (backends/capabilities.py) must match the docs/engines.md table cell by
cell, so the table cannot drift from the code; and for every feature an adapter lacks, a request that
uses it is kept away from that backend with ``lacks <feature>`` (the adapter suites prove, per engine,
that declared features reach the engine in its own wire form and come back in OpenAI's shapes).
"""

from __future__ import annotations

import re

import pytest

from backends.capabilities import (
    ECHO,
    FEATURES,
    IMAGES,
    JSON_OBJECT,
    JSON_SCHEMA,
    LOGIT_BIAS,
    LOGPROBS,
    PARALLEL_TOOL_CALLS,
    PENALTIES,
    PREFILL,
    SEED,
    TOOL_CHOICE_REQUIRED,
    TOOLS,
    TOP_LOGPROBS,
    Capabilities,
)
from gateway.fleet.engines import declared_capabilities
from routing.catalog import ENGINES, GPUS
from routing.policy import choose
from routing.rules import Rules
from routing.types import BackendProfile, BackendState, FleetSnapshot, ModelSpec, RequestFeatures
from tests.conftest import ROOT

COLUMNS = {
    "vLLM": "vllm",
    "llama-server": "llama_server",
    "trtllm-serve": "trtllm_serve",
    "Triton ensemble": "triton_trtllm",
    "TGI native": "tgi",
    "TGI Messages": "tgi_messages",
    "MII REST": "mii_rest",
    "MII OpenAI": "mii_openai",
    "CTranslate2": "ctranslate2",
    "llama.cpp": "llama_cpp",
}
ROWS = {
    "`tools` (auto/none, history)": (TOOLS,),
    "`tool_choice` required / named": (TOOL_CHOICE_REQUIRED,),
    "`parallel_tool_calls: false`": (PARALLEL_TOOL_CALLS,),
    "`json_object` / `json_schema`": (JSON_OBJECT, JSON_SCHEMA),
    "penalties": (PENALTIES,),
    "`logit_bias`": (LOGIT_BIAS,),
    "`seed`": (SEED,),
    "image parts (vision models)": (IMAGES,),
    "`echo`": (ECHO,),
}


def readme_matrix() -> dict[str, dict[str, str]]:
    """{row label: {engine: cell}} from the capability table in docs/engines.md."""
    lines = (ROOT / "docs" / "engines.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| capability |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    table: dict[str, dict[str, str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        table[cells[0]] = {COLUMNS[h]: c for h, c in zip(header[1:], cells[1:], strict=True)}
    return table


def _yes(cell: str) -> bool:
    return cell.startswith(("yes", "in prompt"))


MATRIX = readme_matrix()
CELLS = [(row, engine) for row in ROWS for engine in COLUMNS.values()]


@pytest.mark.parametrize(("row", "engine"), CELLS, ids=[f"{e}:{r}" for r, e in CELLS])
def test_readme_cell_is_what_the_adapter_declares(row: str, engine: str) -> None:
    caps = declared_capabilities(engine)
    cell = MATRIX[row][engine]
    for feature in ROWS[row]:
        assert (feature in caps.features) == _yes(cell), f"{engine} {feature}: docs/engines.md says {cell!r}"
    if row.startswith("`tools`"):
        assert caps.tools_in_prompt == cell.startswith("in prompt"), f"{engine}: docs/engines.md says {cell!r}"


@pytest.mark.parametrize("engine", COLUMNS.values())
def test_readme_logprobs_and_n_cells(engine: str) -> None:
    caps = declared_capabilities(engine)
    logprobs = MATRIX["`logprobs` / `top_logprobs`"][engine]
    if not logprobs.startswith("streamed modes"):  # Triton: depends on its text_output mode
        has, _, top = logprobs.partition(" / ")
        assert (LOGPROBS in caps.features) == (has == "yes")
        assert (TOP_LOGPROBS in caps.features) == (top not in ("", "no"))
        if top not in ("", "no"):
            assert caps.max_top_logprobs == int(top)
    assert caps.native_n == (MATRIX["native `n`"][engine] == "yes")


@pytest.mark.parametrize("engine", COLUMNS.values())
def test_assistant_prefill_is_declared_where_the_engine_continues_a_turn(engine: str) -> None:
    """Engines that take rendered text get it from the gateway's renderer; of the chat routes, vLLM
    (continue_final_message) and llama-server (prefill_assistant) continue a turn, TGI's Messages API cannot."""
    declared = PREFILL in declared_capabilities(engine).features
    assert declared == (MATRIX["assistant prefill (Anthropic)"][engine] == "yes")


def test_every_feature_has_a_row() -> None:
    covered = {f for features in ROWS.values() for f in features} | {LOGPROBS, TOP_LOGPROBS, PREFILL}
    assert covered == FEATURES


MODEL = ModelSpec("m", 8, 2.0, 8192, 131072)


def _state(engine: str, caps: Capabilities) -> BackendState:
    return BackendState(
        BackendProfile(
            name=engine,
            engine=engine,
            models=frozenset({"m"}),
            gpu=GPUS["A100-80GB"],
            gpu_count=1,
            memory_gb=80,
            efficiency=ENGINES[engine],
            max_concurrency=8,
            features=caps.features,
            extras=caps.extras,
            max_top_logprobs=caps.max_top_logprobs,
        )
    )


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_a_backend_lacking_a_feature_is_excluded_with_its_name(feature: str) -> None:
    fleet = FleetSnapshot(
        tuple(_state(e, declared_capabilities(e)) for e in COLUMNS.values()),
        {"m": MODEL},
    )
    decision = choose(RequestFeatures("m", 50, 10, needs=frozenset({feature})), fleet, Rules())
    for state in fleet.backends:
        if feature in state.profile.features:
            assert state.name in {c.backend for c in decision.candidates}
        else:
            assert re.search(rf"\blacks {feature}\b", decision.excluded[state.name]), decision.excluded
