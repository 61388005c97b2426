"""The model comparison in the MLflow UI, clicked through as the README's "Comparing models" describes it."""

from __future__ import annotations

import os

import pytest

from tracking import mlflow_runs

pytestmark = pytest.mark.slow
CHILDREN = ("markov s0", "markov s1", "pointer_plus s0", "pointer_plus s1")
WAIT_S = 90


def _wait(driver):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S)


def _click(driver, xpath: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    _wait(driver).until(ec.element_to_be_clickable((By.XPATH, xpath))).click()


def _run_link(name: str) -> str:
    return f"//a[normalize-space(.)='{name}']"


def _show_children(driver) -> None:
    """Wait until the runs table lists every child run; close the assistant side panel (more table)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    for name in CHILDREN:
        _wait(driver).until(ec.presence_of_element_located((By.XPATH, _run_link(name))))
    for button in driver.find_elements(By.CSS_SELECTOR, "button[aria-label='Close']"):
        if button.is_displayed():
            button.click()


def _page_text(driver) -> str:
    """Every text of the page, scrolled into view or not."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").get_attribute("textContent") or ""


def _columns(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.get_attribute("col-id") for e in driver.find_elements(By.CSS_SELECTOR, ".ag-header-cell")]


def test_experiment_opens_on_runs_and_the_comparison_view(browser, stack, screenshot):
    """Home -> "Model training" -> the experiment: its runs (not the GenAI overview); the view menu's "Model
    comparison" lists every child run flat, best test place Acc@1 first, with the metric columns."""
    browser.get(stack.mlflow_url + "/")
    _click(browser, "//*[normalize-space(text())='Model training']")
    _click(browser, "//a[normalize-space(.)='nextloc-geolife']")
    _wait(browser).until(lambda d: f"/experiments/{stack.experiment_id}/runs" in d.current_url)
    assert "overview" not in browser.current_url
    _click(browser, "//button[@data-testid='saved-views-trigger']")
    _click(browser, f"//*[@role='menuitem'][contains(., '{mlflow_runs.COMPARISON_VIEW_NAME}')]")
    _wait(browser).until(lambda d: f"viewStateShareKey={mlflow_runs.COMPARISON_VIEW}" in d.current_url)
    _show_children(browser)
    columns = _columns(browser)
    wanted = [f"metrics.`{name}`" for name in mlflow_runs.COMPARISON_METRICS]
    assert set(wanted) <= set(columns), columns
    screenshot(browser, "mlflow-comparison-view")


def test_summary_link_opens_the_comparison_view(browser, stack):
    """The link in the Prefect summary (and the experiment description) opens the same view directly."""
    browser.get(mlflow_runs.comparison_url(stack.mlflow_url, stack.experiment_id))
    _show_children(browser)
    assert "metrics.`test_place_acc_at_1`" in _columns(browser)
    assert "/runs" in browser.current_url


def test_nextloc_ui_prints_the_comparison_a_fresh_browser_opens_best_first(
    fresh_browser, stack, screenshot, free_port
):
    """`nextloc ui` starts MLflow's UI on the project's own store (found again by a second call) and prints the
    comparison's URL; Chromium with a fresh profile opens it on every model run, best test place Acc@1 first."""
    import subprocess
    import sys
    from pathlib import Path

    from mlflow import MlflowClient
    from selenium.webdriver.common.by import By

    port = free_port
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "NEXTLOC_TRACKING_URI")}
    ui = [str(Path(sys.executable).parent / "nextloc"), "ui", "--port", str(port)]
    try:
        printed = [
            subprocess.run(ui, cwd=stack.root, env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)
        ]
        assert [p.returncode for p in printed] == [0, 0], printed[0].stderr[-2000:]
        url = printed[0].stdout.strip()
        assert url == printed[1].stdout.strip()
        assert url == mlflow_runs.comparison_url(f"http://127.0.0.1:{port}", stack.experiment_id)
        # the main job's summary says how to get there (on the default port)
        assert (
            "compare the models: .venv/bin/nextloc ui (MLflow's UI on this store), then" in stack.run_output
        )
        fresh_browser.get(url)
        _show_children(fresh_browser)
        rows = {
            name: int(
                fresh_browser.find_element(
                    By.XPATH, _run_link(name) + "/ancestor::*[@row-index][1]"
                ).get_attribute("row-index")
            )
            for name in CHILDREN
        }
        screenshot(fresh_browser, "nextloc-ui-comparison")
    finally:
        subprocess.run([*ui, "--stop"], cwd=stack.root, env=env, capture_output=True, timeout=60)
    runs = MlflowClient(stack.tracking_uri).search_runs([stack.experiment_id], max_results=100)
    score = {r.info.run_name: r.data.metrics["test_place_acc_at_1"] for r in runs if r.info.run_name in rows}
    shown = sorted(CHILDREN, key=rows.__getitem__)
    assert [score[name] for name in shown] == sorted(score.values(), reverse=True), shown


def test_compare_two_children(browser, stack, screenshot):
    """Tick the two pointer_plus runs and press Compare: MLflow's compare page shows them side by side."""
    from selenium.webdriver.common.by import By

    browser.get(mlflow_runs.comparison_url(stack.mlflow_url, stack.experiment_id))
    _show_children(browser)
    for name in ("pointer_plus s0", "pointer_plus s1"):
        row = browser.find_element(By.XPATH, _run_link(name) + "/ancestor::*[@row-index][1]")
        index = row.get_attribute("row-index")
        _click(browser, f"//*[@row-index='{index}']//*[contains(@class, 'ag-selection-checkbox')]")
    _click(browser, "//button[starts-with(normalize-space(.), 'Compare')]")
    _wait(browser).until(lambda d: "compare-runs" in d.current_url)
    # run names, a parameter, metrics and tags side by side (the table rows are rendered as they load)
    wanted = ("pointer_plus s0", "pointer_plus s1", "train.recipe", "test_place_acc_at_1", "selected_epoch")
    _wait(browser).until(lambda d: all(text in _page_text(d) for text in (*wanted, "champion_decision")))
    screenshot(browser, "mlflow-compare-runs")


def test_registered_model_shows_the_champion(browser, stack, screenshot):
    """Model registry -> nextloc-pointer_plus: its versions, the `champion` alias on the promoted one, whose
    page says why (seed, scores, data fingerprint, the decision)."""
    from selenium.webdriver.common.by import By

    browser.get(f"{stack.mlflow_url}/#/models/{mlflow_runs.registered_name('pointer_plus')}")
    _wait(browser).until(lambda d: "champion" in d.find_element(By.TAG_NAME, "body").text)
    screenshot(browser, "mlflow-registered-model")
    from mlflow import MlflowClient

    client = MlflowClient(stack.tracking_uri, stack.tracking_uri)  # not the registry an earlier test set
    champion = client.get_model_version_by_alias("nextloc-pointer_plus", "champion")
    browser.get(f"{stack.mlflow_url}/#/models/nextloc-pointer_plus/versions/{champion.version}")
    text = _wait(browser).until(
        lambda d: (t := d.find_element(By.TAG_NAME, "body").text) and "champion_decision" in t and t
    )
    assert f"promoted: v{champion.version}" in text
    assert "data_fingerprint" in text
    assert "pointer_plus seed" in text  # the description


def test_parent_run_links_its_prefect_flow_run(browser, stack):
    """The parent run's description: the leaderboard, the champions, and a link to the Prefect flow run."""
    from selenium.webdriver.common.by import By

    browser.get(f"{stack.mlflow_url}/#/experiments/{stack.experiment_id}/runs/{stack.parent_run_id}")
    _wait(browser).until(lambda d: "Test leaderboard" in d.find_element(By.TAG_NAME, "body").text)
    links = [a.get_attribute("href") or "" for a in browser.find_elements(By.TAG_NAME, "a")]
    assert f"{stack.prefect_url}/runs/flow-run/{stack.flow_run_id}" in links


# the Leaflet map of a page (found without Object.values(window): a sandboxed frame has no localStorage to
# read) and its circles with a popup each
MAP_CIRCLES = """
let map = null;
for (const key of Object.getOwnPropertyNames(window)) {
    try { if (window.L && window[key] instanceof L.Map) { map = window[key]; break; } } catch (e) {}
}
if (!map) return null;
let circles = 0, popups = 0;
map.eachLayer(layer => { if (layer instanceof L.CircleMarker) { circles += 1; if (layer.getPopup()) popups += 1; } });
return {circles: circles, popups: popups};
"""
REQUESTS = "return performance.getEntriesByType('resource').map(e => e.name);"


def _open_artifact(driver, stack, run_id: str, path: str) -> None:
    """The run's Artifacts tab, the folders on ``path`` opened, then the file itself; waits for it."""
    driver.get(f"{stack.mlflow_url}/#/experiments/{stack.experiment_id}/runs/{run_id}/artifacts")
    *folders, name = path.split("/")
    for folder in folders:
        _click(driver, f"//*[normalize-space(text())='{folder}']")
    _click(driver, f"//*[normalize-space(text())='{name}']")
    quoted = path.replace("/", "%2F")
    _wait(driver).until(
        lambda d: any(f"get-artifact?path={quoted}&" in r for r in d.execute_script(REQUESTS))
    )


def _listed(driver, names) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    for name in names:
        _wait(driver).until(
            ec.presence_of_element_located((By.XPATH, f"//*[normalize-space(text())='{name}']"))
        )


def _script_errors(driver) -> list[str]:
    """The console's errors since the last call, but the UI's own request for a user (404 without auth)."""
    return [
        e["message"]
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE"
        and not (e["source"] == "network" and "/mlflow/users/current" in e["message"])
    ]


def test_parent_run_shows_the_comparison_chart_beside_the_leaderboard(browser, stack, screenshot):
    """The parent run's artifacts: leaderboard.json with leaderboard_chart.png and .html beside it; the page
    opens in place (MLflow's HTML preview) with the chart and a row per kind, and nothing fails."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    browser.get_log("browser")
    _open_artifact(browser, stack, stack.parent_run_id, "leaderboard_chart.html")
    _listed(browser, ("leaderboard.json", "leaderboard_chart.png", "leaderboard_chart.html"))
    _wait(browser).until(ec.frame_to_be_available_and_switch_to_it((By.TAG_NAME, "iframe")))
    try:
        rows = _wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#comparison tr"))
        kinds = [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows[1:]]
        assert sorted(kinds) == ["markov", "pointer_plus"]
        assert len(browser.find_elements(By.TAG_NAME, "svg")) == 1
    finally:
        browser.switch_to.default_content()
    screenshot(browser, "mlflow-parent-comparison-chart")
    _click(browser, "//*[normalize-space(text())='leaderboard_chart.png']")
    _wait(browser).until(
        lambda d: any("get-artifact?path=leaderboard_chart.png&" in r for r in d.execute_script(REQUESTS))
    )
    assert _script_errors(browser) == []


def test_a_champions_maps_are_web_pages_in_the_ui(browser, stack, screenshot):
    """The pointer_plus champion's run lists maps/<user>.html beside each maps/<user>.png; a page opens in
    place with its Leaflet map: every circle (visits, places, the actual next place) has a popup."""
    from mlflow import MlflowClient
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    client = MlflowClient(stack.tracking_uri, stack.tracking_uri)
    run_id = client.get_model_version_by_alias("nextloc-pointer_plus", "champion").run_id
    logged = sorted(a.path.removeprefix("maps/") for a in client.list_artifacts(run_id, "maps"))
    users = sorted({name.split(".")[0] for name in logged})
    assert logged == sorted(f"{u}.{suffix}" for u in users for suffix in ("html", "png"))
    assert len(users) == 3
    browser.get_log("browser")
    _open_artifact(browser, stack, run_id, f"maps/{users[0]}.html")
    _listed(browser, logged)
    _wait(browser).until(ec.frame_to_be_available_and_switch_to_it((By.TAG_NAME, "iframe")))
    try:
        shown = _wait(browser).until(lambda d: d.execute_script(MAP_CIRCLES))
        assert shown["circles"] == shown["popups"] >= 2
        assert f"user {users[0]} at" in browser.find_element(By.TAG_NAME, "body").text
    finally:
        browser.switch_to.default_content()
    screenshot(browser, "mlflow-champion-map")
    assert _script_errors(browser) == []
