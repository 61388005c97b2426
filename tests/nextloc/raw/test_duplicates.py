"""Users sharing recordings (nextloc.raw.duplicates), the option that drops the copies, and the metrics
without the copied test samples; on small hand-made inputs (the real sample: tests/flows/test_duplicates_flow.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pydantic
import pytest

from nextloc.config import PreprocessConfig, load_config
from nextloc.evaluation.evaluate import without_copies
from nextloc.evaluation.metrics import DEDUP_KEYS
from nextloc.raw.duplicates import (
    SharedFiles,
    copied_staypoints,
    copied_targets,
    describe_pairs,
    duplicate_report,
    shared_files,
    staypoint_pairs,
)

T0 = pd.Timestamp("2008-10-23 02:53", tz="UTC")


def _staypoints(rows: list[tuple[int, int, int, int, str]]) -> pd.DataFrame:
    """``(id, user_id, start hour, place, split)`` rows; each stay lasts an hour."""
    ids, users, hours, places, splits = zip(*rows, strict=True)
    start = T0 + pd.to_timedelta(list(hours), unit="h")
    return pd.DataFrame(
        {
            "id": ids,
            "user_id": users,
            "split": splits,
            "started_at": start,
            "finished_at": start + pd.Timedelta(hours=1),
            "raw_location_id": places,
        }
    )


class TestSharedFiles:
    HASHES = {
        0: {"a.plt": "x", "b.plt": "y", "c.plt": "z"},
        3: {"a.plt": "x", "renamed.plt": "y", "own.plt": "w"},  # names do not matter, contents do
        5: {"a.plt": "x", "twice1.plt": "v", "twice2.plt": "v"},  # a content twice in one user is no copy
        9: {"c.plt": "z-changed"},  # the same name, another content: not shared
    }

    def test_pairs_count_distinct_shared_contents(self) -> None:
        shared = shared_files(self.HASHES)
        assert shared.pairs == {(0, 3): 2, (0, 5): 1, (3, 5): 1}
        assert shared.dropped == {}  # nothing dropped unless asked

    def test_drop_keeps_the_lowest_users_copy(self) -> None:
        shared = shared_files(self.HASHES, drop=True)
        assert shared.dropped == {3: ("a.plt", "renamed.plt"), 5: ("a.plt",)}
        assert shared.pairs == shared_files(self.HASHES).pairs  # what is shared is reported all the same

    def test_order_of_users_does_not_matter(self) -> None:
        reversed_hashes = dict(reversed(list(self.HASHES.items())))
        assert shared_files(reversed_hashes, drop=True) == shared_files(self.HASHES, drop=True)

    def test_round_trip(self) -> None:
        shared = shared_files(self.HASHES, drop=True)
        assert SharedFiles.from_dict(shared.to_dict()) == shared


class TestStaypoints:
    SP = _staypoints(
        [
            (0, 0, 0, 7, "test"),
            (1, 0, 5, 8, "test"),
            (2, 0, 9, 9, "test"),
            (3, 3, 0, 7, "train"),  # copy of 0, in training: 0 is seen in training
            (4, 3, 5, 8, "test"),  # copy of 1, both test: 1 is the first copy, 4 a second one
            (5, 3, 9, 10, "test"),  # same times as 2, another place: not a copy
            (6, 5, 0, 7, "test"),  # copy of 0 (and of 3)
            (7, 5, 30, 7, "test"),
        ]
    )

    def test_copies_are_the_higher_users(self) -> None:
        assert copied_staypoints(self.SP).tolist() == [False, False, False, True, True, False, True, False]

    def test_pairs(self) -> None:
        assert staypoint_pairs(self.SP) == {(0, 3): 2, (0, 5): 1, (3, 5): 1}

    def test_copied_targets_are_second_copies_or_seen_in_training(self) -> None:
        ids = np.array([7, 4, 0, 6, 1, 2, 5])
        assert copied_targets(self.SP, ids).tolist() == [False, True, True, True, False, False, False]

    def test_report(self) -> None:
        files = SharedFiles({(0, 3): 4, (1, 2): 1}, {3: ("a", "b", "c", "d")})
        report = duplicate_report(files, self.SP, np.array([4, 6, 7, 2, 0]), drop_shared_files=True)
        assert report["pairs"] == [
            {"users": [0, 3], "shared_files": 4, "shared_staypoints": 2, "copied_test_samples": 2},
            {"users": [0, 5], "shared_files": 0, "shared_staypoints": 1, "copied_test_samples": 1},
            {"users": [1, 2], "shared_files": 1, "shared_staypoints": 0, "copied_test_samples": 0},
            {"users": [3, 5], "shared_files": 0, "shared_staypoints": 1, "copied_test_samples": 1},
        ]
        assert report["copied_staypoints"] == 3
        assert report["copied_test_samples"] == 3 == copied_targets(self.SP, np.array([4, 6, 7, 2, 0])).sum()
        assert report["test_samples"] == 5
        assert report["files_dropped"] == {"3": 4}
        assert report["n_files_dropped"] == 4
        assert describe_pairs(report).startswith("000/003 (4 files, 2 staypoints, 2 test targets); 000/005 ")
        assert describe_pairs(report, limit=1) == (
            "000/003 (4 files, 2 staypoints, 2 test targets); 3 more pairs (1 files, 2 staypoints, 2 test targets)"
        )

    def test_report_without_per_user_files(self) -> None:
        report = duplicate_report(None, self.SP, np.array([], dtype=np.int64), drop_shared_files=False)
        assert {p["shared_files"] for p in report["pairs"]} == {None}
        assert report["n_files_dropped"] == 0
        assert "files" not in describe_pairs(report)

    def test_no_duplicates(self) -> None:
        sp = self.SP[self.SP["user_id"] == 0]
        report = duplicate_report(SharedFiles(), sp, np.array([0, 1]), drop_shared_files=False)
        assert report["pairs"] == []
        assert report["copied_test_samples"] == 0
        assert describe_pairs(report) == ""


class TestWithoutCopies:
    def test_exactly_the_flagged_samples_are_left_out(self) -> None:
        rng = np.random.default_rng(0)
        frame = pd.DataFrame({key.removesuffix("_dedup"): rng.uniform(0, 100, 50) for key in DEDUP_KEYS})
        copied = rng.uniform(size=50) < 0.3
        out = without_copies(frame, copied)
        assert out["n_test_dedup"] == int((~copied).sum())
        for key in DEDUP_KEYS:
            assert out[key] == pytest.approx(frame[key.removesuffix("_dedup")][~copied].mean())
        assert without_copies(frame, np.zeros(50, bool))["place_acc@1_dedup"] == pytest.approx(
            frame["place_acc@1"].mean()
        )

    def test_flags_must_match_the_samples(self) -> None:
        frame = pd.DataFrame({key.removesuffix("_dedup"): [1.0, 2.0] for key in DEDUP_KEYS})
        with pytest.raises(ValueError, match="copy flags"):
            without_copies(frame, np.zeros(3, bool))


class TestOption:
    def test_off_by_default(self) -> None:
        assert PreprocessConfig().duplicates.drop_shared_files is False

    def test_set_by_key(self) -> None:
        assert load_config(overrides={"duplicates.drop_shared_files": True}).duplicates.drop_shared_files

    @pytest.mark.parametrize(
        "overrides",
        [{"duplicates.drop_shared_file": True}, {"duplicates.drop_shared_files": "maybe"}],
        ids=["unknown-key", "not-a-boolean"],
    )
    def test_rejected_before_any_work(self, overrides) -> None:
        with pytest.raises(pydantic.ValidationError, match="duplicates"):
            load_config(overrides=overrides)

    def test_leaderboard_holds_them_when_runs_give_them(self) -> None:
        from nextloc.evaluation.leaderboard import leaderboard
        from nextloc.evaluation.metrics import RESULT_KEYS

        plain = {k: 10.0 for k in RESULT_KEYS}
        board = leaderboard(
            [("a", {**plain, "place_acc@1_dedup": 8.0}), ("a", {**plain, "place_acc@1_dedup": 6.0})]
        )
        assert board["a"]["place_acc@1_dedup"]["mean"] == 7.0
        assert set(leaderboard([("a", plain)])["a"]) == set(RESULT_KEYS)
