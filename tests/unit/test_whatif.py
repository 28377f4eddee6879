"""What-if: ``enginegate config diff`` over a recorded request log, ``POST /admin/config/diff`` against the
live config, and a reload that answers with what it applied (issue 25, item 2)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.cli import main
from gateway.config import load_config
from gateway.whatif.records import from_log
from tests.fakes import serve_in_thread
from tests.whatif_traffic import capture, send, sized

DATA = Path(__file__).resolve().parents[1] / "data" / "whatif"
OLD, NEW, LOG = DATA / "old.yaml", DATA / "new.yaml", DATA / "requests.jsonl"
ADMIN = {"authorization": "Bearer what-if-key"}


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["config", "diff", str(OLD), str(NEW), "--json", *args]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_config_diff_names_every_change_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "diff", str(OLD), str(NEW)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1:] == [
        "  ~ routing.weights.cost: 0.2 -> 0.5",
        "  ~ routing.rules[interactive].prefer: ['vllm-h100-a'] -> ['trt-h100']",
        "  - backends[vllm-h100-b]",
        "  + backends[trt-h100]",
        "  ~ backends[vllm-4xa100-70b].cost_per_hour: 12.0 -> 10.0",
    ]
    doc = cli_json(capsys)
    assert doc["summary"] == {
        "added": ["backends[trt-h100]"],
        "removed": ["backends[vllm-h100-b]"],
        "changed": ["routing.rules[interactive]", "backends[vllm-4xa100-70b]"],
    }
    assert doc["moves"] == {} and doc["table"] == []  # nothing replayed


def test_config_diff_over_the_recorded_log_moves_interactive_traffic_and_simulates_both(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logged = [r for r in (from_log(json.loads(line)) for line in LOG.read_text().splitlines()) if r is not None]
    assert len(logged) == 60
    interactive_8b = sum(
        1 for r in logged if r.features.model == "llama-3.1-8b" and (r.features.ttft_budget_ms or 1e9) <= 1000
    )
    doc = cli_json(capsys, "--replay", str(LOG))
    moves = doc["moves"]
    # The rule that sent interactive 8B requests to vllm-h100-a now prefers trt-h100: exactly those move.
    assert moves["requests"] == 60 and moves["moved"] == interactive_8b > 0
    assert [m for m in moves["from_to"] if m["from"] != m["to"]] == [
        {"from": "vllm-h100-a", "to": "trt-h100", "count": interactive_8b}
    ]
    assert not any(m["to"] == "vllm-h100-b" for m in moves["from_to"])  # removed: nothing goes there
    table = doc["table"]
    assert [(row["config"], row["scale"]) for row in table] == [
        ("old", 1.0), ("new", 1.0), ("old", 2.0), ("new", 2.0), ("old", 4.0), ("new", 4.0),
    ]  # fmt: skip
    span = max(r.arrived_at for r in logged) - min(r.arrived_at for r in logged)
    assert table[0]["rate_rps"] == pytest.approx(59 / span, rel=1e-3)
    assert {row["gpu_usd_per_hour"] for row in table if row["config"] == "old"} == {20.0}  # 4 + 4 + 12
    assert {row["gpu_usd_per_hour"] for row in table if row["config"] == "new"} == {21.0}  # 4 + 7 + 10
    for row in table:
        assert 0 < row["within_budget_pct"] <= 100 and 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"]
        assert row["busy_gpu_usd_per_hour"] <= row["gpu_usd_per_hour"]
        assert set(row["failures"]) == {"shed", "hopeless", "strict_429", "no_backend", "lost"}
    assert main(["config", "diff", str(OLD), str(NEW), "--replay", str(LOG), "--rate", "2,30"]) == 0
    text = capsys.readouterr().out
    assert f"Routing decisions that move: {interactive_8b} of 60" in text
    assert "within budget %" in text and "TTFT p99 ms" in text and "GPU $/h" in text and "strict 429" in text
    assert " 2.00 " in text and " 30.00 " in text


def test_config_diff_refuses_a_bad_config_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(NEW.read_text().replace("cost: 0.5", "cost: -1"))
    assert main(["config", "diff", str(OLD), str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:" in err and "routing.weights.cost" in err


def drive_and_diff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, Any], list[Any]]:
    """A gateway on ``old.yaml`` takes traffic (its request log captured), then is asked for the diff
    against ``new.yaml`` in both body forms and with a broken config."""
    monkeypatch.setenv("EG_WHATIF_ADMIN", "what-if-key")
    config = tmp_path / "old.yaml"
    shutil.copy(OLD, config)
    log = tmp_path / "requests.jsonl"

    async def go(base: str) -> tuple[dict[str, Any], list[Any]]:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            undo = capture(log)
            try:
                await send(client, 24, seed=11)
            finally:
                undo()
            yaml_answer = await client.post(
                "/admin/config/diff", content=NEW.read_text(), headers={**ADMIN, "content-type": "application/yaml"}
            )
            json_answer = await client.post("/admin/config/diff", json={"yaml": NEW.read_text()}, headers=ADMIN)
            broken = await client.post(
                "/admin/config/diff", content="models: [\n", headers={**ADMIN, "content-type": "application/yaml"}
            )
            invalid = await client.post(
                "/admin/config/diff", json={"yaml": NEW.read_text().replace("engine: trtllm_serve", "engine: nope")},
                headers=ADMIN,
            )  # fmt: skip
            unauthorised = await client.post("/admin/config/diff", json={"yaml": NEW.read_text()})
        assert yaml_answer.status_code == 200, yaml_answer.text
        assert json_answer.json() == yaml_answer.json()
        return yaml_answer.json(), [broken, invalid, unauthorised]

    with serve_in_thread(create_app(load_config(config), sized)) as base:
        doc, refusals = asyncio.run(go(base))
    return log, doc, refusals


def test_the_admin_diff_answers_what_the_cli_says_over_the_same_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log, doc, refusals = drive_and_diff(tmp_path, monkeypatch)
    assert doc["replayed"] == 24
    cli = cli_json(capsys, "--replay", str(log))
    assert doc["moves"]["requests"] == 24 and doc["moves"]["moved"] > 0
    assert {k: doc[k] for k in ("diff", "summary", "moves", "table")} == cli
    broken, invalid, unauthorised = refusals
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_config"
    assert broken.json()["problems"][0].startswith("new config:2: invalid YAML")
    assert invalid.status_code == 400
    problems = invalid.json()["problems"]
    assert problems and all(p.startswith("new config:") for p in problems) and "engine" in problems[0]
    assert unauthorised.status_code == 401


def test_a_reload_answers_with_the_backends_and_settings_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EG_WHATIF_ADMIN", "what-if-key")
    config = tmp_path / "gateway.yaml"
    shutil.copy(OLD, config)

    async def go(base: str) -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            before = await client.post("/admin/config/diff", json={"yaml": NEW.read_text()}, headers=ADMIN)
            assert before.status_code == 200  # no traffic yet: the settings alone
            assert before.json()["replayed"] == 0 and before.json()["moves"] == {} and len(before.json()["diff"]) == 5
            shutil.copy(NEW, config)
            applied = await client.post("/admin/reload", headers=ADMIN)
            config.write_text(NEW.read_text().replace("gpu: A100-80GB, gpu_count: 4", "gpu: L4, gpu_count: 1"))
            impossible = await client.post("/admin/reload", headers=ADMIN)
            assert impossible.status_code == 200, impossible.text  # applied, as at start, and said
            assert [p for p in impossible.json()["placement_errors"] if "can never serve" in p]
            config.write_text("models: [\n")
            return applied, await client.post("/admin/reload", headers=ADMIN)

    with serve_in_thread(create_app(load_config(config), sized)) as base:
        applied, rejected = asyncio.run(go(base))
    assert applied.status_code == 200, applied.text
    body = applied.json()
    assert body["status"] == "reloaded" and body["placement_errors"] == []
    assert body["backends"] == {  # the 70B's price changed: rebuilt
        "kept": ["vllm-h100-a"],
        "started": ["trt-h100", "vllm-4xa100-70b"],
        "retired": ["vllm-h100-b", "vllm-4xa100-70b"],
    }
    paths = [(c["kind"], c["path"]) for c in body["diff"]]
    assert ("added", "backends[trt-h100]") in paths and ("removed", "backends[vllm-h100-b]") in paths
    assert ("changed", "routing.rules[interactive].prefer") in paths
    assert rejected.status_code == 422 and rejected.json()["problems"]


def test_the_diff_matches_entries_by_name_sees_rule_order_and_shows_no_secret() -> None:
    from gateway.config import parse_config
    from gateway.whatif.diff import diff

    base = OLD.read_text()
    third = '  - {name: vllm-h100-c, engine: vllm, url: "http://c:8000", model: llama-3.1-8b, gpu: H100}\n'
    moved = base.replace("backends:\n", "backends:\n" + third)
    old, _ = parse_config(moved)
    lines = moved.splitlines()
    first = next(i for i, line in enumerate(lines) if "vllm-h100-c" in line)
    reordered = "\n".join([*lines[:first], *lines[first + 1 : first + 3], lines[first], *lines[first + 3 :]])
    assert diff(old, parse_config(reordered)[0]) == []  # a backend moved in the file is no change
    rules = "\n    - {name: batch, match: {latency_budget_ms: {min: 60000}}, avoid: [vllm-h100-a]}"
    two, _ = parse_config(moved + rules)
    swapped = moved.replace("  rules:\n", "  rules:" + rules + "\n")
    changes = [c.to_dict() for c in diff(two, parse_config(swapped)[0])]
    assert changes == [
        {"path": "routing.rules", "kind": "reordered", "old": ["interactive", "batch"], "new": ["batch", "interactive"]}
    ]
    secret = "redis: {url: 'redis://:hunter2@cache:6379/0'}\n"
    key = f"auth: {{keys: [{{id: 0a1b2c3d, sha256: '{'ab' * 32}'}}]}}\n"
    changes = [c.to_dict() for c in diff(old, parse_config(secret + key + moved)[0])]
    assert {c["path"] for c in changes} == {"auth.keys", "redis.url"}
    shown = json.dumps(changes)
    assert "hunter2" not in shown and "ab" * 32 not in shown and "redis://:***@cache:6379/0" in shown


def test_a_log_captured_with_other_output_replays_its_request_lines(tmp_path: Path) -> None:
    from gateway.whatif.replay import read_requests

    mixed = tmp_path / "serve.log"
    lines = LOG.read_text().splitlines()
    startup = '{"ts": "x", "level": "info", "logger": "enginegate.fleet", "msg": "backend vllm-h100-a healthy"}'
    mixed.write_text(
        "\n".join(["INFO: a line that is not JSON", startup, *lines[:10], "", "Traceback ...", *lines[10:]])
    )
    assert len(read_requests(mixed, [])) == 60
    broken = tmp_path / "broken.log"
    broken.write_text(startup + "\n{not json\n")
    with pytest.raises(ValueError, match=r"broken.log:2: not JSON"):
        read_requests(broken, [])
