"""Reference GeoLife preprocessing, written the way the published pipeline does it (the benchmark baseline).

    python benchmarks/reference_preprocess.py RAW_DIR OUT_DIR

RAW_DIR holds ``Data/NNN/Trajectory/*.plt``. Follows ../shared/docs/reference-protocol.md section 1 (steps 1-18): trackintel
end to end (read, sliding staypoints, triplegs, trips, tracking quality, DBSCAN locations, merging), then the
reference's pandas idioms: groupby-apply for the time features and the split, a Python loop over 10-week windows for
the user quality, and the O(n^2) ``iterrows`` loops for the valid target ids and for the samples (including the
``id in numpy_array`` membership test of the reference dataloader). This script is deliberately NOT optimised:
it is the baseline that nextloc's preprocessing is measured against.

Writes ``OUT_DIR/{train,validation,test}.pk`` (pickled list of dicts of numpy arrays per split) and, as the reference
does between its two stages, ``OUT_DIR/dataset_geolife.csv`` + ``OUT_DIR/valid_ids_geolife.pk``. Progress goes to
stderr; the last line on stdout is one JSON object with the counts and the per-step wall times.
"""

from __future__ import annotations

import datetime
import json
import pickle
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import trackintel as ti  # noqa: E402
from sklearn.preprocessing import OrdinalEncoder  # noqa: E402
from trackintel.analysis.tracking_quality import _split_overlaps, temporal_tracking_quality  # noqa: E402

PREVIOUS_DAY = 7
DAY_FILTER = 50
WINDOW_WEEKS = 10
MAX_DURATION = 60 * 24 * 2 - 1  # 2879


def log(msg: str) -> None:
    print(f"[reference {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- user quality (step 4)
def _window_quality(df: pd.DataFrame, window_size: int) -> pd.DataFrame:
    """Tracking quality of every sliding window of ``window_size`` weeks for one user (Python loop over windows)."""
    n_weeks = (df["finished_at"].max() - df["started_at"].min()).days // 7
    first_date = df["started_at"].min().date()
    rows = []
    for i in range(0, n_weeks - window_size + 1):
        win_start = datetime.datetime.combine(first_date + datetime.timedelta(weeks=i), datetime.time())
        win_end = datetime.datetime.combine(
            win_start + datetime.timedelta(weeks=window_size), datetime.time()
        )
        inside = df.loc[(df["started_at"] >= win_start) & (df["finished_at"] < win_end)]
        if inside.shape[0] == 0:
            continue
        rows.append([i, inside["duration"].sum() / (win_end - win_start).total_seconds()])
    out = pd.DataFrame(rows, columns=["timestep", "quality"])
    out["user_id"] = df["user_id"].unique()[0]
    return out


def user_quality(sp: pd.DataFrame, trips: pd.DataFrame) -> np.ndarray:
    """Users tracked over more than DAY_FILTER days that have at least one non-empty 10-week window."""
    for frame in (sp, trips):
        frame["started_at"] = pd.to_datetime(frame["started_at"]).dt.tz_localize(None)
        frame["finished_at"] = pd.to_datetime(frame["finished_at"]).dt.tz_localize(None)
    sp["type"] = "sp"
    trips["type"] = "tpl"
    both = pd.concat([sp, trips])
    both = _split_overlaps(both, granularity="day")
    both["duration"] = (both["finished_at"] - both["started_at"]).dt.total_seconds()

    per_user = temporal_tracking_quality(both, granularity="all")
    per_user["days"] = (
        both.groupby("user_id").apply(lambda g: (g["finished_at"].max() - g["started_at"].min()).days).values
    )
    long_enough = per_user.loc[per_user["days"] > DAY_FILTER].reset_index(drop=True)["user_id"].unique()

    windows = both.groupby("user_id").apply(_window_quality, window_size=WINDOW_WEEKS).reset_index(drop=True)
    windows = windows.loc[windows["user_id"].isin(long_enough)]
    mean_quality = windows.groupby("user_id", as_index=False)["quality"].mean()
    return mean_quality["user_id"].values


# --------------------------------------------------------------------------------------------- time features (step 10)
def _time_columns(df: pd.DataFrame) -> pd.DataFrame:
    first_day = pd.to_datetime(df["started_at"].min().date())
    df["started_at"] = df["started_at"].dt.tz_localize(tz=None)
    df["finished_at"] = df["finished_at"].dt.tz_localize(tz=None)
    df["start_day"] = (df["started_at"] - first_day).dt.days
    df["end_day"] = (df["finished_at"] - first_day).dt.days
    df["start_min"] = df["started_at"].dt.hour * 60 + df["started_at"].dt.minute
    df["end_min"] = df["finished_at"].dt.hour * 60 + df["finished_at"].dt.minute
    df.loc[df["end_min"] == 0, "end_min"] = 24 * 60
    df["weekday"] = df["started_at"].dt.weekday
    return df


def add_time_features(sp: pd.DataFrame) -> pd.DataFrame:
    sp = sp.groupby("user_id", group_keys=False).apply(_time_columns)
    sp = sp.drop(columns=["started_at", "finished_at"])
    sp = sp.sort_values(by=["user_id", "start_day", "start_min"]).reset_index(drop=True)
    sp["location_id"] = sp["location_id"].astype(int)
    sp["user_id"] = sp["user_id"].astype(int)
    sp.index.name = "id"
    return sp.reset_index()


# --------------------------------------------------------------------------------------------- split (steps 11, 14)
def _mark_split(df: pd.DataFrame) -> pd.DataFrame:
    max_day = df["start_day"].max()
    train_end = max_day * 0.6
    val_end = max_day * 0.8
    df["Dataset"] = "test"
    df.loc[df["start_day"] < train_end, "Dataset"] = "train"
    df.loc[(df["start_day"] >= train_end) & (df["start_day"] < val_end), "Dataset"] = "vali"
    return df


def split_by_day(data: pd.DataFrame):
    data = data.groupby("user_id", group_keys=False).apply(_mark_split)
    parts = []
    for name in ("train", "vali", "test"):
        part = data.loc[data["Dataset"] == name].copy()
        part.drop(columns=["Dataset"], inplace=True)
        parts.append(part)
    return parts


def encode_locations(train: pd.DataFrame, val: pd.DataFrame, test: pd.DataFrame) -> None:
    """Ordinal codes fitted on train, +2: 0 = padding, 1 = unseen in train, 2.. = train vocabulary."""
    enc = OrdinalEncoder(dtype=np.int64, handle_unknown="use_encoded_value", unknown_value=-1)
    enc.fit(train["location_id"].values.reshape(-1, 1))
    for part in (train, val, test):
        part["location_id"] = enc.transform(part["location_id"].values.reshape(-1, 1)) + 2


# --------------------------------------------------------------------------------------------- valid ids (step 12)
def valid_target_ids(split_df: pd.DataFrame, previous_day: int = PREVIOUS_DAY) -> list:
    """Row-by-row: a row is a valid target if it is >= previous_day days into the user's split period and at
    least 3 earlier rows of the same user and split start within previous_day days before it."""
    ids = []
    for user in split_df["user_id"].unique():
        df = split_df.loc[split_df["user_id"] == user].copy().reset_index(drop=True)
        df["diff_day"] = df["start_day"] - df["start_day"].min()
        for index, row in df.iterrows():
            if row["diff_day"] < previous_day:
                continue
            hist = df.iloc[:index]
            hist = hist.loc[hist["start_day"] >= (row["start_day"] - previous_day)]
            if len(hist) < 3:
                continue
            ids.append(row["id"])
    return ids


# --------------------------------------------------------------------------------------------- samples (step 18)
def _user_samples(df: pd.DataFrame, valid_ids: np.ndarray, previous_day: int = PREVIOUS_DAY) -> list:
    df = df.reset_index(drop=True)
    df["diff_day"] = df["start_day"] - df["start_day"].min()
    samples = []
    for index, row in df.iterrows():
        if row["diff_day"] < previous_day:
            continue
        hist = df.iloc[:index]
        hist = hist.loc[hist["start_day"] >= (row["start_day"] - previous_day)]
        if row["id"] not in valid_ids:  # linear scan of a numpy array, as in the reference dataloader
            continue
        samples.append(
            {
                "X": hist["location_id"].values,
                "user_X": hist["user_id"].values,
                "weekday_X": hist["weekday"].values,
                "start_min_X": hist["start_min"].values,
                "dur_X": hist["duration"].values,
                "diff": (row["diff_day"] - hist["diff_day"]).astype(int).values,
                "Y": int(row["location_id"]),
            }
        )
    return samples


def build_samples(split_df: pd.DataFrame, valid_ids: np.ndarray) -> list:
    per_user = [_user_samples(group, valid_ids) for _, group in split_df.groupby("user_id")]
    return [sample for user_samples in per_user for sample in user_samples]


# --------------------------------------------------------------------------------------------- main
def main(argv: list[str]) -> int:
    if argv[1:] in (["-h"], ["--help"]):
        print("usage: " + __doc__)
        return 0
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    raw_dir, out_dir = Path(argv[1]), Path(argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    steps: dict[str, float] = {}
    stats: dict = {}
    clock = [time.perf_counter()]

    def done(step: str, msg: str) -> None:
        now = time.perf_counter()
        steps[step] = round(now - clock[0], 2)
        clock[0] = now
        log(f"{step} ({steps[step]:.1f} s): {msg}")

    # 1. read
    pfs, _ = ti.io.read_geolife(str(raw_dir / "Data"), print_progress=False)
    done("read", f"{len(pfs)} positionfixes, {pfs['user_id'].nunique()} users")

    # 2-3. staypoints + activity flag
    pfs, sp = pfs.as_positionfixes.generate_staypoints(
        method="sliding",
        distance_metric="haversine",
        dist_threshold=200,
        time_threshold=30,
        gap_threshold=24 * 60,
        include_last=True,
        print_progress=False,
        n_jobs=-1,
    )
    sp = sp.as_staypoints.create_activity_flag(method="time_threshold", time_threshold=25)
    done("staypoints", f"{len(sp)} staypoints")

    # 4. user quality (triplegs, trips, sliding 10-week windows)
    pfs, tpls = pfs.as_positionfixes.generate_triplegs(sp)
    sp, tpls, trips = ti.preprocessing.generate_trips(sp, tpls, add_geometry=False)
    valid_users = user_quality(sp.copy(), trips.copy())
    stats["users_quality"] = int(len(valid_users))
    done("quality", f"{len(tpls)} triplegs, {len(trips)} trips, {len(valid_users)} users pass")
    del pfs, tpls, trips

    # 5-7. valid users, activity staypoints, DBSCAN locations, drop noise
    sp = sp.loc[sp["user_id"].isin(valid_users)]
    sp = sp.loc[sp["is_activity"] == True]  # noqa: E712 (as in the reference)
    sp, locs = sp.as_staypoints.generate_locations(
        method="dbscan",
        epsilon=20,
        num_samples=2,
        distance_metric="haversine",
        agg_level="dataset",
        n_jobs=-1,
    )
    sp = sp.loc[~sp["location_id"].isna()].copy()
    locs = locs[~locs.index.duplicated(keep="first")]
    used_locs = locs.loc[locs.index.isin(sp["location_id"].unique())]
    stats["locations"] = int(sp["location_id"].nunique())
    done(
        "locations",
        f"{len(sp)} staypoints with a location, {stats['locations']} locations ({len(used_locs)} saved)",
    )

    # 8-9. merge + floor-minute duration
    sp = sp[["user_id", "started_at", "finished_at", "geom", "location_id"]]
    sp = sp.as_staypoints.merge_staypoints(
        triplegs=pd.DataFrame([]), max_time_gap="1min", agg={"location_id": "first"}
    )
    sp["duration"] = (sp["finished_at"] - sp["started_at"]).dt.total_seconds() // 60
    done("merge", f"{len(sp)} staypoints after merging")

    # 10. time features
    sp = add_time_features(sp)
    done("time_features", f"{len(sp)} staypoints, {sp['user_id'].nunique()} users")

    # 11-12. split, encode, valid target ids (O(n^2) row loop)
    train, val, test = split_by_day(sp)
    encode_locations(train, val, test)
    valid_ids = valid_target_ids(train)
    valid_ids.extend(valid_target_ids(val))
    valid_ids.extend(valid_target_ids(test))
    all_ids = sp[["id"]].copy()
    all_ids[str(PREVIOUS_DAY)] = 0
    all_ids.loc[all_ids["id"].isin(valid_ids), str(PREVIOUS_DAY)] = 1
    all_ids = all_ids.set_index("id")
    final_valid_ids = all_ids.loc[all_ids.sum(axis=1) == all_ids.shape[1]].reset_index()["id"].values
    done("valid_ids", f"{len(final_valid_ids)} valid target ids")

    # 13, 16. users with valid targets in every split, re-encoded 1..U
    users_per_split = [
        part.loc[part["id"].isin(final_valid_ids), "user_id"].unique() for part in (train, val, test)
    ]
    kept_users = set.intersection(*(set(u) for u in users_per_split))
    kept = sp.loc[sp["user_id"].isin(kept_users)].copy()
    kept["user_id"] = OrdinalEncoder(dtype=np.int64).fit_transform(kept["user_id"].values.reshape(-1, 1)) + 1
    with open(out_dir / "valid_ids_geolife.pk", "wb") as fh:
        pickle.dump(final_valid_ids, fh, protocol=pickle.HIGHEST_PROTOCOL)
    kept.to_csv(out_dir / "dataset_geolife.csv", index=False)
    stats["n_users"] = int(kept["user_id"].nunique())
    done("user_filter", f"{stats['n_users']} users kept")

    # 14-18. dataloader stage: reload, cap duration, re-split, encode, build samples (row loop again)
    with open(out_dir / "valid_ids_geolife.pk", "rb") as fh:
        valid_arr = pickle.load(fh)
    data = pd.read_csv(out_dir / "dataset_geolife.csv")
    data.sort_values(by=["user_id", "start_day", "start_min"], inplace=True)
    data.loc[data["duration"] > MAX_DURATION, "duration"] = MAX_DURATION
    train, val, test = split_by_day(data)
    encode_locations(train, val, test)
    stats["total_loc_num"] = int(train["location_id"].max()) + 1
    stats["n_staypoints"] = {"train": len(train), "val": len(val), "test": len(test)}
    n_samples = {}
    for key, fname, part in (("train", "train", train), ("val", "validation", val), ("test", "test", test)):
        samples = build_samples(part, valid_arr)
        with open(out_dir / f"{fname}.pk", "wb") as fh:
            pickle.dump(samples, fh, protocol=pickle.HIGHEST_PROTOCOL)
        n_samples[key] = len(samples)
    stats["n_samples"] = n_samples
    done("samples", f"samples {n_samples}")

    stats["step_seconds"] = steps
    sys.stdout.write(json.dumps(stats) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
