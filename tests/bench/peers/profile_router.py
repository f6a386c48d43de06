"""Profile Aa's router during bench_router.py's throughput run, with py-spy, and print where
its time goes: the functions with the most samples of their own (self) and the most
samples under them (total), as % of the router's busy samples.

    python tests/bench/peers/profile_router.py                       # 300,000 events
    python tests/bench/peers/profile_router.py --events 100000 --out /tmp/router.txt
    python tests/bench/peers/profile_router.py -- --event-log        # bench_router.py flags

py-spy (tests/bench/peers/.venv, from setup.sh) samples the router process from outside,
non-blocking, so the router runs unchanged; idle samples (waiting in epoll) are left out.
Sampling starts once the router listens (its imports are left out) and ends with it; the
latency run of bench_router.py is cut to 100 events, so nearly every sample is from the
2,000-event warm-up and the throughput run. --out keeps the raw collapsed stacks (one line
per stack, its count last) for flame graphs or a before/after diff.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY_SPY = HERE / ".venv" / "bin" / "py-spy"
BENCH = HERE.parent / "bench_router.py"
sys.path.insert(0, str(HERE.parent))
from common import children  # noqa: E402

FIND_S = 60.0  # the router must have started by then


def router_of(bench: subprocess.Popen[bytes]) -> int:
    """The pid of the `aa router` process bench_router.py started."""
    deadline = time.monotonic() + FIND_S
    while time.monotonic() < deadline and bench.poll() is None:
        for pid in children(bench.pid):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"router" in cmd and any(c.endswith(b"/aa") for c in cmd):
                return pid
        time.sleep(0.05)
    raise SystemExit("profile_router: bench_router.py started no router")


def await_clients(bench: subprocess.Popen[bytes], router: int) -> None:
    """Wait until bench_router.py starts its first client process: it does so once the
    router said it listens, so the samples leave out the router's imports and start-up."""
    deadline = time.monotonic() + FIND_S
    while time.monotonic() < deadline and bench.poll() is None:
        if any(pid != router for pid in children(bench.pid)):
            return
        time.sleep(0.01)
    raise SystemExit("profile_router: bench_router.py started no client")


def frame_name(frame: str) -> str:
    """`send (aa/router/session.py:120)` → `send (aa/router/session.py)`: one entry per function."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def summarize(raw: Path, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    under: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_name(f) for f in stack.split(";")]
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            under[f] += n
    if not total:
        return "no samples\n"
    lines = [f"{total} busy samples of the router", "", "self %  function (file)"]
    lines += [f"{100 * n / total:6.1f}  {f}" for f, n in own.most_common(top)]
    lines += ["", "total %  function (file)"]
    lines += [f"{100 * n / total:7.1f}  {f}" for f, n in under.most_common(top * 2)]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--events", type=int, default=300_000, help="events of the throughput run (default: 300000)"
    )
    ap.add_argument(
        "--rate", type=int, default=200, help="py-spy samples per second (default: 200)"
    )
    ap.add_argument("--top", type=int, default=30, help="functions to list (default: 30)")
    ap.add_argument(
        "--out", type=Path, default=None, help="keep py-spy's raw collapsed stacks here"
    )
    ap.add_argument(
        "--native",
        action="store_true",
        help="also sample C frames (msgpack, asyncio's C parts); py-spy then pauses the "
        "router for each sample, which costs it a little time",
    )
    ap.add_argument("bench_args", nargs="*", help="more flags for bench_router.py, after --")
    args = ap.parse_args()
    if not PY_SPY.exists():
        raise SystemExit(f"profile_router: no {PY_SPY}; run tests/bench/peers/setup.sh")
    print("load at start:", " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    bench = subprocess.Popen(
        [
            sys.executable,
            str(BENCH),
            "--events",
            str(args.events),
            "--latency-events",
            "100",
            *args.bench_args,
        ]
    )
    try:
        pid = router_of(bench)
        await_clients(bench, pid)
        with tempfile.TemporaryDirectory() as tmp:
            raw = args.out or Path(tmp) / "router.txt"
            mode = ["--native"] if args.native else ["--nonblocking"]
            spy = subprocess.run(
                [
                    str(PY_SPY),
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    str(args.rate),
                    *mode,
                    "--format",
                    "raw",
                    "--output",
                    str(raw),
                ],
                capture_output=True,
                text=True,
            )
            if spy.returncode != 0 and not raw.exists():
                raise SystemExit(f"profile_router: py-spy failed: {spy.stderr.strip()}")
            bench.wait(600)
            print("load at end:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
            print(summarize(raw, args.top), end="")
    finally:
        if bench.poll() is None:
            bench.terminate()
            bench.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
