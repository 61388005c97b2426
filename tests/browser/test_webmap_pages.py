"""The web maps (issue 36) in headless Chromium with no network at all: every host name fails to resolve
and every request goes to a proxy that is not there. Each page loads with no script error, shows the
expected circles with a popup each, and asks nothing of the network but map tiles (which fail here: the
markers draw on a blank background). Screenshots go to ``test-artifacts/browser/``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TILE_HOST = "tile.openstreetmap.org"

# the page's circles (all overlays ticked first; a clustered layer counts all it holds) and their popups
COUNT = """
const map = Object.values(window).find(v => v instanceof L.Map);
document.querySelectorAll('.leaflet-control-layers-overlays input').forEach(box => { if (!box.checked) box.click(); });
const clustered = new Set();
map.eachLayer(layer => {
    if (L.MarkerClusterGroup && layer instanceof L.MarkerClusterGroup) layer.getLayers().forEach(m => clustered.add(m));
});
let circles = clustered.size, popups = 0;
clustered.forEach(m => { if (m.getPopup()) popups += 1; });
map.eachLayer(layer => {
    if (layer instanceof L.CircleMarker && !clustered.has(layer)) {
        circles += 1;
        if (layer.getPopup()) popups += 1;
    }
});
return {circles: circles, clustered: clustered.size, popups: popups};
"""
OPEN_FIRST_POPUP = """
const map = Object.values(window).find(v => v instanceof L.Map);
let first = null;
map.eachLayer(layer => { if (!first && layer instanceof L.CircleMarker && layer.getPopup()) first = layer; });
first.openPopup();
return document.querySelector('.leaflet-popup-content').innerText;
"""
RESOURCES = "return performance.getEntriesByType('resource').map(e => e.name);"


def open_page(driver, page: Path) -> dict:
    """Load ``page``; the console's errors other than tiles that could not load, what was requested, and
    the circles and popups shown."""
    driver.get_log("browser")  # what earlier pages logged
    started = time.monotonic()
    driver.get(page.as_uri())
    counts = driver.execute_script(COUNT)
    counts["load_s"] = time.monotonic() - started
    counts["requests"] = driver.execute_script(RESOURCES)
    counts["errors"] = [
        entry["message"]
        for entry in driver.get_log("browser")
        if entry["level"] == "SEVERE"
        and not (entry.get("source") == "network" and TILE_HOST in entry["message"])
    ]
    return counts


def assert_offline(shown: dict) -> None:
    assert shown["errors"] == []
    others = [url for url in shown["requests"] if not url.startswith(f"https://{TILE_HOST}/")]
    assert others == [], f"the page asked for more than tiles: {others[:5]}"


def test_the_answers_page_shows_each_history_and_place_offline(
    offline_browser, screenshot, web_answer, tmp_path
):
    from nextloc.maps.answers import answers_page

    history, answer = web_answer
    second = {**answer, "user_id": 5555, "p_new_place": 0.9}
    page = answers_page([(history, answer), (history.iloc[1:3], second)], tmp_path / "answers.html")
    shown = open_page(offline_browser, page.path)
    assert_offline(shown)
    assert shown["circles"] == shown["popups"] == page.markers == 9
    text = offline_browser.execute_script(OPEN_FIRST_POPUP)
    assert "#1 place 5" in text
    assert "probability 0.600" in text
    assert "visits in training 37" in text
    legend = offline_browser.find_element("css selector", ".nextloc-legend").text
    assert "P(new place) 0.123" in legend
    assert "P(new place) 0.900" in legend
    screenshot(offline_browser, "webmap-answers")


def test_the_dataset_page_of_the_sample_shows_a_user_offline(
    offline_browser, screenshot, preprocessed_copy, tmp_path
):
    import pandas as pd

    data_dir = preprocessed_copy(tmp_path / "data")
    sp = pd.read_parquet(data_dir / "staypoints.parquet", columns=["user_id"])
    user = int(sp["user_id"].value_counts().idxmax())
    out = tmp_path / "map.html"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "commands.main",
            "map",
            "--data-dir",
            str(data_dir),
            "--user",
            str(user),
            "--out",
            str(out),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    from commands.dataset_map import LOCATION_COLUMNS  # the page's expected circles, from the library
    from nextloc.maps.dataset import STAYPOINT_COLUMNS, dataset_page

    staypoints = pd.read_parquet(data_dir / "staypoints.parquet", columns=list(STAYPOINT_COLUMNS))
    locations = pd.read_parquet(data_dir / "vocabulary" / "locations.parquet", columns=LOCATION_COLUMNS)
    report = json.loads((data_dir / "ingest_report.json").read_text()).get("duplicates")
    expected = dataset_page(staypoints, locations, report, tmp_path / "expected.html", user)
    shown = open_page(offline_browser, out)
    assert_offline(shown)
    assert shown["circles"] == shown["popups"] == expected.markers
    assert "location" in offline_browser.execute_script(OPEN_FIRST_POPUP)
    screenshot(offline_browser, "webmap-dataset")


def test_a_large_dataset_is_clustered_and_loads_quickly(offline_browser, tmp_path):
    """30 000 staypoints at 8 000 places: the layers are clustered, and the page is usable in seconds."""
    import numpy as np
    import pandas as pd

    from nextloc.maps.dataset import dataset_page

    rng = np.random.default_rng(0)
    n = 30_000
    places = rng.integers(0, 8000, n)
    start = pd.Timestamp("2008-01-01", tz="UTC") + pd.to_timedelta(np.arange(n) * 3, unit="h")
    sp = pd.DataFrame(
        {
            "id": np.arange(n),
            "user_id": np.arange(n) % 40,
            "location_id": places + 2,
            "raw_location_id": places,
            "started_at": start,
            "finished_at": start + pd.Timedelta(minutes=30),
            "split": "train",
            "latitude": 39.9 + (places % 100) * 0.003,
            "longitude": 116.3 + (places // 100) * 0.003,
        }
    )
    page = dataset_page(sp, None, None, tmp_path / "large.html", user=1)
    assert [layer.clustered for layer in page.layers] == [True, False, False]
    shown = open_page(offline_browser, page.path)
    assert_offline(shown)
    assert shown["clustered"] == page.layers[0].markers > 7000
    assert shown["circles"] == shown["popups"] == page.markers
    assert shown["load_s"] < 20


# the permanent labels: each one's text, whether it shows and its box on the screen, once the labels' script
# has run at the map's zoom (map.nextlocLabels; null before: the first zoom is animated)
LABELS = """
const map = Object.values(window).find(v => v instanceof L.Map);
if (!map.nextlocLabels || map._animatingZoom || map.nextlocLabels.zoom !== map.getZoom()) return null;
return {zoom: map.getZoom(), maxZoom: map.getMaxZoom(), labels: [...document.querySelectorAll('.nextloc-label')].map(e => {
    const r = e.getBoundingClientRect();
    return {text: e.textContent.trim(), shown: getComputedStyle(e).visibility !== 'hidden', box: [r.left, r.top, r.right, r.bottom]};
})};
"""
# zoom to arguments[0] (no animation) on the middle of the answer's layer; done once the labels' script ran
ZOOM = """
const [zoom, done] = arguments;
const map = Object.values(window).find(v => v instanceof L.Map);
let middle = map.getCenter();
map.eachLayer(l => { if (l instanceof L.FeatureGroup && l.getBounds().isValid()) middle = l.getBounds().getCenter(); });
map.once('nextloclabels', () => done(true));
map.setView(middle, zoom, {animate: false});
"""
# the pointer on, then off the circle of the label arguments[0]: is the label shown before, on and after,
# and the circle's popup
HOVER = """
const map = Object.values(window).find(v => v instanceof L.Map);
let tip = null;
map.eachLayer(l => { if (l instanceof L.Tooltip && l.getElement().textContent.trim() === arguments[0]) tip = l; });
const shown = () => getComputedStyle(tip.getElement()).visibility !== 'hidden';
const before = shown();
tip._source.fire('mouseover');
const over = shown();
tip._source.fire('mouseout');
return {shown: [before, over, shown()], popup: tip._source.getPopup().getContent()};
"""


def crowded_answer():
    """A history of ten visits at eight spots 6 m apart, five predicted places and the actual next place
    among them: at the page's first zoom their labels would pile up."""
    import pandas as pd

    metre = 1 / 111_320  # degrees of latitude
    spot = [0, 1, 2, 3, 0, 4, 5, 6, 7, 3]
    history = pd.DataFrame(
        {
            "started_at": pd.date_range("2008-10-01 08:00", periods=len(spot), freq="3h", tz="UTC"),
            "place": [10 + s for s in spot],
            "latitude": [39.98 + 6 * s * metre for s in spot],
            "longitude": [116.30 + 2 * s * metre for s in spot],
        }
    )
    places = [
        {
            "rank": rank,
            "location_id": 10 + 2 * rank,
            "latitude": 39.98 + (12 * rank + 3) * metre,
            "longitude": 116.30 + 4 * rank * metre,
            "n_visits": 5,
            "probability": p,
        }
        for rank, p in enumerate([0.4, 0.2, 0.1, 0.05, 0.05], start=1)
    ]
    answer = {"user_id": 11, "p_new_place": 0.1, "places": places}
    return history, answer, (39.98 + 20 * metre, 116.30 + 3 * metre)


def wait_labels(driver, timeout_s: float = 10) -> dict:
    deadline = time.monotonic() + timeout_s
    while (state := driver.execute_script(LABELS)) is None:
        assert time.monotonic() < deadline, "the labels' script never ran"
        time.sleep(0.05)
    return state


def overlaps(labels: list[dict]) -> list[tuple[str, str]]:
    """The pairs of shown labels whose boxes intersect."""
    from nextloc.maps.labels import boxes_overlap

    shown = [label for label in labels if label["shown"]]
    return [
        (a["text"], b["text"])
        for i, a in enumerate(shown)
        for b in shown[i + 1 :]
        if boxes_overlap(a["box"], b["box"])
    ]


def test_labels_never_cover_each_other_and_show_again_zoomed_in(offline_browser, screenshot, tmp_path):
    """Labels a few metres apart: at the first zoom only those that fit show (#1 among them), none over
    another; zoomed in to the most, more show, still none over another; zoomed back out, the same ones as
    at first. A hidden label shows while the pointer is on its circle, and its text is in the popup."""
    from nextloc.maps.answers import answers_page

    history, answer, actual = crowded_answer()
    page = answers_page([(history, answer)], tmp_path / "crowded.html", actuals=[actual])
    assert_offline(open_page(offline_browser, page.path))
    first = wait_labels(offline_browser)
    shown = [label["text"] for label in first["labels"] if label["shown"]]
    assert len(first["labels"]) == 8 + 5 + 1
    assert "#1" in shown
    assert 0 < len(shown) < len(first["labels"])  # the crowd: some are hidden
    assert overlaps(first["labels"]) == []
    screenshot(offline_browser, "webmap-labels-first-zoom")

    hover = offline_browser.execute_script(HOVER, "4,10 (latest)")  # a visit label: kept after the ranks
    assert hover["shown"] == [False, True, False]
    assert "<b>visit 4, 10</b> of 10" in hover["popup"]

    assert first["maxZoom"] > first["zoom"]
    offline_browser.execute_async_script(ZOOM, first["maxZoom"])
    zoomed = wait_labels(offline_browser)
    assert zoomed["zoom"] == first["maxZoom"]
    assert sum(label["shown"] for label in zoomed["labels"]) > len(shown)
    assert overlaps(zoomed["labels"]) == []
    screenshot(offline_browser, "webmap-labels-max-zoom")

    offline_browser.execute_async_script(ZOOM, first["zoom"])
    again = wait_labels(offline_browser)
    assert [label["text"] for label in again["labels"] if label["shown"]] == shown
    errors = [entry for entry in offline_browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not [e for e in errors if TILE_HOST not in e["message"]]
