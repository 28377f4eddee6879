"""The README's examples run as written against ``make serve``'s embedded default: every ``curl`` line
(sent with the same method, headers and body) and every Python snippet (the official clients)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import GREETING_REPLY, ROOT, GatewayProcess

README = (ROOT / "README.md").read_text()
DEFAULT_URL = "http://127.0.0.1:8000"
CURLS = [b for b in re.findall(r"```sh\n(.*?)```", README, flags=re.S) if b.startswith("curl ")]
SNIPPETS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


@pytest.fixture(scope="module")
def default_gateway(cache_dir: Path) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(ROOT / "configs" / "default.yaml", cache_dir)
    yield proc
    proc.stop()


def _send(command: str, base_url: str) -> httpx.Response:
    """A README curl line, sent with httpx: ``-H`` headers, ``-d`` body (POST), the URL."""
    words = shlex.split(command.replace("\\\n", " "))
    headers: dict[str, str] = {}
    body: str | None = None
    url = ""
    i = 1
    while i < len(words):
        word = words[i]
        if word == "-H":
            name, _, value = words[i + 1].partition(":")
            headers[name.strip()] = value.strip()
            i += 1
        elif word == "-d":
            body = words[i + 1]
            i += 1
        elif word in ("-o", "-D"):
            i += 1  # curl's output files
        elif not word.startswith("-"):
            url = word
        i += 1
    url = url.replace("localhost:8000", base_url.removeprefix("http://"))
    return httpx.request("POST" if body is not None else "GET", f"http://{url}", headers=headers, content=body)


def test_the_readme_has_an_example_per_front_door() -> None:
    text = "".join(CURLS + SNIPPETS)
    for door in ("/v1/chat/completions", "responses.create", "messages.create", "/v1/embeddings"):
        assert door in text


@pytest.mark.parametrize(
    "command", CURLS, ids=[re.findall(r"localhost:8000(\S+)", c)[0] + f"-{i}" for i, c in enumerate(CURLS)]
)
def test_curl_examples_answer(default_gateway: GatewayProcess, command: str) -> None:
    response = _send(command, default_gateway.base_url)
    assert response.status_code == 200, response.text
    assert "server" not in response.headers  # `serve` does not name the server it runs on
    if "/v1/chat/completions" in command and "x-ttft-budget-ms" not in command:
        assert response.json()["choices"][0]["message"]["content"] == GREETING_REPLY  # as the README says
    if "x-ttft-budget-ms" in command:
        assert response.headers["x-enginegate-route"] == "meets_budget"
        assert response.headers["x-enginegate-backend"] == "ct2-local"


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.split("\n")[0].split()[1] for s in SNIPPETS])
def test_python_examples_print_the_answer(default_gateway: GatewayProcess, snippet: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(snippet.replace(DEFAULT_URL, default_gateway.base_url), {})  # the README's own code
    printed = out.getvalue().strip()
    if "temperature=0" in snippet:
        assert printed == GREETING_REPLY
    else:  # Anthropic's default temperature is 1: sampled, any answer
        assert printed
