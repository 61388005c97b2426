"""Both UIs of the team services load over HTTPS in headless Chromium that trusts the services' CA, and
ask for the login as over HTTP (:func:`tls_network.tls_services`: the services on a network address in a
namespace of their own, or the loopback variant with a team's certificate).

The CA is trusted the way a person's browser trusts it: imported into the NSS database of the browser's
home (:func:`conftest.ca_browser`); nothing turns certificate checks off. A Chromium without it refuses
the same page.
"""

from __future__ import annotations

import json

import pytest

from tracking import access

pytestmark = pytest.mark.slow
WAIT_S = 90


def _wait(driver):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S)


def _body(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def _responses(driver) -> list[dict]:
    events = (json.loads(entry["message"])["message"] for entry in driver.get_log("performance"))
    return [e["params"]["response"] for e in events if e["method"] == "Network.responseReceived"]


def test_prefect_ui_loads_over_https_and_asks_for_the_auth_string(ca_browser, tls_services, screenshot):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    s, browser = tls_services, ca_browser
    ui = s.api.removesuffix("/api")
    password = (By.CSS_SELECTOR, "input[type='password']")
    browser.get(f"{ui}/")
    _wait(browser).until(lambda d: "/login" in d.current_url)
    _wait(browser).until(ec.element_to_be_clickable(password))
    assert browser.current_url.startswith("https://")
    assert browser.execute_script("return window.isSecureContext") is True
    screenshot(browser, "services-tls-prefect-login")
    browser.find_element(*password).send_keys(s.pipeline[access.PREFECT_AUTH])
    browser.find_element(By.CSS_SELECTOR, "button[type='submit']").click()
    _wait(browser).until(lambda d: "/login" not in d.current_url)
    browser.get(f"{ui}/runs/flow-run/{s.flow_run_id}")
    _wait(browser).until(lambda d: "geolife data/tls" in _body(d))
    screenshot(browser, "services-tls-prefect-run")


def test_mlflow_ui_loads_over_https_and_asks_for_a_login(ca_browser, tls_services, screenshot):
    s, browser = tls_services, ca_browser
    browser.get_log("performance")
    browser.get(f"{s.mlflow}/")
    [answer] = [r for r in _responses(browser) if r["url"] == f"{s.mlflow}/"]
    assert answer["status"] == 401  # the login, asked as over HTTP: a basic-auth challenge
    assert {k.lower(): v for k, v in answer["headers"].items()}["www-authenticate"].startswith("Basic")
    assert answer["securityState"] == "secure", answer.get("securityDetails")
    screenshot(browser, "services-tls-mlflow-login")
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": access.mlflow_login(s.reader)})
    try:
        browser.get(f"{s.mlflow}/#/experiments")
        _wait(browser).until(lambda d: "nextloc-geolife" in _body(d))
        statuses = {r["status"] for r in _responses(browser) if r["url"].startswith(s.mlflow)}
        assert 401 not in statuses, statuses
        screenshot(browser, "services-tls-mlflow-as-reader")
    finally:
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})


def test_a_browser_without_the_ca_refuses_the_services(fresh_browser, tls_services, screenshot):
    fresh_browser.get(f"{tls_services.mlflow}/")
    text = _body(fresh_browser)
    assert "ERR_CERT_AUTHORITY_INVALID" in text or "not private" in text, text[:500]
    screenshot(fresh_browser, "services-tls-untrusted")
