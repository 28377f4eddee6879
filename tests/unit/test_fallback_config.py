"""Aliases and fallback chains in the config (docs/traffic.md): every bad one is a ``FILE:LINE: path:
message`` error, and the chains the gateway walks are the ones the file means."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import ConfigError, parse_config
from routing.decisions import Decision, Reason
from routing.fallback import CAUSES, Step, chains, cycle, decision_cause
from tests.conftest import write_config


def problems(models: str) -> list[str]:
    text = f"models:\n{models}backends:\n  - {{name: b, engine: vllm, url: 'http://127.0.0.1:1', model: a}}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "f.yaml")
    return info.value.problems


def test_an_alias_that_shadows_a_model_name_is_refused_at_its_line() -> None:
    found = problems("  - {name: a, aliases: [x]}\n  - name: x\n    aliases: [a]\n")
    assert found == [
        "f.yaml:2: models[0].aliases[0]: 'x' is a model's name (an alias cannot shadow it)",
        "f.yaml:4: models[1].aliases[0]: 'a' is a model's name (an alias cannot shadow it)",
    ]


def test_the_same_alias_on_two_models_is_refused() -> None:
    found = problems("  - {name: a, aliases: [chat]}\n  - {name: c, aliases: [chat]}\n")
    assert found == ["f.yaml:3: models[1].aliases[0]: 'chat' is already an alias of model 'a'"]


def test_a_fallback_naming_an_unknown_model_or_an_alias_is_refused() -> None:
    found = problems("  - name: a\n    aliases: [chat]\n    fallbacks:\n      - nope\n      - chat\n")
    assert found == [
        "f.yaml:5: models[0].fallbacks[0]: unknown model 'nope' (known: a)",
        "f.yaml:6: models[0].fallbacks[1]: 'chat' is an alias of 'a' (name the model)",
    ]


def test_a_chain_that_cycles_is_refused_naming_the_cycle() -> None:
    found = problems("  - {name: a, fallbacks: [c]}\n  - {name: c, fallbacks: [{model: d, when: [overloaded]}]}\n"
                     "  - {name: d, fallbacks: [a]}\n")  # fmt: skip
    assert found == ["f.yaml:2: models[0].fallbacks: the chain cycles: a -> c -> d -> a"]
    assert problems("  - {name: a, fallbacks: [a]}\n") == ["f.yaml:2: models[0].fallbacks: the chain cycles: a -> a"]


def test_unknown_causes_and_embedding_chains_are_refused() -> None:
    found = problems("  - {name: a, fallbacks: [{model: c, when: [sometimes]}]}\n  - {name: c}\n")
    assert len(found) == 1 and found[0].startswith("f.yaml:2: models[0].fallbacks[0]") and "context_window" in found[0]
    found = problems("  - {name: a}\n  - {name: e, kind: embed, fallbacks: [a]}\n")
    assert found == [
        "f.yaml:3: models[1].fallbacks: embedding models have no fallbacks "
        "(the vectors of another model mean other things)"
    ]


def test_chains_follow_each_fallback_s_own_chain_narrowed_to_the_causes_that_led_there() -> None:
    ctx = frozenset({"context_window"})
    graph = {
        "a": [Step("b"), Step("long", ctx)],
        "b": [Step("c"), Step("long")],
        "long": [Step("c")],
        "c": [],
    }
    assert cycle(graph) is None
    assert chains(graph)["a"] == (Step("b"), Step("long", ctx), Step("c"))
    assert chains(graph)["long"] == (Step("c", frozenset(CAUSES)),)
    assert "c" not in chains(graph)


EXPLAINED = """
models:
  - name: llama-8b
    gguf: "{GGUF}"
    context: 64
    aliases: [chat-default]
    fallbacks:
      - {model: llama-8b-32k, when: [context_window]}
      - llama-8b-trt
  - {name: llama-8b-32k, gguf: "{GGUF}"}
  - {name: llama-8b-trt, gguf: "{GGUF}"}
backends:
  - {name: vllm-a, engine: vllm, url: "http://127.0.0.1:9", model: llama-8b}
  - {name: big, engine: vllm, url: "http://127.0.0.1:9", model: llama-8b-32k}
  - {name: trt, engine: trtllm_serve, url: "http://127.0.0.1:9", model: llama-8b-trt}
"""


def test_route_explain_shows_the_chain_and_which_steps_the_request_would_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "c.yaml", EXPLAINED)
    assert main(["route", "explain", "--config", str(config), "--model", "chat-default", "--prompt-tokens", "20"]) == 0
    fits = capsys.readouterr().out
    assert "request: model llama-8b," in fits and "(now it can)" in fits
    assert " 1. llama-8b-32k  when context_window: would take it: big first" in fits
    assert " 2. llama-8b-trt  when any cause: would take it: trt first" in fits
    assert main(["route", "explain", "--config", str(config), "--model", "llama-8b", "--prompt-tokens", "200"]) == 0
    too_long = capsys.readouterr().out
    assert "decision: nothing_fits" in too_long and "(now: context_window" in too_long
    assert " *1. llama-8b-32k" in too_long and " *2. llama-8b-trt" in too_long


def test_the_worked_example_of_the_docs_is_a_valid_config() -> None:
    page = (Path(__file__).parents[2] / "docs" / "traffic.md").read_text()
    section = page.split("## Aliases and fallbacks", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    config, _ = parse_config(example, "traffic.md")
    llama = next(m for m in config.models if m.name == "llama-8b")
    assert llama.aliases == ["gpt-4o-mini", "chat-default"]
    assert (llama.fallbacks[0].model, llama.fallbacks[0].when) == ("llama-8b-128k", ["context_window"])


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        (Reason.NO_HEALTHY_BACKEND, "unavailable"),
        (Reason.NO_BACKEND_FOR_MODEL, "unavailable"),
        (Reason.OVERLOADED, "overloaded"),
        (Reason.BUDGET_UNMEETABLE, "budget"),
        (Reason.NOTHING_FITS, "context_window"),
        (Reason.UNSUPPORTED, None),  # the client's to change: a 400, not another model
        (Reason.NO_BUDGET, None),
    ],
)
def test_routing_refusals_map_to_the_fallback_causes(reason: Reason, cause: str | None) -> None:
    assert decision_cause(Decision(reason=reason, candidates=())) == cause
