"""Both UIs of ``make services`` ask for a login, and show the runs after it, in headless Chromium
(:func:`tests.conftest.team_services`: the services with authentication on and one deployment run).

The Prefect UI sends a browser without the auth string to its login page; the pipeline's auth string
opens the flow run. The MLflow UI answers 401 with a basic-auth challenge (the browser's login dialog,
which headless Chromium cancels, showing the answer's text); with the reader's user and password sent as
the browser sends them after that dialog (an ``Authorization`` header on every request), it shows the
pipeline's runs.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from tracking import access, mlflow_runs

pytestmark = pytest.mark.slow
WAIT_S = 90


def _wait(driver):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S)


def _body(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def test_prefect_ui_asks_for_the_auth_string_then_shows_the_run(browser, team_services, screenshot):
    """Its address opens the login page; a wrong auth string is refused there; the pipeline's opens the UI,
    and the flow run's page (either UI's route) shows the run."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    s = team_services
    ui = s.api.removesuffix("/api")
    password = (By.CSS_SELECTOR, "input[type='password']")
    browser.get(f"{ui}/")
    _wait(browser).until(lambda d: "/login" in d.current_url)
    _wait(browser).until(ec.element_to_be_clickable(password)).send_keys("nextloc:wrong")
    screenshot(browser, "services-prefect-login")
    browser.find_element(By.CSS_SELECTOR, "button[type='submit']").click()
    _wait(browser).until(lambda d: "Invalid credentials" in _body(d))
    assert "/login" in browser.current_url
    field = browser.find_element(*password)
    field.clear()
    field.send_keys(s.pipeline[access.PREFECT_AUTH])
    browser.find_element(By.CSS_SELECTOR, "button[type='submit']").click()
    _wait(browser).until(lambda d: "/login" not in d.current_url)
    for route in ("/v2/runs/flow-run", "/runs/flow-run"):
        browser.get(f"{ui}{route}/{s.flow_run_id}")
        _wait(browser).until(lambda d: "geolife data/auth" in _body(d))
    screenshot(browser, "services-prefect-after-login")


def _responses(driver) -> list[dict]:
    """The responses the page got since the last call: DevTools ``Network.responseReceived`` events."""
    events = (json.loads(entry["message"])["message"] for entry in driver.get_log("performance"))
    return [e["params"]["response"] for e in events if e["method"] == "Network.responseReceived"]


def test_mlflow_ui_asks_for_a_login_then_shows_the_runs_to_the_reader(
    network_browser, team_services, screenshot
):
    """Its address answers 401 with a basic-auth challenge (the browser's login dialog; headless Chromium
    shows nothing behind it); with the reader's user, sent as a browser sends it after the dialog, the
    runs of the pipeline's experiment."""
    from selenium.webdriver.common.by import By

    s, browser = team_services, network_browser
    browser.get_log("performance")
    browser.get(f"{s.mlflow}/")
    [answer] = [r for r in _responses(browser) if r["url"] == f"{s.mlflow}/"]
    assert answer["status"] == 401
    headers = {k.lower(): v for k, v in answer["headers"].items()}
    assert headers["www-authenticate"].startswith("Basic"), headers
    assert "nextloc-geolife" not in _body(browser)
    screenshot(browser, "services-mlflow-login")

    login = access.mlflow_login(s.reader)
    request = urllib.request.Request(
        f"{s.mlflow}/api/2.0/mlflow/experiments/get-by-name?experiment_name=nextloc-geolife", headers=login
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        experiment = json.loads(response.read())["experiment"]["experiment_id"]
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": login})
    try:
        browser.get(mlflow_runs.comparison_url(s.mlflow, experiment))
        _wait(browser).until(lambda d: d.find_elements(By.XPATH, "//a[normalize-space(.)='markov s0']"))
        statuses = {r["status"] for r in _responses(browser) if r["url"].startswith(s.mlflow)}
        assert 401 not in statuses, statuses
        screenshot(browser, "services-mlflow-runs-as-reader")
    finally:
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
