"""Headless Chromium for the console tests: Debian's ``chromium`` and ``chromium-driver`` (``make services``
installs them), driven by selenium pointed at those binaries. Selenium's own manager never runs (it would
download a browser): both paths are given and ``SE_OFFLINE`` is set. Missing either is a failure that
says how to install them, never a skip."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path(os.environ.get("ENGINEGATE_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("ENGINEGATE_CHROMEDRIVER", "/usr/bin/chromedriver"))
_NETWORK = re.compile(r"^(?P<url>\S+) - Failed to load resource: the server responded with a status of (?P<status>\d+)")


def start(profile: Path) -> Any:
    """A headless Chromium session (selenium's ``webdriver.Chrome``) with the browser log kept."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"The console tests need Debian's chromium and chromium-driver ({', '.join(missing)} missing): "
            "run `make services` (apt-get install chromium chromium-driver).",
            pytrace=False,
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("The console tests need selenium: pip install -e '.[test]'.", pytrace=False)
    os.environ["SE_OFFLINE"] = "true"  # selenium-manager must never fetch a browser or a driver
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in CI containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--disable-extensions",
        "--no-first-run",
        "--window-size=1440,1100",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(profile.parent / "chromedriver.log"))
    return webdriver.Chrome(options=options, service=service)


@dataclass
class BrowserLog:
    """The browser's console, read as the test goes: a SEVERE entry is an error unless it is the network
    log line of an answer the test itself provoked (a 401 for a wrong key, a 422 for a rejected reload)."""

    driver: Any
    expected: set[tuple[str, int]] = field(default_factory=set)
    """(path, status) the test provoked: Chromium logs every 4xx a fetch gets as a SEVERE network entry."""
    seen: list[dict[str, Any]] = field(default_factory=list)

    def expect(self, path: str, status: int) -> None:
        self.expected.add((path, status))

    def read(self) -> list[dict[str, Any]]:
        self.seen.extend(self.driver.get_log("browser"))
        return self.seen

    def errors(self) -> list[str]:
        return [e["message"] for e in self.read() if e["level"] == "SEVERE" and not self._provoked(e["message"])]

    def _provoked(self, message: str) -> bool:
        m = _NETWORK.match(message)
        if m is None:
            return False
        path = re.sub(r"^https?://[^/]+", "", m.group("url"))
        return (path, int(m.group("status"))) in self.expected


def labelled(driver: Any, ids: Iterable[str]) -> list[str]:
    """Of these form controls, those without a label a screen reader would read."""
    script = (
        "const el = document.getElementById(arguments[0]);"
        "return !!(el && (el.labels && el.labels.length || el.getAttribute('aria-label')));"
    )
    return [i for i in ids if not driver.execute_script(script, i)]
