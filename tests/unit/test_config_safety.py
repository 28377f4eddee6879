"""``config check`` refuses placements that can never serve (the routing filter's own test, with its
numbers), names typos and unknown engines in the file's words, and ``config show``/``config schema``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.config import ConfigError, load_config, parse_config
from tests.conftest import write_config

IMPOSSIBLE = """
models:
  - {name: llama-70b, params_b: 70, dtype: bf16, context: 8192}
  - {name: llama-405b, params_b: 405, dtype: bf16, context: 8192}
  - {name: llama-8b, params_b: 8, dtype: bf16, context: 8192}
backends:
  - {name: big, engine: vllm, model: llama-70b, url: "http://10.0.0.1:8000", gpu: L4}
  - {name: huge, engine: vllm, model: llama-405b, url: "http://10.0.0.2:8000", gpu: A100-80GB, gpu_count: 4}
  - {name: small, engine: vllm, model: llama-8b, url: "http://10.0.0.3:8000", gpu: L4}
"""


def test_config_check_refuses_placements_that_can_never_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path / "c.yaml", IMPOSSIBLE)
    assert main(["config", "check", str(path)]) == 1
    out = capsys.readouterr()
    errors = out.err.splitlines()
    assert len(errors) == 2, errors  # small fits: not named
    assert errors[0].startswith(f"{path}:7: backends[0]: backend big: model llama-70b needs 140.0 GB of weights + ")
    assert "KV for one 8192-token request; 1× L4 has 24 GB (21.6 GB usable at 90% of memory)" in errors[0]
    assert errors[1].startswith(f"{path}:8: backends[1]: backend huge: model llama-405b needs 810.0 GB of weights")
    assert "4× A100-80GB has 320 GB (288.0 GB usable" in errors[1]
    assert all("nothing_fits" in e for e in errors)
    cpu = write_config(tmp_path / "cpu.yaml", IMPOSSIBLE.replace(", gpu: L4}", "}"))
    assert main(["config", "check", str(cpu)]) == 1
    assert "the CPU host has 16 GB (gpu: CPU and no memory_gb: set: the default)" in capsys.readouterr().err
    assert "ok" not in out.out


def test_config_check_passes_a_fitting_fleet_and_warns_of_a_context_too_long(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fitting = IMPOSSIBLE.replace("gpu: L4}", "gpu: H100, gpu_count: 2}").replace("gpu_count: 4", "gpu_count: 16")
    fitting = fitting.replace(
        "  - {name: small", '  - {name: long, engine: vllm, model: long, url: "http://h:1", gpu: L4}\n  - {name: small'
    )
    fitting = fitting.replace("backends:", "  - {name: long, params_b: 8, dtype: bf16, context: 131072}\nbackends:")
    path = write_config(tmp_path / "c.yaml", fitting)
    assert main(["config", "check", str(path)]) == 0
    out = capsys.readouterr()
    assert "ok (4 models, 4 backends)" in out.out
    warnings = out.err.splitlines()
    assert len(warnings) == 1, warnings  # on an L4, 8B with 128k context leaves about 42k tokens
    assert "warning: backend long:" in warnings[0] and "requests over 42724 tokens" in warnings[0]


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "f.yaml")
    return info.value.problems


BACKEND = """
models:
  - {name: m, params_b: 8}
backends:
  - name: b
    engine: vllm
    model: m
    url: http://10.0.0.1:8000
"""


def test_a_typo_of_engine_names_the_key_and_the_known_engines() -> None:
    found = problems(BACKEND.replace("engine: vllm", "engne: vllm"))
    assert len(found) == 1
    assert found[0].startswith("f.yaml:6: backends[0].engne: unknown key 'engne': did you mean 'engine'?")
    assert "known engines: ctranslate2, llama_cpp, vllm," in found[0]
    assert "discriminator" not in found[0] and "tag" not in found[0]


def test_a_backend_without_engine_lists_the_engines() -> None:
    found = problems(BACKEND.replace("    engine: vllm\n", ""))
    assert found == [f"f.yaml:5: backends[0]: every backend needs engine: one of {found[0].split('one of ')[1]}"]
    assert "vllm, trtllm_serve" in found[0]


def test_an_unknown_engine_lists_the_known_ones() -> None:
    found = problems(BACKEND.replace("engine: vllm", "engine: vlm"))
    assert found[0].startswith("f.yaml:6: backends[0].engine: unknown engine 'vlm' (known engines: ctranslate2,")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("url: http://10.0.0.1:8000", "f.yaml:8: backends[0].url: must start with http:// or https://"),
        ("name: b", "f.yaml:5: backends[0].name: must start with a letter or digit"),
        ("model: m", "f.yaml:5: backends[0].model: required, but missing"),
    ],
)
def test_validation_messages_show_no_regex_or_pydantic_terms(change: str, expected: str) -> None:
    replacement = {"url": "url: 10.0.0.1:8000", "name": "name: '-b'", "model": "served_model: m"}[change.split(":")[0]]
    found = problems(BACKEND.replace(change, replacement))
    assert any(p.startswith(expected) for p in found), found
    assert not any(mark in p for p in found for mark in ("pattern", "^", "[^", "Field required", "String should"))


def test_config_show_prints_the_defaults_and_reads_back_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path / "c.yaml", BACKEND)
    assert main(["config", "show", str(path)]) == 0
    shown = capsys.readouterr().out
    doc = yaml.safe_load(shown)
    assert doc["server"]["port"] == 8000 and doc["routing"]["max_attempts"] == 3  # defaults, never written
    assert doc["backends"][0]["engine"] == "vllm" and doc["backends"][0]["max_concurrency"] > 0
    again = write_config(tmp_path / "shown.yaml", shown)
    assert load_config(again).config == load_config(path).config


def test_config_schema_is_json_schema_with_the_reference_descriptions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["title"] == "enginegate config" and set(doc["required"]) == {"models", "backends"}
    server = doc["$defs"]["ServerConfig"]["properties"]["port"]
    assert server["default"] == 8000 and server["description"]  # the attribute docstring, as in the docs
    from tools.config_reference import markdown

    assert server["description"].split("``")[0] in markdown()  # the same words, before the first code span
