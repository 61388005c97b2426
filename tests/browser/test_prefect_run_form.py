"""The Prefect UI's *Custom run* form of a ``preprocess-train`` deployment shows the flow's typed sections."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

SECTIONS = ("preprocess", "training", "promotion", "runner", "tracking")


def test_the_custom_run_form_shows_the_sections(browser, deployed, screenshot):
    """Deployment ``preprocess-train/geolife`` -> *Run* -> *Custom run*: the input parameters, then one group
    per section (``promotion`` with the champion rule's four settings), not 29 flat entries."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, ids = deployed
    browser.set_window_size(1400, 2400)
    browser.get(f"{url}/deployments/deployment/{ids['preprocess-train/geolife']}/run")
    text = WebDriverWait(browser, 120).until(lambda d: (t := _labels(d)) and "promote_metric" in t and t)
    screenshot(browser, "prefect-custom-run-form")  # the inputs, then the preprocess section
    rule = browser.find_element(By.XPATH, "//*[starts-with(normalize-space(text()), 'Promote Metric')]")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", rule)
    screenshot(browser, "prefect-custom-run-form-promotion")  # training, promotion, runner, tracking
    for section in SECTIONS:
        assert section in text, section
    for key in ("promote_metric", "decision_metric", "min_effect", "match_radius_m", "task_runner", "seeds"):
        assert key in text, key


def _labels(driver) -> str:
    """The page's text with labels as keys (the form titles a section's keys ``Promote Metric``)."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text.lower().replace(" ", "_")
