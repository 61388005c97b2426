"""Inputs and formats: what nextloc reads (GeoLife, CSV, parquet, GPX, visits, trackintel) and writes.

- :mod:`~nextloc.io.inputs`: :class:`~nextloc.io.inputs.InputSpec` (what to read) and the input files.
- :mod:`~nextloc.io.geolife`: GeoLife ``.plt`` files -> positionfixes; the ingest report and schema.
- :mod:`~nextloc.io.tabular`: CSV and parquet positionfixes or visits, streamed; :mod:`~nextloc.io.gpx`: GPX.
- :mod:`~nextloc.io.visits`: the visit and positionfix schema, how times and numbers are read.
- :mod:`~nextloc.io.geoparquet`: the ``geo`` metadata of outputs with coordinates.
"""
