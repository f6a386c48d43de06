"""Benchmark of `aa mine`: the curve of events mined per second against the log's size on
this machine (100,000, 1 M and 10 M logged events by default), and the linear fit.

Logs of the simulated office (`aa mine simulate`: 100 people, two routers logging with 30 %
overlap, so a miner de-duplicates) are made once, in chunks of `CHUNK` logged events made
in parallel, and cached in ``$AA_BENCH_DIR`` (default ``/tmp/aa-bench-mining``); making
them is not timed (a 10 M log is 10 chunks, ~2 min per chunk per core, once). A size below
a chunk is a log of its own; a size of n chunks mines the first n. Each size is mined in a
fresh Spark (``local[*]``) process by the real command line, all three tasks, timed end to
end (JVM start included: the fixed cost of the fit), with the machine's class archive
written first (``aa mine prepare``, as the install does). Each run also reports the
1-minute load average before and after it: on a shared machine the wall-clock rate says
little without it.

    .venv/bin/python tests/bench/bench_mining.py [--sizes 100000,1000000,10000000]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import AA, report

CHUNK = 1_000_000
OVERLAP = 0.3
PEOPLE = 100


def make_chunk(root: str, k: int, chunk: int) -> str:
    """Log *k* of *chunk* logged events under *root* (k = -1: a log of its own)."""
    from aa.tools.mining import SimulateConfig, simulate
    from aa.tools.mining.simulate import DEFAULT_START

    out = Path(root) / (f"chunk-{k:02d}" if k >= 0 else f"log-{chunk}")
    k = max(k, 0)
    if (out / "world.json").is_file():
        return str(out)
    # Chunk k is week k from its Monday: ~1.3 M logged events fit in Monday to Thursday.
    cfg = SimulateConfig(
        out=str(out),
        start=DEFAULT_START + timedelta(weeks=k),
        days=7,
        seed=k,
        people=PEOPLE,
        overlap=OVERLAP,
        max_events=round(chunk / (1 + OVERLAP)),
    )
    simulate(cfg)
    return str(out)


def mine(chunks: list[str], adapters: str) -> tuple[float, dict[str, int]]:
    t = time.perf_counter()
    out = subprocess.run(
        [AA, "mine", "--adapters", adapters, "--quiet", *chunks], capture_output=True, text=True
    )
    seconds = time.perf_counter() - t
    if out.returncode:
        raise RuntimeError(out.stderr[-4000:])
    m = re.search(r"events: (\d+) read, (\d+) unique", out.stdout)
    assert m, out.stdout
    inner = re.findall(r"^(\w+): .*\(version \d+, ([\d.]+) s\)", out.stdout, re.M)
    return seconds, {
        "read": int(m[1]),
        "unique": int(m[2]),
        **{f"{k}_s": float(v) for k, v in inner},
    }


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b·x: (a, b, r²)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    b = sxy / sxx
    a = my - b * mx
    ss = sum((y - my) ** 2 for y in ys)
    r2 = 1 - sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / ss if ss else 1.0
    return a, b, r2


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--sizes",
        default="100000,1000000,10000000",
        help="logged events per run (default: 100000,1000000,10000000)",
    )
    ap.add_argument(
        "--chunk",
        type=int,
        default=CHUNK,
        help="logged events per cached chunk (default: 1,000,000)",
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    root = os.environ.get("AA_BENCH_DIR", "/tmp/aa-bench-mining") + f"/c{args.chunk}"
    t = time.perf_counter()
    n_chunks = max(round(n / args.chunk) for n in sizes)
    jobs = [(k, args.chunk) for k in range(n_chunks)] + [(-1, n) for n in sizes if n < args.chunk]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # not timed: cached logs
        made = list(
            pool.map(make_chunk, [root] * len(jobs), [k for k, _ in jobs], [c for _, c in jobs])
        )
    chunks, small = (
        made[:n_chunks],
        dict(zip([n for n in sizes if n < args.chunk], made[n_chunks:])),
    )
    print(f"logs ready in {time.perf_counter() - t:.0f} s: {root}", file=sys.stderr)
    subprocess.run([AA, "mine", "prepare"], check=True, capture_output=True)  # as the install does
    rows = []
    print(
        f"{'events':>12} {'seconds':>8} {'events/s':>9}  load (1 min, before/after)",
        file=sys.stderr,
    )
    for n in sizes:
        logs = [small[n]] if n in small else chunks[: round(n / args.chunk)]
        load = os.getloadavg()[0]  # the machine may be shared: say how busy it was
        seconds, counts = mine(logs, f"{root}/adapters-{n}")
        rows.append(
            {
                "size": n,
                "seconds": round(seconds, 1),
                **counts,
                "events_per_s": round(counts["read"] / seconds),
                "load_1min": [round(load, 1), round(os.getloadavg()[0], 1)],
            }
        )
        r = rows[-1]
        print(
            f"{r['read']:>12,} {r['seconds']:>8.1f} {r['events_per_s']:>9,}  "
            f"{load:.1f}/{os.getloadavg()[0]:.1f}",
            file=sys.stderr,
        )
    a, b, r2 = (
        fit([r["read"] for r in rows], [r["seconds"] for r in rows])
        if len(rows) > 1
        else (0.0, 0.0, 1.0)
    )
    report(
        "mining",
        {
            "runs": rows,
            "fit": {
                "fixed_s": round(a, 1),
                "us_per_event": round(b * 1e6, 2),
                "r2": round(r2, 4),
                "marginal_events_per_s": round(1 / b) if b > 0 else None,
            },
        },
    )


if __name__ == "__main__":
    main()
