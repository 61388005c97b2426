"""The visit and positionfix schema: column names, coordinate bounds, how times and numbers are read, and the
strict row checks.

Two routes read visits and GPS fixes, and both read them here so that a value means the same on either:

* a history a person sends to ask where they go next (:mod:`nextloc.predict.history_reader`): strict, the first
  bad row is an error naming the source, the row (from 1) and the field (:func:`validate_visits`,
  :func:`validate_positionfixes`, :func:`parse_time`);
* the bring-your-own-data input of preprocessing (:mod:`nextloc.io.tabular`): lenient, every bad row is
  reported and skipped, so it uses the parsers (:func:`parse_times`, :func:`parse_numbers`) and names rows
  itself.

Times are ISO 8601 text or datetimes. A time without a zone is wall-clock time in a given zone: UTC for a
history (as GeoLife's), the input's zone for preprocessing; a wall-clock time that a DST change skips or
repeats is refused rather than guessed. Numbers in text are refused when they hold ``_``, ``nan`` or
``inf`` (Python's ``float`` takes ``3_9.9``; a data file never means it), and booleans are not numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

VISIT_COLUMNS = ("user_id", "started_at", "finished_at", "latitude", "longitude")
POSITIONFIX_COLUMNS = ("user_id", "tracked_at", "latitude", "longitude", "elevation")
REQUIRED_POSITIONFIX_COLUMNS = ("user_id", "tracked_at", "latitude", "longitude")  # elevation is optional
HISTORY_ID = "history_id"  # optional: several histories of one user in one input
COORDINATE_BOUNDS = {"latitude": 90.0, "longitude": 180.0}
EARTH_RADIUS_M = 6_371_000.0  # the haversine radius of trackintel and the reference

VISITS_SCHEMA = pa.schema(
    [
        ("user_id", pa.int32()),
        ("started_at", pa.timestamp("ns", tz="UTC")),
        ("finished_at", pa.timestamp("ns", tz="UTC")),
        ("latitude", pa.float64()),
        ("longitude", pa.float64()),
    ]
)

# A zone at the end of a time: Z, +08, +0800, +08:00, after a clock time (extended 09:30[:00[.f]] or basic
# T09[30[00[.f]]]), so that the date "2008-10-23" is not read as 2008-10 at zone -23.
_ZONE_RE = (
    r"(?:\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?|T\d{2}(?:\d{2}(?:\d{2}(?:\.\d+)?)?)?)"
    r"\s*(?:[zZ]|UTC|[+-]\d{2}(?::?\d{2})?)$"
)
_UTC_NS = "datetime64[ns, UTC]"
# The times a request usually holds, which numpy reads exactly as pandas' ISO 8601 parser does (years 1900-2099:
# well inside the nanosecond range): 2008-10-23T09:30:00[.f][Z]
_PLAIN_ISO = re.compile(r"(?:19|20)\d\d-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z?")


# --------------------------------------------------------------------------- #
# parsing (NaN / NaT where a value is not one)
# --------------------------------------------------------------------------- #


def parse_times(values: pd.Series, timezone: str = "UTC") -> pd.Series:
    """Times as UTC nanosecond timestamps, NaT where a value is not a time (see the module docstring).

    Args:
        values: ISO 8601 text, or a datetime column (a naive one is wall-clock time in ``timezone``).
            Numbers are not times (an epoch count's unit is a guess).
        timezone: the zone of times written without one.

    Returns:
        ``datetime64[ns, UTC]`` with ``values``' index; NaT also for a time outside the nanosecond range.
    """
    dtype = values.dtype
    if isinstance(dtype, pd.DatetimeTZDtype):
        parsed = values.dt.tz_convert("UTC")
    elif pd.api.types.is_datetime64_dtype(dtype):
        parsed = values.dt.tz_localize(timezone, ambiguous="NaT", nonexistent="NaT").dt.tz_convert("UTC")
    elif pd.api.types.is_numeric_dtype(dtype):
        parsed = pd.Series(pd.NaT, index=values.index, dtype=_UTC_NS)
    else:
        parsed = _parse_plain_iso(values, timezone)
        if parsed is None:
            parsed = _parse_text_times(values.astype("string").str.strip(), timezone)
    return _as_ns(parsed)


def parse_numbers(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Numbers as float64 (NaN where a value is not a number) and which values are empty (missing or blank).

    A numeric (not boolean) column is taken as it is; anything else is read as trimmed text.
    """
    if pd.api.types.is_numeric_dtype(values.dtype) and not pd.api.types.is_bool_dtype(values.dtype):
        return values.to_numpy(np.float64, na_value=np.nan), values.isna().to_numpy(bool)
    text = values.astype("string").str.strip()
    empty = (text.isna() | (text == "")).to_numpy(bool)
    odd = text.str.contains(r"_|nan|inf", case=False, regex=True).fillna(False).to_numpy(bool)
    numbers = pd.to_numeric(text.mask(odd), errors="coerce").to_numpy(np.float64, na_value=np.nan)
    return numbers, empty


def _parse_plain_iso(values: pd.Series, timezone: str) -> pd.Series | None:
    """Text times that are all ``YYYY-MM-DDTHH:MM:SS[.f]`` in UTC (``Z``, or no zone where ``timezone`` is
    UTC), read by numpy: the same values as :func:`_parse_text_times`, without pandas' text machinery (a
    request's few times). None where any value is something else (an invalid date too): the general path
    reads them."""
    if values.dtype != object:
        return None
    text = values.to_numpy()
    match = _PLAIN_ISO.fullmatch
    if not all(type(v) is str and match(v) for v in text):
        return None
    if timezone != "UTC" and not all(v[-1] == "Z" for v in text):
        return None
    try:
        ns = np.array([v[:-1] if v[-1] == "Z" else v for v in text], dtype="datetime64[ns]")
    except ValueError:  # a day, hour, minute or second out of range
        return None
    return pd.Series(pd.DatetimeIndex(ns).tz_localize("UTC"), index=values.index)


def _parse_text_times(text: pd.Series, timezone: str) -> pd.Series:
    zoned = text.str.contains(_ZONE_RE, regex=True).fillna(False).to_numpy(bool)
    parsed = pd.Series(pd.NaT, index=text.index, dtype=_UTC_NS)
    if zoned.any():
        parsed[zoned] = _to_datetime(text[zoned], utc=True)
    if (~zoned).any():
        local = _to_datetime(text[~zoned], utc=False)
        if isinstance(local.dtype, pd.DatetimeTZDtype):  # a zone the pattern does not know: trust pandas
            local = local.dt.tz_convert("UTC")
        else:
            local = local.dt.tz_localize(timezone, ambiguous="NaT", nonexistent="NaT").dt.tz_convert("UTC")
        parsed[~zoned] = local
    return parsed


def _to_datetime(text: pd.Series, *, utc: bool) -> pd.Series:
    try:
        parsed = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=utc)
    except (ValueError, TypeError, OverflowError):  # mixed zones and the like: value by value
        parsed = pd.Series([_one_time(v, utc) for v in text], index=text.index)
    if not isinstance(parsed.dtype, pd.DatetimeTZDtype) and not pd.api.types.is_datetime64_dtype(
        parsed.dtype
    ):
        parsed = pd.to_datetime(parsed, errors="coerce", utc=utc)
    if isinstance(parsed.dtype, pd.DatetimeTZDtype):
        return parsed.dt.tz_convert("UTC").astype(_UTC_NS)
    return parsed.astype("datetime64[ns]")


def _one_time(value: object, utc: bool) -> pd.Timestamp:
    try:
        ts = pd.Timestamp(str(value))
    except (ValueError, TypeError, OverflowError):
        return pd.NaT
    if utc:
        return ts.tz_convert("UTC") if ts.tzinfo else pd.NaT
    return ts if ts.tzinfo is None else pd.NaT


def _as_ns(parsed: pd.Series) -> pd.Series:
    """Nanosecond unit (a parquet timestamp may be in micro- or milliseconds); NaT outside its range."""
    if parsed.dt.unit == "ns":
        return parsed
    lo, hi = pd.Timestamp.min.tz_localize("UTC"), pd.Timestamp.max.tz_localize("UTC")
    return parsed.where((parsed >= lo) & (parsed <= hi)).dt.as_unit("ns")


# --------------------------------------------------------------------------- #
# strict checks: the first bad row is an error
# --------------------------------------------------------------------------- #


def validate_visits(frame: pd.DataFrame, source: str = "history") -> pd.DataFrame:
    """Check visits row by row; return them with UTC times, float coordinates and int64 ``user_id``.

    Times are ISO 8601 text or datetimes; a time without a zone is UTC (as GeoLife's). Rows are numbered
    from 1 in messages (the line of a CSV file is the row + 1, after the header).

    Raises:
        ValueError: naming ``source``, the row and the field: a missing column, an empty history, an
            unparsable time, a coordinate out of range or not a number, a visit ending before it starts,
            a user id that is not an integer.
    """
    require_columns(frame, VISIT_COLUMNS, source, "visits")
    out = frame.reset_index(drop=True).copy()
    out["user_id"] = _integers(out["user_id"], source, "user_id")
    for column in ("started_at", "finished_at"):
        out[column] = _times(out[column], source, column)
    for column, bound in COORDINATE_BOUNDS.items():
        out[column] = _coordinates(out[column], source, column, bound)
    backwards = np.flatnonzero(
        out["finished_at"].to_numpy("datetime64[ns]") < out["started_at"].to_numpy("datetime64[ns]")
    )
    if len(backwards):
        i = backwards[0]
        raise ValueError(
            f"{source} row {i + 1}: field 'finished_at' ({out['finished_at'][i]}) is before 'started_at' "
            f"({out['started_at'][i]})"
        )
    if HISTORY_ID in out.columns:
        out[HISTORY_ID] = out[HISTORY_ID].astype(str)
    return out


def validate_positionfixes(frame: pd.DataFrame, source: str = "positionfixes") -> pd.DataFrame:
    """Check positionfixes (``user_id``, ``tracked_at``, ``latitude``, ``longitude``, optional
    ``elevation``, metres) row by row; a missing or unreadable elevation is 0.

    Raises:
        ValueError: as :func:`validate_visits`, naming the row and the field.
    """
    require_columns(frame, REQUIRED_POSITIONFIX_COLUMNS, source, "positionfixes")
    out = frame.reset_index(drop=True).copy()
    out["user_id"] = _integers(out["user_id"], source, "user_id")
    out["tracked_at"] = _times(out["tracked_at"], source, "tracked_at")
    for column, bound in COORDINATE_BOUNDS.items():
        out[column] = _coordinates(out[column], source, column, bound)
    out["elevation"] = (
        pd.to_numeric(out["elevation"], errors="coerce").fillna(0.0) if "elevation" in out else 0.0
    )
    return out


def parse_time(value: str | pd.Timestamp, source: str = "input", field: str = "at") -> pd.Timestamp:
    """One time (ISO 8601 text or a timestamp; no zone means UTC) as a UTC timestamp.

    Raises:
        ValueError: naming ``source`` and ``field`` if it is not a time.
    """
    return _times(pd.Series([value]), source, field).iloc[0]


def require_columns(frame: pd.DataFrame, columns: Sequence[str], source: str, what: str) -> None:
    """Raise a ValueError naming ``source`` if ``frame`` lacks one of ``columns`` or has no row."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{source}: {what} lack column(s) {missing} (have {list(map(str, frame.columns))}); "
            f"expected {list(columns)}"
        )
    if len(frame) == 0:
        raise ValueError(f"{source}: empty history (no {what[:-1] if what.endswith('s') else what})")


def short_text(value: object, limit: int = 80) -> str:
    """A value as text for a message, cut at ``limit`` characters (a bad field can be a whole file)."""
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _times(values: pd.Series, source: str, field: str) -> pd.Series:
    parsed = parse_times(values, "UTC")
    bad = np.flatnonzero(parsed.isna().to_numpy())
    if len(bad):
        i = bad[0]
        raise ValueError(
            f"{source} row {i + 1}: field {field!r} is not a time: {_show(values.iloc[i])} "
            "(expected ISO 8601, e.g. 2008-10-23T09:30:00Z; no zone means UTC)"
        )
    return parsed


def _coordinates(values: pd.Series, source: str, field: str, bound: float) -> pd.Series:
    numbers, _ = parse_numbers(values)
    bad = np.flatnonzero(~(np.abs(numbers) <= bound))  # NaN and out of range
    if len(bad):
        i = bad[0]
        raise ValueError(
            f"{source} row {i + 1}: field {field!r} = {_show(values.iloc[i])} is not a {field} in [-{bound:g}, {bound:g}]"
        )
    return pd.Series(numbers, index=values.index)


def _integers(values: pd.Series, source: str, field: str) -> pd.Series:
    if isinstance(values.dtype, np.dtype) and values.dtype.kind in "iu":  # integers already: nothing to check
        return pd.Series(values.to_numpy().astype(np.int64), index=values.index)
    numbers = pd.to_numeric(values, errors="coerce")
    bad = np.flatnonzero((numbers.isna() | (numbers != np.round(numbers))).to_numpy())
    if len(bad):
        i = bad[0]
        raise ValueError(
            f"{source} row {i + 1}: field {field!r} = {_show(values.iloc[i])} is not an integer id"
        )
    return numbers.astype(np.int64)


def _show(value: Any) -> str:
    return repr(value.item() if isinstance(value, np.generic) else value)
