"""Web maps: Leaflet pages (through folium) that work offline apart from the map tiles.

The building blocks of :mod:`nextloc.maps.answers` (``nextloc predict --map answers.html``) and
:mod:`nextloc.maps.dataset` (``nextloc map``).

Decisions:

* **Nothing is fetched at view time but tiles.** folium links Leaflet, jQuery, Bootstrap and Font Awesome
  from CDNs; the maps here use none of those links: Leaflet's script and styles (and Leaflet.markercluster's
  where a layer clusters) are copied into the page, the images its styles name as ``data:`` URIs. Popups
  are bound with Leaflet's own ``bindPopup`` (folium's :class:`~folium.Popup` needs jQuery). A written page
  is checked: any ``<script src>``, ``<link href>`` or CSS ``url()``/``@import`` of another file is an error
  (:func:`external_references`). The OpenStreetMap tiles are the one thing asked from the network; offline,
  the markers, lines and legend draw on a blank background.
* **Where the files come from** is reproducible from the system's packages, not a download: Debian's
  ``libjs-leaflet`` and ``libjs-leaflet.markercluster`` (``make install`` installs them as root) put them in
  :data:`DEBIAN_LEAFLET_DIR`; ``$NEXTLOC_LEAFLET_DIR`` names another folder with the same files. A missing
  file is a :class:`FileNotFoundError` naming the package, never a silent CDN fallback.
* **folium is imported here only**, by the functions that build a page, so ``nextloc predict`` without an
  HTML map never imports it.
* **Reproducible pages**: folium names every element with a random id; :func:`write_page` renumbers them
  in tree order, so the same inputs write the same bytes. Files are written atomically.
* **Labels never cover each other** (:func:`add_label`, :data:`LABEL_SCRIPT`): a permanent label is a
  Leaflet tooltip that Leaflet draws where it is told, over any other. Every page carries a small script
  that, once the page's script has run and after every zoom, move, resize and layer added or removed,
  keeps the labels in a fixed order (the ranks ``#1..#k``, then the actual next place, then the visits
  latest first: :data:`RANK_LABEL`, :data:`ACTUAL_LABEL`, :data:`VISIT_LABEL`) and hides each one that
  would come within 2 pixels of a label kept before it (the PNG maps' gap); zooming in shows it again.
  Which labels show depends on the labels' relative positions only, so on the zoom, never on the pan or
  on what was shown before. A hidden label shows while the pointer is on its circle, and its text is in
  the circle's popup too.
"""

from __future__ import annotations

import base64
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from nextloc.atomic import write_text_atomic

logger = logging.getLogger(__name__)

__all__ = [
    "ACTUAL_LABEL",
    "DEBIAN_LEAFLET_DIR",
    "LABEL_SCRIPT",
    "RANK_LABEL",
    "VISIT_LABEL",
    "Point",
    "add_label",
    "add_legend",
    "add_popup",
    "asset_dir",
    "external_references",
    "inline_assets",
    "new_map",
    "point_layer",
    "write_page",
]

DEBIAN_LEAFLET_DIR = Path("/usr/share/javascript/leaflet")
LEAFLET_DIR_ENV = "NEXTLOC_LEAFLET_DIR"
TILE_URL = "https://tile.openstreetmap.org/{z}/{x}/{y}.png"
# the permanent labels (visit numbers, ranks): smaller than Leaflet's tooltips; hidden where they would cover
# one another (LABEL_SCRIPT), shown on top while the pointer is on their circle
LABEL_CSS = (
    ".nextloc-label {padding: 0 3px; font: 11px/1.3 sans-serif; box-shadow: none; opacity: 0.85}\n"
    ".nextloc-label-hidden {visibility: hidden}\n"
    ".nextloc-label.nextloc-label-hover {visibility: visible; z-index: 1000}"
)
# the tiers of add_label, kept first to last where labels would cover each other
RANK_LABEL, ACTUAL_LABEL, VISIT_LABEL = 0, 1, 2
TILE_ATTRIBUTION = '&copy; <a href="https://www.openstreetmap.org/copyright">OpenStreetMap</a> contributors'


@dataclass(frozen=True)
class Asset:
    """A file a page inlines: its names in the asset folder, the first one found is read (a minified copy
    first), and the Debian package that installs it."""

    names: tuple[str, ...]
    package: str

    @property
    def name(self) -> str:
        return self.names[-1]


LEAFLET_JS = Asset(("leaflet.min.js", "leaflet.js"), "libjs-leaflet")
LEAFLET_CSS = Asset(("leaflet.css",), "libjs-leaflet")
CLUSTER_JS = Asset(
    ("leaflet.markercluster.min.js", "leaflet.markercluster.js"), "libjs-leaflet.markercluster"
)
CLUSTER_CSS = (
    Asset(("MarkerCluster.css",), "libjs-leaflet.markercluster"),
    Asset(("MarkerCluster.Default.css",), "libjs-leaflet.markercluster"),
)

#: the labels' script (see the module docstring), inlined after Leaflet's: a hook on every ``L.Map`` that,
#: once the page's own script has run and after each view or layer change, hides (the class
#: ``nextloc-label-hidden``) every permanent ``nextloc-label`` tooltip that would come within ``GAP`` pixels
#: of one kept before it, in the order (tier, order, the marker made first) :func:`add_label` gave (not
#: while a zoom is animated: its boxes are scaled; its ``zoomend`` comes after); then ``map.nextlocLabels``
#: holds ``{runs, zoom, shown, hidden}`` and the map fires ``nextloclabels`` with it
LABEL_SCRIPT = """
(function () {
    "use strict";
    var GAP = 2;
    function labels(map) {
        var found = [];
        map.eachLayer(function (layer) {
            var options = layer.options || {};
            if (!(layer instanceof L.Tooltip) || !options.permanent || !layer._source) { return; }
            if (!/(^|\\s)nextloc-label(\\s|$)/.test(options.className || "")) { return; }
            var element = layer.getElement();
            if (element) {
                found.push({tier: +options.nextlocTier || 0, order: +options.nextlocOrder || 0,
                    id: L.stamp(layer._source), source: layer._source, element: element});
            }
        });
        return found.sort(function (a, b) { return a.tier - b.tier || a.order - b.order || a.id - b.id; });
    }
    function apart(a, b) {
        return a.right + GAP <= b.left || b.right + GAP <= a.left
            || a.bottom + GAP <= b.top || b.bottom + GAP <= a.top;
    }
    function hoverable(label) {
        if (label.source._nextlocHover) { return; }
        label.source._nextlocHover = true;
        label.source.on("mouseover", function () {
            L.DomUtil.addClass(label.element, "nextloc-label-hover");
        });
        label.source.on("mouseout", function () {
            L.DomUtil.removeClass(label.element, "nextloc-label-hover");
        });
    }
    function declutter(map) {
        var found = labels(map), kept = [];
        found.forEach(function (label) { label.box = label.element.getBoundingClientRect(); });
        found.forEach(function (label) {
            label.hidden = !kept.every(function (box) { return apart(label.box, box); });
            if (!label.hidden) { kept.push(label.box); }
        });
        found.forEach(function (label) {
            if (label.hidden) { L.DomUtil.addClass(label.element, "nextloc-label-hidden"); }
            else { L.DomUtil.removeClass(label.element, "nextloc-label-hidden"); }
            hoverable(label);
        });
        var runs = map.nextlocLabels ? map.nextlocLabels.runs + 1 : 1;
        map.nextlocLabels = {runs: runs, zoom: map.getZoom(), shown: kept.length, hidden: found.length - kept.length};
        map.fire("nextloclabels", map.nextlocLabels);
    }
    L.Map.addInitHook(function () {
        var map = this, pending = null;
        function later() {
            if (pending === null) {
                pending = setTimeout(function () {
                    pending = null;
                    if (map._loaded && !map._animatingZoom) { declutter(map); }  // zoomend follows
                }, 0);
            }
        }
        map.on("zoomend moveend resize viewreset layeradd layerremove", later);
        later();
    });
})();
"""

_SOURCE_MAP = re.compile(r"^\s*(//|/\*)# sourceMappingURL=.*$", re.M)
_CSS_URL = re.compile(r"url\(\s*['\"]?(?!data:|#)([^)'\"]+?)['\"]?\s*\)")
_CSS_FETCH = re.compile(r"@import\b|url\(\s*['\"]?(?!data:|#)[^)'\"\s]", re.I)
# the attributes that make a browser fetch a file as the page loads (an <a href> is only a link)
_FETCHING = {"script": "src", "link": "href", "img": "src", "iframe": "src", "embed": "src", "source": "src"}


def asset_dir() -> Path:
    """The folder of Leaflet's files: ``$NEXTLOC_LEAFLET_DIR``, else :data:`DEBIAN_LEAFLET_DIR`."""
    return Path(os.environ.get(LEAFLET_DIR_ENV) or DEBIAN_LEAFLET_DIR)


def _read(asset: Asset) -> str:
    path = next(
        (asset_dir() / n for n in asset.names if (asset_dir() / n).is_file()), asset_dir() / asset.name
    )
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the web maps copy Leaflet's files into each page and never fetch them from "
            f"a CDN; install Debian's {asset.package} (`sudo apt-get install {asset.package}`, or `make "
            f"install` as root), or set ${LEAFLET_DIR_ENV} to a folder holding {asset.name}"
        )
    return _SOURCE_MAP.sub("", path.read_text(encoding="utf-8"))


def _css(asset: Asset) -> str:
    """A style sheet with the images it names (relative to it) as ``data:`` URIs."""
    text = _read(asset)
    folder = asset_dir()

    def embed(match: re.Match[str]) -> str:
        image = folder / match.group(1)
        if not image.is_file():
            raise FileNotFoundError(f"{image} (named by {asset.name}) is missing: reinstall {asset.package}")
        mime = "image/svg+xml" if image.suffix == ".svg" else f"image/{image.suffix.lstrip('.')}"
        return f'url("data:{mime};base64,{base64.b64encode(image.read_bytes()).decode()}")'

    return _CSS_URL.sub(embed, text)


def inline_assets(cluster: bool = False) -> str:
    """The ``<style>`` and ``<script>`` elements a page's head needs: Leaflet's, and with ``cluster``
    Leaflet.markercluster's (read from :func:`asset_dir`), then the labels' (:data:`LABEL_SCRIPT`).

    Raises:
        FileNotFoundError: a file is missing (the message names the Debian package that installs it).
    """
    styles = [_css(LEAFLET_CSS), *(_css(a) for a in CLUSTER_CSS if cluster)]
    scripts = [_read(LEAFLET_JS), *([_read(CLUSTER_JS)] if cluster else []), LABEL_SCRIPT]
    # "</script" inside a script would end it early; the files have none, but a check costs nothing
    for text in scripts:
        if "</script" in text.lower():
            raise ValueError("a Leaflet script holds '</script': it cannot be inlined")
    return "".join(f"<style>\n{s}\n</style>\n" for s in [*styles, LABEL_CSS]) + "".join(
        f"<script>\n{s}\n</script>\n" for s in scripts
    )


class _References(HTMLParser):
    """Collects what a page would fetch as it loads: :data:`_FETCHING` attributes, CSS ``url()``/``@import``
    in ``<style>`` elements and ``style`` attributes (script bodies are not markup: never looked into)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        wanted = _FETCHING.get(tag)
        if wanted and values.get(wanted) and not str(values[wanted]).startswith("data:"):
            self.found.append(f"<{tag} {wanted}={values[wanted]!r}>")
        if _CSS_FETCH.search(values.get("style") or ""):
            self.found.append(f"<{tag} style={values['style']!r}>")
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.found += [data[max(0, m.start() - 40) : m.end() + 60] for m in _CSS_FETCH.finditer(data)]


def external_references(html: str) -> list[str]:
    """Every reference of ``html`` to another file a browser would fetch as the page loads (``<script
    src>``, ``<link href>``, ``<img src>``, CSS ``url()`` or ``@import``); ``data:`` URIs are inside the page.
    What a script asks for (the tiles) is not markup and not listed."""
    parser = _References()
    parser.feed(html)
    parser.close()
    return parser.found


def new_map(bounds: Sequence[Sequence[float]], prefer_canvas: bool = False, tiles: bool = True) -> Any:
    """A folium map framing ``bounds`` (``[[south, west], [north, east]]``) with OpenStreetMap tiles and a
    scale, linking no CDN file (:func:`write_page` inlines Leaflet)."""
    import folium

    (south, west), (north, east) = bounds
    fmap = folium.Map(
        location=[(south + north) / 2, (west + east) / 2],
        zoom_start=12,
        tiles=None,
        control_scale=True,
        prefer_canvas=prefer_canvas,
    )
    fmap.default_js, fmap.default_css = [], []  # jQuery, Bootstrap, Font Awesome: none is used
    if tiles:
        folium.TileLayer(TILE_URL, attr=TILE_ATTRIBUTION, name="OpenStreetMap", max_zoom=19).add_to(fmap)
    # room for the legend (bottom left) and the layer control (top right)
    fmap.fit_bounds(
        [[south, west], [north, east]], padding_top_left=(30, 60), padding_bottom_right=(30, 170), max_zoom=16
    )
    return fmap


def add_popup(layer: Any, html: str, max_width: int = 320) -> None:
    """Bind ``html`` (already escaped) as ``layer``'s popup, with Leaflet alone (no jQuery)."""
    from branca.element import MacroElement
    from jinja2 import Template

    popup = MacroElement()
    popup._name = "Popup"
    popup._template = Template(
        "{% macro script(this, kwargs) %}"
        "{{ this._parent.get_name() }}.bindPopup({{ this.html|tojson }}, {maxWidth: {{ this.width }}});"
        "{% endmacro %}"
    )
    popup.html, popup.width = html, int(max_width)
    layer.add_child(popup)


def add_label(marker: Any, text: str, direction: str, tier: int, order: float = 0) -> None:
    """A permanent label ``text`` (already escaped) ``direction`` of ``marker`` (Leaflet's tooltip
    directions: ``right``, ``bottom``, ...). Where labels would cover each other (:data:`LABEL_SCRIPT`), a
    lower ``tier`` (:data:`RANK_LABEL`, :data:`ACTUAL_LABEL`, :data:`VISIT_LABEL`) is kept first, then in
    one tier a lower ``order``, then the marker made first."""
    import folium

    options = {"nextloc_tier": int(tier), "nextloc_order": order}
    marker.add_child(
        folium.Tooltip(text, permanent=True, direction=direction, class_name="nextloc-label", **options)
    )


def add_legend(fmap: Any, html: str, position: str = "bottomleft") -> None:
    """A Leaflet control holding ``html`` (already escaped), in a white box."""
    from branca.element import MacroElement
    from jinja2 import Template

    legend = MacroElement()
    legend._name = "Legend"
    legend._template = Template(
        """{% macro script(this, kwargs) %}
        var {{ this.get_name() }} = L.control({position: {{ this.position|tojson }}});
        {{ this.get_name() }}.onAdd = function () {
            var box = L.DomUtil.create("div", "nextloc-legend");
            box.style.cssText = "background: white; padding: 6px 9px; border-radius: 5px; font: 12px/1.4 "
                + "sans-serif; box-shadow: 0 1px 5px rgba(0,0,0,0.4); max-width: 360px; max-height: 45vh; "
                + "overflow-y: auto";
            box.innerHTML = {{ this.html|tojson }};
            L.DomEvent.disableClickPropagation(box);
            L.DomEvent.disableScrollPropagation(box);
            return box;
        };
        {{ this.get_name() }}.addTo({{ this._parent.get_name() }});
        {% endmacro %}"""
    )
    legend.html, legend.position = html, position
    fmap.add_child(legend)


def _point_layer_class() -> type:
    """:func:`point_layer`'s class, made when first asked for (folium is imported only then)."""
    from folium.map import Layer
    from jinja2 import Template

    class _PointLayer(Layer):  # type: ignore[misc]
        _template = Template(
            """{% macro script(this, kwargs) %}
            var {{ this.get_name() }} = (function () {
                var rows = {{ this.rows|tojson }};
                var group = {% if this.cluster %}L.markerClusterGroup({maxClusterRadius: 40,
                    chunkedLoading: true}){% else %}L.featureGroup(){% endif %};
                for (var i = 0; i < rows.length; i++) {
                    var r = rows[i];
                    var marker = L.circleMarker([r[0], r[1]], {radius: r[2], color: r[3], weight: r[5],
                        fillColor: r[6], fillOpacity: 0.55, opacity: 0.9});
                    if (r[4]) { marker.bindPopup(r[4], {maxWidth: 320}); }
                    group.addLayer(marker);
                }
                return group;
            })();
            {% endmacro %}"""
        )

        def __init__(self, rows: list[list[Any]], name: str, cluster: bool, show: bool) -> None:
            super().__init__(name=name, overlay=True, control=True, show=show)
            self._name = "PointLayer"
            self.rows, self.cluster = rows, cluster

    return _PointLayer


@dataclass(frozen=True)
class Point:
    """One circle of a :func:`point_layer`: centre, radius (pixels), colour, popup (escaped HTML; empty:
    none), outline width (pixels) and fill colour (empty: the colour)."""

    latitude: float
    longitude: float
    radius: float
    colour: str
    popup: str = ""
    weight: float = 1.0
    fill: str = ""

    def row(self) -> list[Any]:
        return [
            round(self.latitude, 6),
            round(self.longitude, 6),
            round(self.radius, 1),
            self.colour,
            self.popup,
            self.weight,
            self.fill or self.colour,
        ]


def point_layer(points: Sequence[Point], name: str, cluster: bool = False, show: bool = True) -> Any:
    """A layer of many circles written as one data array and a loop (not one folium object and a block of
    script each: a page of thousands stays small and quick), clustered with Leaflet.markercluster when
    ``cluster`` (the page must then inline it: :func:`write_page` with ``cluster=True``)."""
    return _point_layer_class()([p.row() for p in points], name, cluster, show)


def _elements(root: Any) -> Iterator[Any]:
    yield root
    for child in list(root._children.values()):
        yield from _elements(child)


def write_page(fmap: Any, path: Path, title: str, cluster: bool = False) -> str:
    """Render ``fmap`` with Leaflet inlined (:func:`inline_assets`), its element ids numbered in tree order,
    and write it to ``path`` atomically; returns the HTML.

    Raises:
        FileNotFoundError: a Leaflet file is missing (see :func:`inline_assets`).
        ValueError: the page would still reference another file (a bug: never written).
    """
    head = inline_assets(cluster)  # first: a missing package fails before anything is rendered
    root = fmap.get_root()
    for number, element in enumerate(_elements(root)):  # folium's ids are random (uuid4 hex)
        element._id = f"{number:04d}"
    html = root.render()
    html = html.replace("<head>", f"<head>\n<title>{escape(title)}</title>\n{head}", 1)
    found = external_references(html)
    if found:
        raise ValueError(f"the page for {path} would fetch other files at view time: {found[:3]}")
    write_text_atomic(Path(path), html)
    logger.info("wrote %s (%.0f kB)", path, len(html.encode()) / 1000)
    return html
