"""Headless Debian Chromium through Debian's ChromeDriver, for the browser tests and the services' HTTPS
UI test (importable from any test folder: ``tests/`` is on the path through its conftest). Selenium
Manager is never asked for a browser or driver, so nothing is downloaded."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("NEXTLOC_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("NEXTLOC_CHROMEDRIVER", "/usr/bin/chromedriver"))
SCREENSHOTS = REPO / "test-artifacts" / "browser"
CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
)


def chromium(
    extra_flags: tuple[str, ...] = (), console: bool = False, network: bool = False, home: Path | None = None
) -> Iterator[object]:
    """Headless Debian Chromium through Debian's ChromeDriver, with a fresh profile; never Selenium Manager.
    ``console``: keep the page's console log (``driver.get_log("browser")``); ``network``: keep its
    DevTools events (``driver.get_log("performance")``: every response's status and headers); ``home``:
    its ``HOME`` (where it finds the NSS database of the certificates it trusts)."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        pytest.skip(
            f"browser tests need Debian's chromium and chromium-driver (`make install`): missing {missing}"
        )
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the dev extra")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common import driver_finder

    def refuse(*_args, **_kwargs):
        raise AssertionError("Selenium Manager was asked for a browser or driver (it would download one)")

    profile = tempfile.mkdtemp(prefix="nextloc-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROME_FLAGS, *extra_flags, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    if console or network:
        options.set_capability(
            "goog:loggingPrefs", {"browser": "ALL", **({"performance": "ALL"} if network else {})}
        )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(driver_finder.SeleniumManager, "binary_paths", refuse)
        env = {**os.environ, "HOME": str(home)} if home else None
        driver = webdriver.Chrome(
            service=Service(executable_path=str(CHROMEDRIVER), env=env), options=options
        )
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def trusting_home(ca: Path) -> Path:
    """A new ``HOME`` whose NSS database trusts ``ca`` as a person's browser does once it is imported
    (``certutil``, Debian's libnss3-tools); skips the test without ``certutil``."""
    if not shutil.which("certutil"):
        pytest.skip("trusting a CA in Chromium needs certutil (Debian's libnss3-tools: `make install`)")
    home = Path(tempfile.mkdtemp(prefix="nextloc-ca-browser-"))
    nss = home / ".pki" / "nssdb"
    nss.mkdir(parents=True)
    certutil = ["certutil", "-d", f"sql:{nss}"]
    subprocess.run([*certutil, "-N", "--empty-password"], check=True, capture_output=True, timeout=60)
    add = ["-A", "-t", "C,,", "-n", "nextloc services CA", "-i", str(ca)]
    subprocess.run([*certutil, *add], check=True, capture_output=True, timeout=60)
    return home
