"""The config as a picker's pool: which backends can be endpoints, and what each endpoint is."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import LoadedConfig, load_config
from gateway.epp.pool import Pool, endpoint_of, problems
from tests.conftest import write_config


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("http://10.0.0.1:8000", "10.0.0.1:8000"),
        ("http://10.0.0.1", "10.0.0.1:80"),
        ("https://10.0.0.1/", "10.0.0.1:443"),
        ("http://[fd00::5]:8000", "[fd00::5]:8000"),
        ("http://vllm-0.vllm:8000", "vllm-0.vllm:8000"),
    ],
)
def test_an_engine_url_is_its_endpoint(url: str, endpoint: str) -> None:
    assert endpoint_of(url) == endpoint


def _loaded(tmp_path: Path, backends: str, extra: str = "") -> LoadedConfig:
    return load_config(
        write_config(
            tmp_path / "pool.yaml",
            f"""{extra}
models:
  - {{name: m8b, params_b: 8, context: 8192}}
  - {{name: other, params_b: 8, context: 8192}}
backends:
{backends}""",
        )
    )


def test_backends_that_cannot_be_endpoints_are_named(tmp_path: Path) -> None:
    loaded = _loaded(
        tmp_path,
        """  - {name: native, engine: tgi, url: "http://10.0.0.1:80", model: m8b}
  - {name: renamed, engine: vllm, url: "http://10.0.0.2:8000", model: m8b, served_model: meta/llama}
  - {name: prefixed, engine: vllm, url: "http://10.0.0.3:8000/v1", model: m8b}
  - {name: first, engine: vllm, url: "http://10.0.0.4:8000", model: m8b}
  - {name: again, engine: llama_server, url: "http://10.0.0.4:8000/", model: m8b}
  - {name: fine, engine: vllm, url: "http://10.0.0.4:8000", model: other}
""",
        extra="auth: {required: true}",
    )
    found = "\n".join(problems(loaded))
    assert "auth: keys are not enforced in picker mode" in found
    assert "backend native: engine tgi does not speak OpenAI's routes" in found
    assert "backend renamed: served_model meta/llama differs from model m8b" in found
    assert "backend prefixed: url http://10.0.0.3:8000/v1 has a path" in found
    assert "backends first and again are the same endpoint for model m8b" in found
    assert "fine" not in found  # one endpoint serving two models is two backends
    assert len(problems(loaded)) == 5


def test_an_endpoint_serving_two_models_is_two_backends(tmp_path: Path) -> None:
    loaded = _loaded(
        tmp_path,
        """  - {name: a, engine: vllm, url: "http://10.0.0.4:8000", model: m8b}
  - {name: b, engine: vllm, url: "http://10.0.0.4:8000", model: other}
""",
    )
    pool = Pool.of(loaded)
    assert problems(loaded) == []
    assert (pool.backend("10.0.0.4:8000", "m8b"), pool.backend("10.0.0.4:8000", "other")) == ("a", "b")
    assert pool.backend("10.0.0.5:8000", "m8b") is None


def test_the_command_refuses_a_config_it_cannot_pick_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(
        tmp_path / "bad.yaml",
        """models:
  - {name: m8b, params_b: 8, context: 8192}
backends:
  - {name: native, engine: tgi, url: "http://10.0.0.1:80", model: m8b}
""",
    )
    assert main(["epp", "--config", str(config), "--port", "0", "--log-format", "text"]) == 1
    assert "backend native: engine tgi does not speak OpenAI's routes" in capsys.readouterr().err


def test_a_split_arm_naming_a_model_is_refused_in_picker_mode(tmp_path: Path) -> None:
    """The proxy forwards the client's body as it is: an arm that sends requests to another model
    would reach that model's engine under the model the client named."""
    split = "split: [{to: a, weight: 90}, {to: other, weight: 10}]"
    rules = f"routing:\n  rules:\n    - {{name: v2, match: {{models: [m8b]}}, {split}}}\n"
    backends = """  - {name: a, engine: vllm, url: "http://10.0.0.1:8000", model: m8b}
  - {name: b, engine: vllm, url: "http://10.0.0.2:8000", model: other}
"""
    loaded = _loaded(tmp_path, backends + rules)
    assert problems(loaded) == [f"{loaded.path}: enginegate epp: rule v2: split arm other names a model; picker mode "
                                "forwards the client's body as it is, so arms name backends or pools"]  # fmt: skip
