"""Run every benchmark of tests/bench in turn (`make bench`); each prints JSON lines.

    python tests/bench/run_all.py                 # all but mining
    python tests/bench/run_all.py --with-mining   # also the 1M/3M/10M mining run (long)

Benchmarks are not part of the test suite: they take minutes and their figures depend on the
machine. Each reports the router's CPU per event where it matters, the steadier figure on a
machine that is doing other things too.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ["bench_router.py", "bench_store.py", "bench_eventlog.py", "bench_ring.py", "bench_http.py"]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--with-mining", action="store_true", help="also run bench_mining.py (tens of minutes)"
    )
    args = ap.parse_args()
    failed = []
    for name in ORDER + (["bench_mining.py"] if args.with_mining else []):
        print(f"== {name}", flush=True)
        if subprocess.call([sys.executable, str(HERE / name)]) != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
