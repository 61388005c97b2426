"""Batch scoring benchmark: N histories of visits -> answers, with the registered champion.

Builds ``--n`` histories (``history_id`` 0..N-1) from a preprocessed dataset's test samples, cycling over
them: each history is the sample's visits (real times, each place at its location's centre, a new place
far away), written as ``many_users.parquet``; then times each step of ``nextloc predict`` in-process and
prints JSON. Time the command itself with::

    python benchmarks/predict.py --data-dir data/geolife --out /tmp/many_users.parquet --write-only
    time nextloc predict --model pointer_plus --history /tmp/many_users.parquet > /tmp/answers.json

``--cold`` times one answer from a cold process instead: ``nextloc predict`` for one week of one user's
visits (``--user``, default 153), ``--repeats`` times (median; one unmeasured run first writes the bytecode
caches). ``--serve`` times ``nextloc serve``: ``--requests`` POSTs of the same week, one after another (p50,
p95). ``--source DIR`` runs the command from another checkout of the code (the numbers before a change), with
this store and data. Both modes print JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq


def many_histories(data_dir: Path, n: int) -> pd.DataFrame:
    sp = pd.read_parquet(data_dir / "staypoints.parquet").set_index("id")
    centres = pd.read_parquet(data_dir / "vocabulary" / "locations.parquet").set_index("loc_index")
    table = pq.read_table(data_dir / "samples" / "test.parquet")
    targets = table.column("staypoint_id").to_numpy()
    lengths = table.column("hist_len").to_numpy()
    frames = []
    for h in range(n):
        i = h % len(targets)
        pos = sp.index.get_loc(targets[i])
        rows = sp.iloc[pos - lengths[i] : pos]
        known = rows["location_id"].to_numpy() >= 2
        frames.append(
            pd.DataFrame(
                {
                    "history_id": h,
                    "user_id": rows["user_id"].to_numpy(np.int64),
                    "started_at": rows["started_at"].to_numpy(),
                    "finished_at": rows["finished_at"].to_numpy(),
                    "latitude": np.where(
                        known, centres["latitude"].reindex(rows["location_id"]).to_numpy(), -45.0
                    ),
                    "longitude": np.where(
                        known, centres["longitude"].reindex(rows["location_id"]).to_numpy(), 170.0
                    ),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data/geolife"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/many_users.parquet"))
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--model", default="pointer_plus")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--experiment", default="nextloc-geolife")
    parser.add_argument("--write-only", action="store_true")
    parser.add_argument("--cold", action="store_true", help="time `nextloc predict` from a cold process")
    parser.add_argument("--serve", action="store_true", help="time requests to `nextloc serve`")
    parser.add_argument("--user", type=int, default=153)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    if args.cold or args.serve:
        from predict_latency import latency_report  # beside this file

        print(json.dumps(latency_report(args)))
        return

    visits = many_histories(args.data_dir, args.n)
    visits.to_parquet(args.out, index=False)
    report = {"histories": args.n, "visits": len(visits), "file": str(args.out)}
    if not args.write_only:
        from nextloc.histories import encode_visits
        from nextloc.history_reader import read_history
        from nextloc.predict import predict
        from tasks.evaluate import load_registered

        t0 = time.perf_counter()
        bundle = load_registered(args.model, "champion", args.tracking_uri, args.experiment)
        t1 = time.perf_counter()
        raw = read_history(args.out, bundle.preprocess)
        t2 = time.perf_counter()
        histories = encode_visits(raw.data, bundle)
        t3 = time.perf_counter()
        answers = predict(bundle, histories, k=5)
        t4 = time.perf_counter()
        report.update(
            answers=len(answers),
            locations=len(bundle.locations),
            load_model_s=round(t1 - t0, 2),
            read_and_check_s=round(t2 - t1, 2),
            encode_s=round(t3 - t2, 2),
            score_s=round(t4 - t3, 2),
            total_s=round(t4 - t1, 2),
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
