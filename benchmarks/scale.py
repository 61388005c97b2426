"""Benchmark: the whole preprocessing (and one short training) on synthetic data at 1x, 4x and 16x GeoLife.

Sizes are multiples of GeoLife 1.3's point count (24,722,141 fixes): ``round(182 * size)`` synthetic users
(GeoLife has 182) of 100 days each (about 1,360 fixes a day: a fix every 5 s while moving, every 60 s
while staying), so a larger size has more users, not longer ones. For each size:

1. ``generate``: :func:`nextloc.synth.generate` streams the fixes, one user-day at a time, into one parquet
   file (row groups of about a million rows), never holding the data set;
2. ``preprocess`` with each runner: the ``preprocess`` flow on that file (``input_format="parquet"``):
   ``local`` (the thread pool) and ``dask`` (a 2-worker ``LocalCluster``; DBSCAN by ``--dbscan-tiles``
   spatial tiles on the workers). Each run is a fresh process with an empty data directory;
3. ``train``: ``nextloc train --model markov,mhsa --train-set max_epochs=1`` on the local runner's output;
   then ``ranker_<runner>``: ``nextloc train --model ranker`` (the default champion, seed 0) on each runner
   (``local``: the process pool; ``dask``: ``--task-runner dask``, a new 2-worker ``LocalCluster``), each on
   a fresh copy of that output, with its cost per training sample (wall and CPU ms) and its ratio to the
   smallest size's in ``scaling`` (target: flat within 1.5x, no process above 4 GB);
4. the size's data is deleted.

Every measured command is its own process tree, run under a wrapper: wall, CPU (user+sys of the tree,
``RUSAGE_CHILDREN``), the largest single process's peak RSS, and the tree's peak RSS (the sum over its
processes, sampled with psutil every 0.2 s: Dask workers are processes of their own). The preprocessing
stages are the flow's task runs (start and end read from the Prefect API): ``ingest`` (read and partition
per user), ``staypoints`` (per user), ``locations`` (quality filter + dataset-level DBSCAN) and
``dataset`` (merge, split, samples, vocabulary); their CPU and peak RSS are read off the sampled tree
over each stage's time span; ``flow`` is the whole flow (the process also starts Prefect's temporary API
and imports, about 10 s; the preprocessing's cost per million fixes is the flow's). Each stage's cost per million fixes (wall and CPU seconds) and its ratio to
the smallest size's are in ``scaling`` (target: flat within 1.5x). Prints one JSON object on stdout::

    python benchmarks/scale.py --sizes 1,4,16 --runners local,dask
    python benchmarks/scale.py --quick           # a tiny size (a few thousand fixes a user), seconds
    python benchmarks/scale.py --sizes 1,4,16 --ranker-only   # steps 1-3 for the ranker alone (issue 48)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from flows import OFFLINE_DEFAULTS
from services import local_api

sys.path.insert(0, str(Path(__file__).resolve().parent))
from preprocess import _WRAPPER  # noqa: E402  (the one measuring wrapper, benchmarks/preprocess.py)

REPO = Path(__file__).resolve().parents[1]
GEOLIFE_FIXES = 24_722_141
GEOLIFE_USERS = 182
DAYS = 100
STAGES = {  # stage -> task run name prefixes (see flows.preprocess._batch_name)
    "ingest": ("ingest-table",),
    "staypoints": ("staypoints user ", "generate-staypoints-user"),  # one user, or a batch of users
    "locations": ("locate-staypoints",),
    "dataset": ("build-dataset",),
}
SAMPLE_EVERY_S = 0.2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16", help="multiples of GeoLife's 24.7M fixes, e.g. 1,4,16")
    parser.add_argument("--runners", default="local,dask", help="comma list of local, dask")
    parser.add_argument(
        "--quick", action="store_true", help="one tiny size instead of --sizes (a smoke test)"
    )
    parser.add_argument("--no-train", action="store_true", help="skip the short training")
    parser.add_argument(
        "--ranker-only",
        action="store_true",
        help="preprocess with the first runner only and train only the ranker (on each runner)",
    )
    parser.add_argument("--dbscan-tiles", type=int, default=4, help="DBSCAN tiles on the Dask runner")
    parser.add_argument("--dask-workers", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "nextloc-scale")
    parser.add_argument("--keep-data", action="store_true", help="keep each size's files (default: delete)")
    parser.add_argument(
        "--train-only",
        action="store_true",
        help="train the ranker (on each runner) on each size's data kept in --work-dir by a --keep-data run",
    )
    parser.add_argument(
        "--visits-above", type=float, default=16, help="sizes above this generate visits, not fixes"
    )
    parser.add_argument("--visits", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=["generate", "preprocess"], help=argparse.SUPPRESS)
    parser.add_argument("--size", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--runner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "generate":
        return _generate(args.size, args.out, args.quick, args.visits)
    if args.worker == "preprocess":
        return _preprocess(args.out, args.runner, args.dask_workers, args.dbscan_tiles)

    runners = [r for r in args.runners.split(",") if r]
    unknown = set(runners) - {"local", "dask"}
    if unknown:
        parser.error(f"--runners: unknown {sorted(unknown)}; expected local, dask")
    sizes = [0.0] if args.quick else [float(s) for s in args.sizes.split(",") if s]
    env = _env(args.work_dir)
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "command": " ".join(["python", "benchmarks/scale.py", *sys.argv[1:]]),
        "geolife_fixes": GEOLIFE_FIXES,
        "runs": [],
    }
    try:
        for size in sizes:
            results["runs"].append((_train_kept if args.train_only else _run_size)(size, runners, args, env))
    finally:  # the trainings' `nextloc train` started the project's local Prefect API in this Prefect home
        local_api.stop_server(Path(env["PREFECT_HOME"]))
    results["scaling"] = _scaling(results["runs"])
    json.dump(results, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _run_size(size: float, runners: list[str], args: argparse.Namespace, env: dict[str, str]) -> dict:
    """Generate one size, preprocess it with each runner, train once, delete it."""
    root = args.work_dir / f"size-{size:g}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    visits = size > args.visits_above  # the disk holds visits, not fixes, above it
    input_file = root / ("visits.parquet" if visits else "fixes.parquet")
    me = [sys.executable, __file__] + (["--quick"] if args.quick else [])
    generate = [*me, "--worker", "generate", "--size", str(size), "--out", str(input_file)]
    gen = _measure(generate + (["--visits"] if visits else []), env)
    n_fixes = gen.pop("positionfixes")
    run: dict = {
        "size": "quick" if args.quick else f"{size:g}x",
        "users": gen.pop("users"),
        "days": gen.pop("days"),
        "input": "visits" if visits else "fixes",
        "fixes": n_fixes,
        "visits": gen.pop("visits"),
        "input_mb": round(input_file.stat().st_size / 2**20, 1),
        "generate": {**gen, **_per_mfix(gen, n_fixes)},
    }
    print(f"[scale] {run['size']}: {run['input']} generated in {gen['wall_s']} s", file=sys.stderr)
    digests = {}
    for runner in runners[:1] if args.ranker_only else runners:
        data_dir = root / f"out-{runner}"
        cmd = [
            *me,
            "--worker",
            "preprocess",
            "--runner",
            runner,
            "--out",
            str(data_dir),
            "--dask-workers",
            str(args.dask_workers),
            "--dbscan-tiles",
            str(args.dbscan_tiles if runner == "dask" else 0),
        ]
        measured = _measure(cmd, env)
        stages = {
            name: {**span, **_per_mfix(span, n_fixes)} for name, span in measured.pop("stages", {}).items()
        }
        # the process also starts Prefect's temporary API and imports: the cost per fix is the flow's
        run[f"preprocess_{runner}"] = {**measured, **_per_mfix(stages["flow"], n_fixes), "stages": stages}
        if len(runners) > 1:
            digests[runner] = _digests(data_dir)
        print(f"[scale] {run['size']} {runner}: {measured['wall_s']} s", file=sys.stderr)
    if len(digests) > 1:
        first = next(iter(digests.values()))
        run["outputs_identical_across_runners"] = all(d == first for d in digests.values())
    if not args.no_train:
        data_dir = root / f"out-{runners[0]}"
        meta = json.loads((data_dir / "metadata.json").read_text())
        run["samples"] = meta["n_samples"]
        if not args.ranker_only:
            short = ["--model", "markov,mhsa", "--train-set", "max_epochs=1"]
            run["train"] = {
                **_train(data_dir, root, short, env, "short"),
                "models": "markov + mhsa (1 epoch)",
            }
            run["train"].update(_per_mfix(run["train"], n_fixes))
        run.update(_rankers(data_dir, root, runners, args, env, run["size"]))
    if not args.keep_data:
        shutil.rmtree(root, ignore_errors=True)
    return run


def _train_kept(size: float, runners: list[str], args: argparse.Namespace, env: dict[str, str]) -> dict:
    """Train the ranker on each runner on one size's data kept by an earlier ``--keep-data`` run."""
    root = args.work_dir / f"size-{size:g}"
    data_dir = root / f"out-{runners[0]}"
    if not (data_dir / "metadata.json").is_file():
        raise SystemExit(f"--train-only: no kept data in {data_dir} (run with --keep-data first)")
    run = {"size": f"{size:g}x", "kept_data": str(data_dir)}
    run["samples"] = json.loads((data_dir / "metadata.json").read_text())["n_samples"]
    return {**run, **_rankers(data_dir, root, runners, args, env, run["size"])}


def _rankers(
    data_dir: Path, root: Path, runners: list[str], args: argparse.Namespace, env: dict[str, str], size: str
) -> dict:
    """The default champion, one seed, trained on each runner (a fresh copy of the data each), measured."""
    n_train = json.loads((data_dir / "metadata.json").read_text())["n_samples"]["train"]
    out = {}
    for runner in runners:
        ranker = _train(data_dir, root, ["--model", "ranker", *_runner_args(runner, args)], env, runner)
        out[f"ranker_{runner}"] = {**ranker, **_per_sample(ranker, n_train)}
        print(f"[scale] {size} ranker {runner}: {ranker['wall_s']} s", file=sys.stderr)
    return out


def _train(data_dir: Path, root: Path, options: list[str], env: dict[str, str], name: str) -> dict:
    """``nextloc train`` with ``options`` on a copy of ``data_dir`` (no cached result), measured."""
    copy = root / f"train-{name}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(data_dir, copy, ignore=shutil.ignore_patterns("_cache", "results", "01_*", "02_*"))
    nextloc = str(Path(sys.executable).with_name("nextloc"))
    tracking = ["--tracking-uri", f"sqlite:///{root / f'mlflow-{name}.db'}", "--experiment", "nextloc-scale"]
    measured = _measure([nextloc, "train", "--data-dir", str(copy), *options, *tracking], env)
    results = copy / "results" / "ranker" / "seed0" / "results.json"  # where the ranker's time went
    if results.is_file():
        measured["stage_seconds"] = json.loads(results.read_text()).get("stage_seconds")
    shutil.rmtree(copy, ignore_errors=True)
    return measured


def _runner_args(runner: str, args: argparse.Namespace) -> list[str]:
    if runner == "dask":
        return ["--task-runner", "dask", "--dask-workers", str(args.dask_workers)]
    return ["--workers", "1"]


def _per_sample(measured: dict, n_train: int) -> dict:
    """Wall and CPU milliseconds per training sample."""
    return {
        "train_samples": n_train,
        "wall_ms_per_sample": round(1e3 * measured["wall_s"] / max(n_train, 1), 3),
        "cpu_ms_per_sample": round(1e3 * measured["cpu_s"] / max(n_train, 1), 3),
    }


def _generate(size: float, out: Path, quick: bool, visits: bool = False) -> int:
    """Worker: stream the synthetic fixes (or ``visits``) of one size into one parquet file."""
    sys.path.insert(0, str(REPO))
    from nextloc.synth import ParquetSink, SynthConfig, generate

    if quick:  # 4 users, 80 days, sparse fixes: enough for samples in every split
        config = SynthConfig(n_users=4, n_days=80, moving_interval_s=120.0, staying_interval_s=900.0)
    else:
        config = SynthConfig(n_users=max(1, round(GEOLIFE_USERS * size)), n_days=DAYS)
    sink = None if visits else ParquetSink(out, row_group_rows=1 << 20)
    counts = generate(config, "visits" if visits else "parquet", out, sink=sink)
    print(json.dumps({"days": config.n_days, **counts}))
    return 0


def _preprocess(data_dir: Path, runner: str, dask_workers: int, dbscan_tiles: int) -> int:
    """Worker: the preprocess flow on the size's parquet file; prints the flow's stage spans."""
    from flows import configure_environment

    configure_environment(REPO)
    from prefect import flow

    from flows.preprocess import preprocess
    from runtime.runners import make_task_runner

    flow(name="warm-up-api")(lambda: None)()  # the temporary API's start, not the pipeline's
    start = time.time()
    visits = data_dir.parent / "visits.parquet"
    result = preprocess.with_options(task_runner=make_task_runner(runner, dask_workers))(
        raw_dir=str(visits if visits.is_file() else data_dir.parent / "fixes.parquet"),
        data_dir=str(data_dir),
        input_format="visits" if visits.is_file() else "parquet",
        dbscan_tiles=dbscan_tiles,
    )
    end = time.time()
    stages = _stage_spans(result["flow_run_id"])
    stages["flow"] = {"start": start, "end": end}
    print(json.dumps({"n_samples": result["stats"]["n_samples"], "stages": stages}))
    return 0


def _stage_spans(flow_run_id: str) -> dict[str, dict[str, float]]:
    """Each stage's first start and last end (epoch seconds) from the flow's task runs in the API.

    Task-run states reach the API through events, a moment after the flow returns: read until every
    task run is finished and the count is stable.
    """
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs: list = []
    started = time.time()
    with get_client(sync_client=True) as client:
        while time.time() < started + 60:
            page, runs = None, []
            while page is None or len(page) == 200:
                page = client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])),
                    limit=200,
                    offset=len(runs),
                )
                runs.extend(page)
            done = [r for r in runs if r.end_time is not None]
            if all(any(r.name.startswith(p) for r in done) for p in ("ingest-table", "build-dataset")):
                break
            time.sleep(0.5)
    print(f"[scale] task runs read in {time.time() - started:.1f} s", file=sys.stderr)
    spans: dict[str, dict[str, float]] = {}
    for stage, prefixes in STAGES.items():
        mine = [r for r in runs if r.name.startswith(prefixes) and r.start_time and r.end_time]
        if mine:
            spans[stage] = {
                "start": min(r.start_time.timestamp() for r in mine),
                "end": max(r.end_time.timestamp() for r in mine),
                "task_runs": len(mine),
            }
    return spans


class _TreeSampler(threading.Thread):
    """Samples a process tree's summed RSS and CPU seconds (epoch time, MB, s) until stopped."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[tuple[float, float, float]] = []
        self._cpu: dict[int, float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._halt.is_set():
            rss = 0
            with contextlib.suppress(psutil.NoSuchProcess):
                for proc in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied), proc.oneshot():
                        rss += proc.memory_info().rss
                        times = proc.cpu_times()
                        self._cpu[proc.pid] = times.user + times.system
            self.samples.append((time.time(), rss / 2**20, sum(self._cpu.values())))
            self._halt.wait(SAMPLE_EVERY_S)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def window(self, start: float, end: float) -> dict:
        """CPU seconds and peak tree RSS over ``[start, end]`` (the samples around it)."""
        inside = [s for s in self.samples if start - SAMPLE_EVERY_S <= s[0] <= end + SAMPLE_EVERY_S]
        if not inside:
            return {}
        return {
            "cpu_s": round(_cpu_at(self.samples, end) - _cpu_at(self.samples, start), 2),
            "peak_rss_mb": round(max(s[1] for s in inside), 1),
        }


def _cpu_at(samples: list[tuple[float, float, float]], t: float) -> float:
    """The tree's CPU seconds at time ``t``, interpolated between samples."""
    before = [s for s in samples if s[0] <= t]
    after = [s for s in samples if s[0] >= t]
    if not before:
        return after[0][2]
    if not after:
        return before[-1][2]
    (t0, _, c0), (t1, _, c1) = before[-1], after[0]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def _measure(cmd: list[str], env: dict[str, str]) -> dict:
    """Wall, CPU, peak RSS (largest process, and the sampled tree) of one command, plus its JSON line."""
    with tempfile.NamedTemporaryFile(suffix=".json") as usage_file:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRAPPER, usage_file.name, *cmd],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        sampler = _TreeSampler(proc.pid)
        sampler.start()
        stdout, stderr = proc.communicate()
        sampler.stop()
        wall = time.perf_counter() - start
        usage = json.loads(Path(usage_file.name).read_text() or "{}")
    if proc.returncode != 0:
        sys.stderr.write(stdout[-4000:] + stderr[-8000:])
        raise SystemExit(f"benchmark command failed: {' '.join(cmd)}")
    out = {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage["cpu_s"], 2),
        "peak_rss_mb": round(max((s[1] for s in sampler.samples), default=0.0), 1),
        "peak_rss_largest_process_mb": round(usage["maxrss_kb"] / 1024, 1),
    }
    last = stdout.strip().splitlines()[-1] if stdout.strip() else "{}"
    with contextlib.suppress(json.JSONDecodeError):
        out.update(json.loads(last))
    spans = out.pop("stages", None)
    if spans is not None:
        out["stages"] = {}
        for name, span in spans.items():
            entry = {
                "wall_s": round(span["end"] - span["start"], 2),
                **sampler.window(span["start"], span["end"]),
            }
            if "task_runs" in span:
                entry["task_runs"] = span["task_runs"]
            out["stages"][name] = entry
    return out


def _per_mfix(measured: dict, n_fixes: int) -> dict:
    """Wall and CPU seconds per million fixes (none without fixes: visits were read)."""
    if not n_fixes:
        return {}
    m = n_fixes / 1e6
    out = {"wall_s_per_mfix": round(measured["wall_s"] / m, 3)}
    if "cpu_s" in measured:
        out["cpu_s_per_mfix"] = round(measured["cpu_s"] / m, 3)
    return out


def _scaling(runs: list[dict]) -> dict:
    """Per runner and stage: cost per million fixes at each size, its ratio to the smallest size, peak RSS."""
    out: dict = {}
    if not runs:
        return out
    keys = [k for k in runs[0] if k.startswith("preprocess_")] + ["generate", "train"]
    for key in keys:
        entries = {"whole": [r.get(key) for r in runs]}
        for stage in STAGES:
            entries[stage] = [r.get(key, {}).get("stages", {}).get(stage) for r in runs]
        for stage, per_size in entries.items():
            if not all(e and "wall_s_per_mfix" in e for e in per_size):
                continue
            base = per_size[0]
            name = key if stage == "whole" else f"{key}.{stage}"
            out[name] = {
                r["size"]: {
                    "wall_s_per_mfix": e["wall_s_per_mfix"],
                    "wall_ratio": round(e["wall_s_per_mfix"] / base["wall_s_per_mfix"], 2)
                    if base["wall_s_per_mfix"]
                    else None,
                    "cpu_s_per_mfix": e.get("cpu_s_per_mfix"),
                    "peak_rss_mb": e.get("peak_rss_mb"),
                }
                for r, e in zip(runs, per_size, strict=True)
            }
    for key in [k for k in runs[0] if k.startswith("ranker_")]:
        per_size = [r.get(key) for r in runs]
        if all(per_size):
            base = per_size[0]["wall_ms_per_sample"]
            out[key] = {
                r["size"]: {
                    "wall_ms_per_sample": e["wall_ms_per_sample"],
                    "wall_ratio": round(e["wall_ms_per_sample"] / base, 2) if base else None,
                    "cpu_ms_per_sample": e["cpu_ms_per_sample"],
                    "peak_rss_largest_process_mb": e["peak_rss_largest_process_mb"],
                    "peak_rss_mb": e["peak_rss_mb"],
                }
                for r, e in zip(runs, per_size, strict=True)
            }
    return out


def _digests(root: Path) -> dict[str, str]:
    """Content hashes of a data directory's outputs (the task cache and scratch files left out)."""
    files = [
        p for p in root.rglob("*") if p.is_file() and "_cache" not in p.parts and not p.name.startswith(".")
    ]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _env(work_dir: Path) -> dict[str, str]:
    (work_dir / "prefect").mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "PREFECT_HOME": str(work_dir / "prefect"),
        **OFFLINE_DEFAULTS,
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }


if __name__ == "__main__":
    sys.exit(main())
