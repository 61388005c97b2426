"""The Prefect UI as a user sees a finished ``preprocess-train`` run: its summary artifact."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_flow_run_shows_the_summary_artifact(browser, stack, screenshot):
    """The flow run page -> Artifacts: `preprocess-train-summary`, which holds the leaderboard and the link to
    the MLflow comparison view."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 90)
    browser.get(f"{stack.prefect_url}/runs/flow-run/{stack.flow_run_id}")
    wait.until(ec.element_to_be_clickable((By.XPATH, "//li[@id='artifacts']"))).click()
    card = "//*[contains(@class, 'artifact-card')][normalize-space(.)='preprocess-train-summary']"
    wait.until(ec.element_to_be_clickable((By.XPATH, card)))
    screenshot(browser, "prefect-flow-run-artifacts")
    browser.find_element(By.XPATH, card).click()
    text = wait.until(
        lambda d: (t := d.find_element(By.TAG_NAME, "body").text) and "Place metrics" in t and t
    )
    assert "pointer_plus" in text
    assert "compare the models" in text  # the link into the MLflow comparison view
    screenshot(browser, "prefect-summary-artifact")
