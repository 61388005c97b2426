"""Web maps (issue 36): pages that hold Leaflet themselves, the answers' layers and the dataset's layers."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from nextloc.maps import web as webmaps
from nextloc.maps.web import external_references

TILE_HOST = "tile.openstreetmap.org"


@pytest.fixture
def leaflet() -> None:
    """Skip where Debian's Leaflet is not installed (`make install` installs it as root)."""
    missing = [
        a.name
        for a in (webmaps.LEAFLET_JS, webmaps.LEAFLET_CSS)
        if not (webmaps.asset_dir() / a.name).is_file()
    ]
    if missing:
        pytest.skip(f"web maps need Debian's libjs-leaflet (`make install`): missing {missing}")


def test_external_references_finds_what_a_browser_would_fetch():
    page = (
        '<html><head><script src="https://cdn.example/leaflet.js"></script>'
        '<link rel="stylesheet" href="//cdn.example/x.css"><style>.a{background:url(images/x.png)}'
        ".b{background:url(data:image/png;base64,AAAA)} .c{behavior:url(#default#VML)}</style>"
        "<script>var s = '<img src=\"x.png\">'; setUrl(url);</script></head>"
        '<body><a href="https://www.openstreetmap.org/copyright">OSM</a><img src="data:image/png;base64,AA"></body></html>'
    )
    found = external_references(page)
    assert len(found) == 3, found  # the script, the style sheet, the image its style names
    assert external_references("<html><style>@import 'x.css';</style></html>")


def test_the_answers_page_holds_leaflet_and_a_layer_per_history(leaflet, tmp_path, web_answer):
    from nextloc.maps.answers import answers_page

    history, answer = web_answer
    chosen = {
        "coverage": 0.8,
        "total_probability": 0.85,
        "members": [{"new_place": True, "probability": 0.85}],
    }
    second = {**answer, "user_id": 5555, "history_id": "a<b", "p_new_place": None, "answer_set": chosen}
    page = answers_page([(history, answer), (history.iloc[:2], second)], tmp_path / "answers.html")
    first, other = page.layers
    assert (first.spots, first.places, first.visits, first.p_new_place) == (3, 2, 4, 0.123)
    assert (other.spots, other.places, other.p_new_place) == (2, 2, None)
    assert (first.answer_set, other.answer_set) == (None, "80% set, total 0.850: a new place")
    assert page.markers == 9
    html = page.path.read_text()
    assert external_references(html) == []
    assert "L.map(" in html
    assert TILE_HOST in html
    assert "cdn" not in html.lower().split("</head>")[1]  # no CDN link anywhere in the page's body
    assert "P(new place) 0.123" in html
    assert "no new-place head" in html
    assert "no new-place head); 80% set, total 0.850: a new place" in html  # with --coverage
    assert "history a\\u0026lt;b" in html  # escaped, then written as JSON text
    assert "a<b" not in html
    assert "1,4 (latest)" in html  # one label for the two visits at one spot
    # the same inputs write the same page (folium's random ids are numbered)
    again = answers_page([(history, answer), (history.iloc[:2], second)], tmp_path / "again.html")
    assert again.path.read_bytes() == page.path.read_bytes()


def test_the_actual_next_place_is_a_circle_of_its_layer(leaflet, tmp_path, web_answer):
    """A champion's maps in MLflow know where the user really went: a green circle with a popup, in the
    view, keyed in the legend; a layer without one draws none."""
    from nextloc.maps.answers import answers_page

    history, answer = web_answer
    actual = (float(history["latitude"].max()) + 0.01, float(history["longitude"].min()))
    page = answers_page([(history, answer), (history, answer)], tmp_path / "actual.html", [actual])
    first, other = page.layers
    assert (first.actual, other.actual) == (True, False)
    assert page.markers == 2 * (first.spots + first.places) + 1
    html = page.path.read_text()
    assert "the actual next place" in html
    assert f"at {actual[0]:.5f}, {actual[1]:.5f}" in html
    bounds = re.search(r"\.fitBounds\(\s*(\[\[[^\]]*\], \[[^\]]*\]\])", html).group(1)
    assert json.loads(bounds)[1][0] == pytest.approx(actual[0])  # the view frames it: its north edge


def test_labels_carry_their_order_and_the_page_the_script_that_hides_crowded_ones(
    leaflet, tmp_path, web_answer
):
    """Where labels would cover each other the browser keeps the ranks first (in rank order), then the
    actual next place, then the visits latest first (tests/browser/test_webmap_pages.py shows it)."""
    from nextloc.maps.answers import answers_page

    history, answer = web_answer
    page = answers_page([(history, answer)], tmp_path / "a.html", [(40.01, 116.3)])
    html = page.path.read_text()
    head = html.split("</head>")[0]
    assert head.count("L.Map.addInitHook") == 1
    assert head.index("L.Map.addInitHook") > head.index(webmaps._read(webmaps.LEAFLET_JS)[-200:])
    found = re.findall(r"bindTooltip\(\s*`[^`]*`,\s*(\{[^}]*\})", html)
    options = [json.loads(re.sub(r",\s*}$", "}", o)) for o in found]  # folium's object ends with a comma
    options = [(o["nextlocTier"], o["nextlocOrder"], o["direction"]) for o in options]
    ranks = [(webmaps.RANK_LABEL, 1, "bottom"), (webmaps.RANK_LABEL, 2, "bottom")]
    actual = [(webmaps.ACTUAL_LABEL, 0, "left")]
    visits = [(webmaps.VISIT_LABEL, -order, "right") for order in (4, 2, 3)]  # spots by first visit
    assert options == ranks + actual + visits


def test_nothing_to_draw_is_an_error(leaflet, tmp_path, web_answer):
    from nextloc.maps.answers import answers_page

    history, answer = web_answer
    with pytest.raises(ValueError, match="no answer"):
        answers_page([], tmp_path / "a.html")
    with pytest.raises(ValueError, match="nothing to draw"):
        answers_page([(history.iloc[:0], {**answer, "places": []})], tmp_path / "a.html")


def test_a_missing_leaflet_names_the_package_and_writes_nothing(tmp_path, monkeypatch, web_answer):
    from nextloc.maps.answers import answers_page

    monkeypatch.setenv(webmaps.LEAFLET_DIR_ENV, str(tmp_path / "empty"))
    history, answer = web_answer
    with pytest.raises(FileNotFoundError, match="apt-get install libjs-leaflet"):
        answers_page([(history, answer)], tmp_path / "a.html")
    assert not (tmp_path / "a.html").exists()


def dataset(n_users: int = 3, per_user: int = 6, seed: int = 0) -> pd.DataFrame:
    """Staypoints of ``n_users`` users at a few shared places; user 1's last two are copies of user 0's."""
    rng = np.random.default_rng(seed)
    rows = []
    start = pd.Timestamp("2008-10-01", tz="UTC")
    for user in range(n_users):
        for i in range(per_user):
            place = int(rng.integers(0, 4)) if i else -1  # the first one is noise
            t = start + pd.Timedelta(hours=3 * i + user)
            rows.append((user, place, t, t + pd.Timedelta(minutes=40), ["train", "val", "test"][i % 3]))
    sp = pd.DataFrame(rows, columns=["user_id", "raw_location_id", "started_at", "finished_at", "split"])
    copies = sp[sp["user_id"] == 0].tail(2).assign(user_id=1)
    sp = pd.concat([sp, copies], ignore_index=True)
    sp["id"] = np.arange(len(sp))
    sp["location_id"] = np.where(sp["raw_location_id"] >= 0, sp["raw_location_id"] + 2, 1)
    sp["latitude"] = 39.9 + 0.01 * sp["raw_location_id"] + rng.normal(0, 1e-4, len(sp))
    sp["longitude"] = 116.3 + 0.01 * sp["raw_location_id"] + rng.normal(0, 1e-4, len(sp))
    return sp


def test_location_summary_counts_visits_and_users_at_the_vocabulary_centre():
    from nextloc.maps.dataset import location_summary

    sp = dataset()
    vocab = pd.DataFrame({"loc_index": [2], "raw_location_id": [0], "latitude": [1.5], "longitude": [2.5]})
    table = location_summary(sp, vocab).set_index("raw_location_id")
    located = sp[sp["raw_location_id"] >= 0]
    assert sorted(table.index) == sorted(located["raw_location_id"].unique())
    assert table["visits"].sum() == len(located)
    assert table.loc[0, ["latitude", "longitude", "loc_index"]].tolist() == [1.5, 2.5, 2]
    assert (table.drop(index=0)["loc_index"] == -1).all()
    for place, row in table.iterrows():
        assert row["users"] == sorted(located.loc[located["raw_location_id"] == place, "user_id"].unique())


def test_the_dataset_page_draws_locations_shared_staypoints_and_a_user(leaflet, tmp_path):
    from nextloc.maps.dataset import dataset_page

    sp = dataset()
    duplicates = {
        "pairs": [{"users": [0, 1], "shared_files": 1, "shared_staypoints": 2, "copied_test_samples": 0}]
    }
    page = dataset_page(sp, None, duplicates, tmp_path / "d.html", user=1)
    names = [layer.name for layer in page.layers]
    counts = {name.split(" (")[0]: layer.markers for name, layer in zip(names, page.layers, strict=True)}
    assert counts == {
        "Locations": sp.loc[sp["raw_location_id"] >= 0, "raw_location_id"].nunique(),
        "Staypoints several users hold": 2,
        "User 1's staypoints": int((sp["user_id"] == 1).sum()),
    }
    assert not any(layer.clustered for layer in page.layers)
    html = page.path.read_text()
    assert external_references(html) == []
    assert "also held by user(s) 0" in html
    assert "000/001" in html
    assert "markerClusterGroup" not in html.split("</head>")[1]  # not clustered, not inlined
    assert "leaflet.markercluster" not in html.split("</head>")[0].lower()


def test_large_layers_are_clustered(leaflet, tmp_path, monkeypatch):
    from nextloc.maps import dataset as webmaps_dataset

    monkeypatch.setattr(webmaps_dataset, "CLUSTER_ABOVE", 5)
    sp = dataset(n_users=4, per_user=8)
    page = webmaps_dataset.dataset_page(sp, None, None, tmp_path / "d.html")
    assert [layer.clustered for layer in page.layers] == [False, False]  # 4 locations, 2 shared
    page = webmaps_dataset.dataset_page(sp, None, None, tmp_path / "d.html", user=2)
    assert [layer.clustered for layer in page.layers] == [False, False, True]
    html = page.path.read_text()
    assert "L.markerClusterGroup" in html
    assert "MarkerCluster" in html.split("</head>")[0]
    assert external_references(html) == []


def test_bad_dataset_input_is_named(leaflet, tmp_path):
    from nextloc.maps.dataset import dataset_page

    sp = dataset()
    with pytest.raises(ValueError, match=r"data/x: the staypoints have no column\(s\) \['latitude'\]"):
        dataset_page(sp.drop(columns="latitude"), None, None, tmp_path / "d.html", source="data/x")
    with pytest.raises(ValueError, match="user 99 has no staypoint"):
        dataset_page(sp, None, None, tmp_path / "d.html", user=99)


def test_answering_without_a_web_map_imports_no_folium():
    code = (
        "import sys; import nextloc.predict.answer, nextloc.maps.png, commands.evaluate, commands.dataset_map, commands.main; "
        "print([m for m in ('folium', 'branca') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
