"""nextloc.io.visits: a request's plain ISO 8601 times read without pandas' text parser, same values and errors."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from nextloc.io.visits import _parse_plain_iso, _parse_text_times, parse_times, validate_visits

PLAIN = [
    "2008-10-23T09:30:00Z",
    "2012-06-17T16:51:05",
    "1999-12-31T23:59:59.123456789Z",
    "2008-02-29T00:00:00Z",
]


def test_plain_times_read_as_pandas_reads_them():
    values = pd.Series(PLAIN, index=[3, 5, 7, 9])
    fast = _parse_plain_iso(values, "UTC")
    assert fast is not None
    pd.testing.assert_series_equal(fast, _parse_text_times(values.astype("string"), "UTC"))
    pd.testing.assert_series_equal(parse_times(values), fast)


@pytest.mark.parametrize(
    "value",
    [
        "2008-10-23T09:30:00+08:00",  # a zone other than Z
        " 2008-10-23T09:30:00Z",  # blanks
        "2008-10-23 09:30:00",  # a space for the T
        "2008-02-30T09:30:00Z",  # no such day
        "2008-10-23T24:00:00Z",
        "1650-01-01T00:00:00Z",  # outside the nanosecond range
        "2008-10-23",
        None,
    ],
)
def test_anything_else_is_left_to_the_general_parser(value):
    assert _parse_plain_iso(pd.Series(["2008-10-23T09:30:00Z", value]), "UTC") is None


def test_a_time_without_zone_is_left_to_the_general_parser_outside_utc():
    values = pd.Series(["2008-10-23T09:30:00"])
    assert _parse_plain_iso(values, "Asia/Shanghai") is None
    assert parse_times(values, "Asia/Shanghai").iloc[0] == pd.Timestamp("2008-10-23T01:30:00Z")
    assert _parse_plain_iso(pd.Series(["2008-10-23T09:30:00Z"]), "Asia/Shanghai") is not None


def _visits(**changes: object) -> pd.DataFrame:
    row = {
        "user_id": 7,
        "started_at": "2008-10-23T09:30:00Z",
        "finished_at": "2008-10-23T10:30:00Z",
        "latitude": 39.9,
        "longitude": 116.3,
    }
    return pd.DataFrame([row, {**row, **changes}])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"started_at": "2008-02-30T09:30:00Z"},
            "request row 2: field 'started_at' is not a time: '2008-02-30",
        ),
        (
            {"finished_at": "2008-10-23T09:00:00Z"},
            "request row 2: field 'finished_at' (2008-10-23 09:00:00+00:00)",
        ),
        ({"user_id": 7.5}, "request row 2: field 'user_id' = 7.5 is not an integer id"),
    ],
)
def test_bad_rows_are_still_named(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        validate_visits(_visits(**changes), "request")


def test_checked_visits_have_utc_times_and_int64_users():
    out = validate_visits(_visits(user_id=8), "request")
    assert str(out["started_at"].dtype) == "datetime64[ns, UTC]"
    assert out["user_id"].dtype == "int64"
    assert out["finished_at"].iloc[1] == pd.Timestamp("2008-10-23T10:30:00Z")
