"""A router's start-up: CPU time from exec to "listening", paired against another tree.

    python tests/bench/bench_start.py                          # this tree, 5 runs per case
    python tests/bench/bench_start.py --base /tmp/base-path    # alternate runs with a base

--base is a folder holding ``aa/`` whose subfolders link to another checkout's top-level
folders (``aa/mesh -> /tmp/base/mesh``, ...): it goes first on PYTHONPATH, so the same
interpreter runs that tree (docs/notes-lazy6.md shows how to make one from ``main``).

Cases: ``aa router --port 0 --no-discovery --no-http`` (no data folder: no store, no event
log) and the same with HTTP on (``--http-port 0``), each started as ``python -m aa.tools``;
and ``import aa.router`` alone, which is what ``aa send --persist`` adds to a send. The
figure is the process's user+system CPU (/proc/PID/stat) when it prints that it listens (or,
for the import, at exit), not wall time: the machine is shared, CPU time is steadier. Runs
alternate tree by tree within each round, so both see the same load.

Output: one JSON line per case (median, min, max in ms per tree, the ratio branch/base
of the medians, the load before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time

_TICK = os.sysconf("SC_CLK_TCK")
ROUTER = ["-m", "aa.tools", "router", "--port", "0", "--no-discovery", "--name", "bench"]
CASES = {
    "router --no-http": [*ROUTER, "--no-http"],
    "router (HTTP on)": [*ROUTER, "--http-port", "0"],
    "import aa.router": ["-c", "import aa.router"],
}
#: Seconds a router has to say it listens (a loaded 2-core machine imports slowly).
START_TIMEOUT = 60.0


def _cpu_ms(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / _TICK  # utime, stime


def one(argv: list[str], pythonpath: str | None) -> float:
    """CPU ms of one run: to "listening" for a router, to exit for an import."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.Popen(
        [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    assert proc.stdout is not None
    try:
        if argv[0] == "-c":
            # children's CPU of a waited-for process: os.wait4 gives the rusage of that pid
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return (usage.ru_utime + usage.ru_stime) * 1000
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT)
        line = proc.stdout.readline().decode() if ready else ""
        if "listening on" not in line:
            raise RuntimeError(f"no 'listening' line: {line!r}")
        return _cpu_ms(proc.pid)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--base", help="PYTHONPATH folder of the tree to pair with")
    args = p.parse_args()
    trees = {"branch": None, **({"base": args.base} if args.base else {})}
    for case, argv in CASES.items():
        load_before = os.getloadavg()[0]
        got: dict[str, list[float]] = {t: [] for t in trees}
        for _ in range(args.runs):
            for tree, path in trees.items():
                got[tree].append(one(argv, path))
        row: dict[str, object] = {"case": case, "runs": args.runs}
        for tree, ms in got.items():
            row[tree] = {
                "median_ms": round(statistics.median(ms)),
                "min_ms": round(min(ms)),
                "max_ms": round(max(ms)),
            }
        if args.base:
            row["ratio"] = round(
                statistics.median(got["branch"]) / statistics.median(got["base"]), 2
            )
        row["load"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
        row["at"] = time.strftime("%H:%M:%S")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
