"""Config validation: unknown keys rejected, every error names file, line and key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config, parse_config
from tests.conftest import ROOT, write_config

GOOD = """
models:
  - name: m
    gguf: "{GGUF}"
backends:
  - name: b
    engine: ctranslate2
    model: m
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "f.yaml")
    return info.value.problems


def test_embedded_default_is_valid() -> None:
    loaded = load_config(ROOT / "configs" / "default.yaml")
    # CTranslate2 in process for text, and for embeddings (the demo model's own token embeddings)
    assert [(b.engine, loaded.model(b.model).kind) for b in loaded.config.backends] == [
        ("ctranslate2", "generate"),
        ("ctranslate2", "embed"),
    ]
    assert all(loaded.resolve(m.gguf or "").is_file() for m in loaded.config.models)


def test_unknown_key_names_file_line_and_key() -> None:
    text = GOOD.replace("    engine: ctranslate2\n", "    engine: ctranslate2\n    thread: 2\n")
    assert problems(text) == ["f.yaml:8: backends[0].thread: unknown key 'thread'"]


def test_wrong_type_and_unknown_engine_are_reported_together() -> None:
    text = GOOD.replace("    gguf:", "    params_b: big\n    gguf:").replace("engine: ctranslate2", "engine: vllm-ish")
    found = problems(text)
    assert "f.yaml:4: models[0].params_b: Input should be a valid number" in found
    assert any(p.startswith("f.yaml:8: backends[0].engine: unknown engine 'vllm-ish'") for p in found)


def test_reference_to_unknown_model_and_duplicates() -> None:
    text = GOOD.replace("model: m", "model: nope") + "  - {name: b, engine: llama_cpp, model: m}\n"
    found = problems(text)
    assert "f.yaml:9: backends[1].name: duplicate name 'b'" in found
    assert "f.yaml:8: backends[0].model: unknown model 'nope' (known: m)" in found


def test_yaml_syntax_error_has_a_line() -> None:
    assert problems("models:\n  - name: [unclosed\n")[0].startswith("f.yaml:3: invalid YAML")


def test_missing_model_file_is_reported_with_its_line(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", GOOD.replace('"{GGUF}"', "missing.gguf"))
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.problems[0].startswith(f"{config}:4: models[0].gguf: no such file")


def run_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "config", "check", str(path)], capture_output=True, text=True, cwd=ROOT
    )


def test_config_check_command_exit_codes(tmp_path: Path) -> None:
    ok = run_check(write_config(tmp_path / "ok.yaml", GOOD))
    assert ok.returncode == 0, ok.stderr
    bad = run_check(write_config(tmp_path / "bad.yaml", GOOD + "colour: red\n"))
    assert bad.returncode == 1
    assert bad.stderr.strip() == f"{tmp_path / 'bad.yaml'}:9: colour: unknown key 'colour'"


def test_a_rule_on_a_header_routing_never_reads_is_refused() -> None:
    """It would silently never match (found by an outside audit)."""
    text = GOOD + "routing:\n  rules:\n    - name: r\n      match: {headers: {x-t: trt}}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    assert "x-t cannot be matched" in info.value.problems[0]
    parse_config(GOOD + "routing:\n  rules:\n    - name: r\n      match: {headers: {x-tenant: a}}\n", "c.yaml")


def test_prefix_block_size_is_configured_in_tokens_and_sharing_needs_redis() -> None:
    assert any("routing.prefix.block_tokens" in p for p in problems(GOOD + "routing: {prefix: {block_tokens: 2}}\n"))
    shared = problems(GOOD + "routing: {prefix: {share: true}}\n")
    assert any("routing.prefix.share: needs redis.url" in p for p in shared)


def test_the_configured_block_size_reaches_the_request_path(tmp_path: Path) -> None:
    from gateway.state import Runtime

    path = write_config(tmp_path / "f.yaml", GOOD + "routing: {prefix: {block_tokens: 16}}\n")
    assert Runtime.of(load_config(path)).block_bytes == 64
    assert Runtime.of(load_config(write_config(tmp_path / "g.yaml", GOOD))).block_bytes == 256


def test_kv_events_need_the_model_tokenizer() -> None:
    text = """
models: [{name: m, params_b: 8}]
backends: [{name: v, engine: vllm, url: "http://v:8000", model: m, kv_events: {endpoint: "tcp://v:5557"}}]
"""
    assert any("backends[0].kv_events: model 'm' has no gguf" in p for p in problems(text))
    assert any("kv_events.endpoint" in p for p in problems(text.replace("tcp://v:5557", "http://v")))


def test_the_load_bound_reaches_routing_and_retired_weights_load_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gateway.state import Runtime

    assert any("routing.prefix.load_bound" in p for p in problems(GOOD + "routing: {prefix: {load_bound: 0.5}}\n"))
    path = write_config(tmp_path / "f.yaml", GOOD + "routing:\n  prefix: {load_bound: 1.5}\n  weights: {load: 0.2}\n")
    with caplog.at_level("WARNING", logger="enginegate.config"):
        loaded = load_config(path)
    assert Runtime.of(loaded).rules.load_bound == 1.5
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}:11: routing.weights.load: no longer used: queueing and cached prefill are in the predicted "
        "times; see routing.prefix.load_bound"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="enginegate.config"):
        assert Runtime.of(load_config(write_config(tmp_path / "g.yaml", GOOD))).rules.load_bound == 1.25
    assert not caplog.records
