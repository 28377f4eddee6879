"""The ``enginegate`` command as an operator meets it: ``--version``, help and defaults on every option,
and ``route explain`` (score terms, the budget applied and its source, JSON, exit codes, sweeps)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gateway.cli import build_parser, main, parsers
from gateway.ops.explain_cmd import EXIT_NO_BACKEND, EXIT_NOTHING_FITS, EXIT_REFUSED
from gateway.telemetry.metrics import version
from tests.conftest import write_config

FLEET = """
models:
  - {name: llama-8b, params_b: 8, dtype: bf16, context: 131072}
  - {name: llama-70b, params_b: 70, dtype: bf16, context: 131072}
backends:
  - {name: a, engine: vllm, model: llama-8b, url: "http://10.0.0.1:8000", gpu: H100}
  - {name: b, engine: vllm, model: llama-8b, url: "http://10.0.0.2:8000", gpu: H100}
  - {name: small, engine: tgi, model: llama-8b, url: "http://10.0.0.3:8000", gpu: L4}
  - {name: big, engine: vllm, model: llama-70b, url: "http://10.0.0.4:8000", gpu: H100, gpu_count: 2}
routing:
  rules:
    - name: chat
      match: {tenants: [chat]}
      default_ttft_budget_ms: 800
"""


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    return write_config(tmp_path / "fleet.yaml", FLEET)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"enginegate {version()} (Python 3.")


def test_every_option_of_every_command_has_help() -> None:
    root = build_parser()
    found = parsers(root)
    assert len(found) > 15, "the walk reaches the subcommands"
    skipped = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    missing = [
        f"{p.prog} {a.option_strings or a.dest}"
        for p in found
        for a in p._actions
        if not isinstance(a, skipped) and not a.help
    ]
    assert missing == []


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--log-level {debug,info,warning,error} log level (default: info)" in text
    assert "--port PORT port to listen on (default: the config's server.port)" in text
    assert "(default: None)" not in text


def explain(fleet: Path, *args: str) -> list[str]:
    return ["route", "explain", "--config", str(fleet), *args]


def test_explain_shows_each_term_of_the_score(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(explain(fleet, "--model", "llama-8b", "--prompt-tokens", "2000")) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("#"))
    assert header.split()[-3:] == ["budget", "cost", "score"]
    assert "cached  saves ms  saves GPU-ms  load/bound  convs  home" in header
    assert "score = (1×budget + 0.2×cost) / 1.2 (routing.weights)" in out
    assert "routing.prefix.load_bound" in out and "at most 1.25x the fair share" in out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line[:1].isdigit()}
    # a and b are the same hardware: the home (the rendezvous of the request's opening) tells them apart
    assert {rows["a"][10], rows["b"][10]} == {"yes", "no"}
    assert rows["a"][8] == "1/1" and rows["a"][9] == "0" and rows["a"][5:8] == ["0", "0.0", "0.0"]


def test_explain_says_which_budget_applied_and_where_it_came_from(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(explain(fleet, "--model", "llama-8b")) == 0
    assert "budget: none" in capsys.readouterr().out
    assert main(explain(fleet, "--model", "llama-8b", "--tenant", "chat")) == 0
    assert "budget: ttft 800 ms (rule chat default)" in capsys.readouterr().out
    assert main(explain(fleet, "--model", "llama-8b", "--tenant", "chat", "--ttft-budget-ms", "300")) == 0
    assert "budget: ttft 300 ms (request)" in capsys.readouterr().out


def test_explain_json_is_the_admin_document(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(explain(fleet, "--model", "llama-8b", "--tenant", "chat", "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["reason"] == "meets_budget" and doc["rule"] == "chat"
    assert doc["budget"]["ttft_ms"] == {"value": 800, "source": "rule chat default"}
    assert doc["budget"]["latency_ms"] == {"value": None, "source": None}
    assert [c["backend"] for c in doc["candidates"]][:2] in (["a", "b"], ["b", "a"])
    assert set(doc["candidates"][0]["terms"]) >= {"budget", "cost"} and doc["load_bound"] == 1.25
    first = doc["candidates"][0]
    assert {k: first[k] for k in ("cache_saves_ms", "cache_saves_gpu_ms", "in_flight", "load_bound")} == {
        "cache_saves_ms": 0.0, "cache_saves_gpu_ms": 0.0, "in_flight": 0, "load_bound": 1,
    }  # fmt: skip


def test_explain_exits_non_zero_when_nothing_fits(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(explain(fleet, "--model", "llama-70b", "--prompt-tokens", "120000")) == EXIT_NOTHING_FITS
    out = capsys.readouterr().out
    assert "decision: nothing_fits" in out and "big: needs" in out


def test_explain_exits_with_its_own_code_on_other_refusals(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(explain(fleet, "--model", "llama-8b", "--needs", "images")) == EXIT_REFUSED
    out = capsys.readouterr().out
    assert "decision: unsupported" in out and "a: lacks images" in out
    assert len({0, 1, 2, EXIT_NOTHING_FITS, EXIT_NO_BACKEND, EXIT_REFUSED}) == 6  # usage errors are argparse's 2


def test_explain_on_an_unknown_model_lists_the_known_ones(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(explain(fleet, "--model", "llama-7b")) == EXIT_NO_BACKEND
    assert "unknown model 'llama-7b' (known: llama-70b, llama-8b)" in capsys.readouterr().err
    assert main(explain(fleet, "--model", "llama-7b", "--json")) == EXIT_NO_BACKEND
    doc = json.loads(capsys.readouterr().out)
    assert doc["reason"] == "no_backend_for_model" and doc["known_models"] == ["llama-70b", "llama-8b"]


def test_explain_sweeps_prompt_lengths(fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "ttft.png"
    args = explain(fleet, "--model", "llama-8b", "--prompt-tokens", "1000,8000,64000", "--plot", str(plot))
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "1000 tok: ttft / e2e ms" in lines[2] and "64000 tok" in lines[2]
    rows = {line.split()[0]: line for line in lines[3:]}
    assert set(rows) == {"a", "b", "small", "decision"}
    assert "excluded: needs" in rows["small"]  # an L4 holds no 64k-token request of an 8B beside its weights
    assert rows["decision"].split()[1:] == ["no_budget"] * 3
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"
    assert main([*args[:-2], "--json"]) == 0
    assert [d["request"]["prompt_tokens"] for d in json.loads(capsys.readouterr().out)["sweep"]] == [1000, 8000, 64000]


def test_a_bad_sweep_is_a_usage_error(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(explain(fleet, "--model", "llama-8b", "--prompt-tokens", "1000,lots"))
    assert done.value.code == 2
    assert "expected token counts such as 1000,8000,32000" in capsys.readouterr().err
