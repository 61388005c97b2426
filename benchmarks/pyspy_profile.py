"""Profile a nextloc command with py-spy (every thread and subprocess) and keep a small summary file.

    python benchmarks/pyspy_profile.py --name preprocess-cold -- nextloc preprocess --raw-dir /tmp/geolife \\
        --data-dir /tmp/prof/out

writes ``benchmarks/profiles/<name>.txt``: the command, then the inclusive share of samples of the
project's functions and of the heaviest library frames, then the collapsed stacks that hold at least
0.2% of the samples (``py-spy`` raw format, readable by flamegraph tools). Samples are taken at 50 Hz of
threads that are running (``--idle`` adds waiting ones), so a share is a share of the process tree's CPU
time; its wall time is printed at the top. Needs ``py-spy`` (``pip install py-spy``; root or ptrace permission).
"""

from __future__ import annotations

import argparse
import collections
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OURS = ("/nextloc/", "/tasks/", "/flows/")
OURS_SHORT = tuple(f"({o.strip('/')}/" for o in OURS)
MIN_SHARE = 0.002


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="file name under benchmarks/profiles/")
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--idle", action="store_true", help="sample idle threads too (waiting time)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args()
    command = [c for c in args.command if c != "--"]
    typed = ["python", "benchmarks/pyspy_profile.py", "--name", args.name, "--", *command]
    local = Path(sys.executable).with_name(command[0]) if command and "/" not in command[0] else None
    if local is not None and local.exists():  # `nextloc`: this environment's script
        command[0] = str(local)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.txt"
        start = time.perf_counter()
        subprocess.run(
            [py_spy, "record", "--subprocesses", "-r", str(args.rate), "-f", "raw", "-o", str(raw)]
            + (["--idle"] if args.idle else [])
            + ["--", *command],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - start
        text = summarise(raw.read_text().splitlines(), typed, wall)
    target = REPO / "benchmarks" / "profiles" / f"{args.name}.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    sys.stdout.write(text.split("\n# collapsed stacks", 1)[0])
    return 0


def summarise(lines: list[str], command: list[str], wall: float) -> str:
    """The summary file's text (see the module docstring); ``command`` is the profiling command as typed."""
    stacks: collections.Counter[str] = collections.Counter()
    for line in lines:
        stack, _, count = line.rpartition(" ")
        stacks[stack] += int(count)
    total = sum(stacks.values()) or 1
    inclusive: collections.Counter[str] = collections.Counter()
    for stack, n in stacks.items():
        for frame in {_frame(f) for f in stack.split(";")[1:]}:
            inclusive[frame] += n
    out = [
        f"# command: {shlex.join(command)}",
        f"# wall {wall:.1f} s (under py-spy), {total} samples",
        "# inclusive share of samples, project functions:",
    ]
    out += [
        f"{100 * n / total:6.2f}%  {f}" for f, n in inclusive.most_common() if any(o in f for o in OURS_SHORT)
    ][:60]
    out.append("# inclusive share of samples, heaviest other frames:")
    out += [
        f"{100 * n / total:6.2f}%  {f}"
        for f, n in inclusive.most_common(200)
        if not any(o in f for o in OURS)
    ][:40]
    out.append("# collapsed stacks (>= 0.2% of samples)")
    out += [f"{s} {n}" for s, n in stacks.most_common() if n / total >= MIN_SHARE]
    return "\n".join(out) + "\n"


def _frame(frame: str) -> str:
    """``function (path/file.py:line)`` -> ``function (site-relative file)``, lines dropped."""
    match = re.match(r"(.*) \((.*):\d+\)$", frame)
    if not match:
        return frame
    name, path = match.groups()
    path = path.split("site-packages/")[-1]
    for marker in OURS:
        if marker in path:
            path = marker.strip("/") + "/" + path.split(marker, 1)[1]
            break
    return f"{name} ({path})"


if __name__ == "__main__":
    sys.exit(main())
