"""The console in headless Chromium against a real gateway process in front of contract fakes (TGI and
trtllm-serve, as their own processes) and a backend that is down: refused without the admin key, then the
fleet table with every backend's health and why, the live list of routing decisions, an explanation, a
rejected reload with its errors in place, and the what-if panel. Screenshots go to the test's tmp_path;
the browser's console must stay free of errors (the 4xx answers a test provokes on purpose aside)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.chaos.fleet import FakeProcess
from tests.conftest import GatewayProcess, free_port, wait_ready, write_config
from tests.console.browser import BrowserLog, labelled, start

ADMIN_ENV, ADMIN_KEY = "EG_CONSOLE_ADMIN_KEY", "console-admin-key"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
MODEL = "enginegate-demo"
WAIT_S = 30.0
"""Deadline of every wait on the page (polled; the console itself polls every 2 s)."""


def config_text(fakes: dict[str, FakeProcess], down_port: int, extra: str = "") -> str:
    lines = [
        "limits: {health_interval_s: 0.3}",
        f"admin: {{api_key_env: {ADMIN_ENV}, max_failures: 20}}",
        f'models: [{{name: {MODEL}, gguf: "{{GGUF}}"}}]',
        "backends:",
        *(
            f"  - {{name: {name}, engine: {fake.kind}, url: '{fake.url}', model: {MODEL}, default_max_tokens: 16}}"
            for name, fake in fakes.items()
        ),
        f"  - {{name: down-c, engine: vllm, url: 'http://127.0.0.1:{down_port}', model: {MODEL},"
        " connect_timeout_s: 0.5}",
        extra,
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, FakeProcess]]:
    work = tmp_path_factory.mktemp("console-fakes")
    procs = {
        "tgi-a": FakeProcess("tgi-a", "tgi", work, seed=1, fault_rate=0.0),
        "trtllm-b": FakeProcess("trtllm-b", "trtllm_serve", work, seed=2, fault_rate=0.0),
    }
    try:
        for fake in procs.values():
            fake.start()
        for fake in procs.values():
            wait_ready(fake.url, fake.proc, timeout=60, path="/_chaos/state")
        yield procs
    finally:
        for fake in procs.values():
            fake.stop()


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory, fakes: dict[str, FakeProcess]) -> Path:
    """The gateway's config file (a test may rewrite it and reload, and puts it back)."""
    return write_config(tmp_path_factory.mktemp("console") / "gateway.yaml", config_text(fakes, free_port()))


@pytest.fixture(scope="module")
def gateway(config: Path, cache_dir: Path) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(config, cache_dir, env={ADMIN_ENV: ADMIN_KEY})
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    d = start(tmp_path_factory.mktemp("chromium") / "profile")
    yield d
    d.quit()


@pytest.fixture
def browser_log(driver: Any) -> Iterator[BrowserLog]:
    log = BrowserLog(driver)
    log.read()  # what earlier tests left is theirs
    log.seen.clear()
    yield log
    assert log.errors() == [], f"errors in the browser console: {json.dumps(log.seen, indent=1)}"


def _wait(driver: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition, f"the page never showed {what}")


def _by_id(driver: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def _rows(driver: Any, table_id: str) -> list[list[str]]:
    """The text of each body row's cells (header cells included), read in one script: the console
    redraws its tables every 2 s, and element handles kept across a redraw would go stale."""
    rows: list[list[str]] = driver.execute_script(
        "const t = document.getElementById(arguments[0]);"
        "return t ? [...t.tBodies[0].rows].map(r => [...r.cells].map(c => c.innerText)) : [];",
        table_id,
    )
    return rows


def _open(driver: Any, gw: GatewayProcess, signed_in: bool) -> None:
    """The console freshly loaded, signed out or signed in with the key typed into the form."""
    from selenium.webdriver.common.keys import Keys

    driver.get(f"{gw.base_url}/console")
    state = _wait(driver, lambda d: _state(d) in ("signed-in", "signed-out") and _state(d), "a settled sign-in state")
    if state == "signed-in":  # the tab still held the last test's key: signed out as a person would
        _by_id(driver, "signout").click()
    _wait(driver, lambda d: _state(d) == "signed-out" and _by_id(d, "login").is_displayed(), "the sign-in form")
    if signed_in:
        _by_id(driver, "admin-key").send_keys(ADMIN_KEY, Keys.ENTER)  # the keyboard alone signs in
        _wait(driver, lambda d: _state(d) == "signed-in" and _by_id(d, "console").is_displayed(), "the panels")


def _state(driver: Any) -> str:
    """The console's sign-in state (``body[data-state]``): loading, signing-in, signed-in or signed-out."""
    return str(driver.execute_script("return document.body.dataset.state"))


def _submit(driver: Any, form_id: str) -> None:
    """Press the form's submit button, as a person would."""
    from selenium.webdriver.common.by import By

    _by_id(driver, form_id).find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def _shot(driver: Any, tmp_path: Path, name: str, element_id: str) -> None:
    """A screenshot with ``element_id`` (what the test just checked) in view."""
    driver.execute_script("document.getElementById(arguments[0]).scrollIntoView({block: 'center'})", element_id)
    path = tmp_path / f"{name}.png"
    assert driver.save_screenshot(str(path)) and path.stat().st_size > 0


def test_the_page_and_the_api_are_refused_without_the_admin_key(
    driver: Any, gateway: GatewayProcess, browser_log: BrowserLog, tmp_path: Path
) -> None:
    from selenium.webdriver.common.keys import Keys

    for path in ("/admin/fleet", "/admin/decisions"):
        assert httpx.get(f"{gateway.base_url}{path}", timeout=10).status_code == 401
        wrong = {"authorization": "Bearer not-the-key"}
        assert httpx.get(f"{gateway.base_url}{path}", headers=wrong, timeout=10).status_code == 401
    _open(driver, gateway, signed_in=False)
    assert not _by_id(driver, "console").is_displayed()
    assert _rows(driver, "fleet-table") == [] and "tgi-a" not in driver.page_source
    browser_log.expect("/admin/fleet", 401)
    _by_id(driver, "admin-key").send_keys("not-the-key", Keys.ENTER)
    _wait(driver, lambda d: "refused the key (401)" in _by_id(d, "login-error").text, "the refusal")
    assert not _by_id(driver, "console").is_displayed()
    assert "tgi-a" not in driver.page_source and driver.execute_script("return sessionStorage.length") == 0
    assert "not-the-key" not in driver.current_url
    _shot(driver, tmp_path, "refused", "login")


def test_the_fleet_and_the_last_decisions_are_shown_live(
    driver: Any, gateway: GatewayProcess, browser_log: BrowserLog, tmp_path: Path
) -> None:
    _open(driver, gateway, signed_in=True)

    def fleet_rows(d: Any) -> dict[str, list[str]] | None:
        rows = {r[0]: r for r in _rows(d, "fleet-table")}
        return rows if set(rows) == {"tgi-a", "trtllm-b", "down-c"} and "healthy" in rows["tgi-a"] else None

    rows = _wait(driver, fleet_rows, "the three backends")
    assert rows["tgi-a"][1] == "tgi" and rows["trtllm-b"][1] == "trtllm_serve"
    assert rows["tgi-a"][3] == "healthy" and rows["trtllm-b"][3] == "healthy"
    down = rows["down-c"][3]
    assert down.startswith("unhealthy") and len(down.splitlines()) == 2, down  # and why, on its own line
    # Two requests routed: the decisions table, polled, shows them (newest first) with their candidates.
    ids = []
    for _ in range(2):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
        resp = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        ids.append(resp.headers["x-request-id"])

    def decisions(d: Any) -> list[list[str]] | None:
        rows = _rows(d, "decisions-table")
        return rows if [r[1] for r in rows[:2] if len(r) > 1] == ids[::-1] else None

    latest = _wait(driver, decisions, "the two routed requests")[0]
    assert latest[2] == MODEL and latest[4] in ("no_budget", "meets_budget", "best_effort")
    assert "tgi-a" in latest[6] and "trtllm-b" in latest[6] and "TTFT" in latest[6] and "down-c" in latest[6]
    # Screen readers: captions, header cells with their scope, a label on every control.
    for table in ("fleet-table", "decisions-table"):
        assert driver.execute_script(f"return document.querySelector('#{table} caption').textContent.length") > 0
        scopes = driver.execute_script(
            f"return [...document.querySelectorAll('#{table} th')].map(t => [t.parentNode.parentNode.tagName, t.scope])"
        )
        assert scopes and all(scope == {"THEAD": "col", "TBODY": "row"}[part] for part, scope in scopes), scopes
    controls = driver.execute_script("return [...document.querySelectorAll('input, textarea')].map(e => e.id)")
    assert len(controls) >= 10 and labelled(driver, controls) == []
    _shot(driver, tmp_path, "fleet-and-decisions", "fleet")


def test_a_backend_going_down_and_back_is_shown_and_announced(
    driver: Any, gateway: GatewayProcess, fakes: dict[str, FakeProcess], browser_log: BrowserLog, tmp_path: Path
) -> None:
    from selenium.webdriver.common.keys import Keys

    _open(driver, gateway, signed_in=True)
    _wait(driver, lambda d: any(r[0] == "trtllm-b" and r[3] == "healthy" for r in _rows(d, "fleet-table")), "trtllm-b")
    fake = fakes["trtllm-b"]
    fake.kill()
    try:
        said = _wait(
            driver, lambda d: "trtllm-b" in (t := _by_id(d, "announce").get_attribute("textContent")) and t, "a word"
        )
        assert said.startswith("trtllm-b is now unhealthy: "), said  # read out by screen readers, with why
        row = next(r for r in _rows(driver, "fleet-table") if r[0] == "trtllm-b")
        assert row[3].startswith("unhealthy\n"), row
        _shot(driver, tmp_path, "backend-down", "fleet")
    finally:
        fake.start()
        wait_ready(fake.url, fake.proc, timeout=60, path="/_chaos/state")
    _wait(
        driver, lambda d: "trtllm-b is now healthy." in _by_id(d, "announce").get_attribute("textContent"), "recovery"
    )
    # The keyboard reaches the controls, and the one in focus shows it.
    body = driver.find_element("css selector", "body")
    body.send_keys(Keys.TAB)
    focused = driver.execute_script(
        "return [document.activeElement.tagName, getComputedStyle(document.activeElement).outlineStyle]"
    )
    assert focused[0] in ("A", "BUTTON", "INPUT", "TEXTAREA", "DIV") and focused[1] != "none", focused


def test_an_explanation_is_rendered_with_the_ranked_candidates_and_their_terms(
    driver: Any, gateway: GatewayProcess, browser_log: BrowserLog, tmp_path: Path
) -> None:
    _open(driver, gateway, signed_in=True)
    _by_id(driver, "explain-model").send_keys(MODEL)
    tokens = _by_id(driver, "explain-prompt-tokens")
    tokens.clear()
    tokens.send_keys("500")
    _by_id(driver, "explain-ttft").send_keys("5000")
    _submit(driver, "explain-form")
    rows = _wait(
        driver, lambda d: d.find_elements("id", "explain-table") and _rows(d, "explain-table"), "an explanation"
    )
    assert {r[1] for r in rows} == {"tgi-a", "trtllm-b"}, rows  # down-c is left out, with its reason
    assert [r[0] for r in rows] == ["1", "2"] and float(rows[0][2]) >= float(rows[1][2])
    headers = driver.execute_script(
        "return [...document.querySelectorAll('#explain-table thead th')].map(t => t.textContent)"
    )
    assert "TTFT ms" in headers and any(h.endswith(" term") for h in headers), headers
    result = _by_id(driver, "explain-result").text
    assert "Decision:" in result and "down-c" in result
    _shot(driver, tmp_path, "explain", "explain-result")


def test_a_rejected_reload_is_shown_next_to_the_config_with_its_errors(
    driver: Any, gateway: GatewayProcess, config: Path, browser_log: BrowserLog, tmp_path: Path
) -> None:
    good = config.read_text()
    _open(driver, gateway, signed_in=True)
    config.write_text(good.replace("engine: tgi,", "engne: tgi,"))
    browser_log.expect("/admin/reload", 422)
    try:
        _by_id(driver, "reload").click()
        _wait(driver, lambda d: "Rejected" in _by_id(d, "reload-result").text, "the rejection")
        problems = driver.execute_script(
            "return [...document.querySelectorAll('#reload-result ul.problems li')].map(li => li.textContent)"
        )
        assert problems and all(p.startswith(f"{config}:") for p in problems), problems
        # Exactly the endpoint's own problems, in place (its wording is the config loader's).
        again = httpx.post(f"{gateway.base_url}/admin/reload", headers=ADMIN, timeout=30)
        assert again.status_code == 422 and again.json()["problems"] == problems
        assert "the running config is kept" in _by_id(driver, "reload-result").text
        _shot(driver, tmp_path, "reload-rejected", "reload-result")
    finally:
        config.write_text(good)
    _by_id(driver, "reload").click()
    _wait(driver, lambda d: "Reloaded from" in _by_id(d, "reload-result").text, "the reload")
    _shot(driver, tmp_path, "reloaded", "reload-result")


def test_the_what_if_panel_sends_an_uploaded_config_and_renders_the_answer(
    driver: Any, gateway: GatewayProcess, config: Path, browser_log: BrowserLog, tmp_path: Path
) -> None:
    diff = f"{gateway.base_url}/admin/config/diff"
    offered = httpx.post(diff, json={"yaml": config.read_text()}, headers=ADMIN, timeout=60)
    _open(driver, gateway, signed_in=True)
    _by_id(driver, "config-file").send_keys(str(config))  # uploaded: read into the text box
    _wait(driver, lambda d: _by_id(d, "config-yaml").get_attribute("value") == config.read_text(), "the file read")
    if offered.status_code == 404:
        browser_log.expect("/admin/config/diff", 404)
    _submit(driver, "diff-form")
    if offered.status_code == 404:
        _wait(driver, lambda d: "not available" in _by_id(d, "diff-result").text, "the what-if's absence")
    else:
        assert offered.status_code == 200, offered.text
        _wait(driver, lambda d: "What would change" in _by_id(d, "diff-result").text, "the what-if answer")
        script = "return [...document.querySelectorAll('#diff-result h4')].map(h => h.textContent)"
        headings = driver.execute_script(script)
        assert headings == list(offered.json()), headings  # every part of the answer, in its order
        assert "[object" not in _by_id(driver, "diff-result").text  # every value drawn, none stringified whole
        table = offered.json()["table"]
        if len(table) >= 2:  # the simulated attainment plotted too: one line per config
            lines = driver.execute_script("return document.querySelectorAll('#diff-result figure svg path').length")
            assert lines == len({row["config"] for row in table}), (lines, table)
    _shot(driver, tmp_path, "what-if", "diff-result")
    # Signing out forgets the key and clears every panel.
    _by_id(driver, "signout").click()
    _wait(driver, lambda d: _by_id(d, "login").is_displayed(), "the sign-in form again")
    assert driver.execute_script("return sessionStorage.length") == 0 and _rows(driver, "fleet-table") == []


def test_the_traffic_panel_shows_each_split_arm_and_the_shadow_comparison(
    driver: Any, fakes: dict[str, FakeProcess], cache_dir: Path, browser_log: BrowserLog, tmp_path: Path
) -> None:
    """A gateway whose rule splits 50/50 between the two fakes and mirrors every request to the second:
    the console's traffic panel shows both arms with their counts and the shadow pair."""
    rules = (
        "routing:\n  rules:\n    - name: trial\n      match: {models: [" + MODEL + "]}\n"
        "      split: [{to: tgi-a, weight: 50}, {to: trtllm-b, weight: 50}]\n"
        "      shadow: {to: trtllm-b, share: 1.0}\n"
    )
    config = write_config(tmp_path / "traffic.yaml", config_text(fakes, free_port(), rules))
    gw = GatewayProcess(config, cache_dir, env={ADMIN_ENV: ADMIN_KEY})
    try:
        for i in range(6):
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"Hello {i}"}], "max_tokens": 4}
            resp = httpx.post(f"{gw.base_url}/v1/chat/completions", json=body, timeout=60)
            assert resp.status_code == 200, resp.text
        _open(driver, gw, signed_in=True)

        def arms(d: Any) -> dict[str, list[str]] | None:
            rows = d.execute_script(
                "return [...document.querySelectorAll('#splits-result tbody tr')]"
                ".map(r => [...r.cells].map(c => c.innerText))"
            )
            found = {r[0]: r for r in rows}
            return found if set(found) == {"tgi-a", "trtllm-b"} else None

        shown = _wait(driver, arms, "both arms of the split")
        assert sum(int(row[3]) for row in shown.values()) == 6  # every request counted on its arm

        def shadowed(d: Any) -> bool:
            text = d.execute_script("return document.getElementById('shadow-result').innerText")
            return "trtllm-b" in text and "pairs in memory" in text

        _wait(driver, shadowed, "the shadow comparison")
        _shot(driver, tmp_path, "traffic-splits", "splits-result")
        _shot(driver, tmp_path, "traffic-shadow", "shadow-result")
    finally:
        _by_id(driver, "signout").click()
        gw.stop()
