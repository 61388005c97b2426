"""What people look at: answers and datasets on maps.

- :mod:`~nextloc.maps.web`: Leaflet pages through folium that work offline apart from the tiles (Leaflet's
  files inlined from Debian's ``libjs-leaflet``, never a CDN).
- :mod:`~nextloc.maps.answers`: ``nextloc predict --map answers.html``: a history and its answers, a layer each.
- :mod:`~nextloc.maps.dataset`: ``nextloc map``: a preprocessed dataset's places, a user's stays and moves.
- :mod:`~nextloc.maps.png`: the same answers as a PNG (matplotlib), for reports and MLflow artifacts;
  :mod:`~nextloc.maps.labels`: its labels placed so that none covers another; :mod:`~nextloc.maps.tiles`:
  the basemap under it, where map tiles can be had (cached; without them, the plain axes).
"""
