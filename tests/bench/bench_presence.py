"""How well presence (co-location) mining holds on simulated offices it was not tuned on: the
F1 of each office and the spread.

Each office is a working day (07:00 to 18:00 UTC, a scan round every 2 minutes) of
`aa mine simulate` with its own seed, 2–4 buildings, 2–4 routers and a radio overlap of
0.3–0.6, all drawn from the seed (`office_of`). The logs are made once and cached in
``$AA_BENCH_DIR/presence`` (default ``/tmp/aa-bench-mining/presence``). One Spark session
(``local[2]``) mines presence alone for each office with the default `PresenceConfig`, and
each artefact is scored against the world's ground truth (`aa.tools.mining.accuracy`).

Seeds: the presence defaults were tuned on `TUNE_SEEDS`; `HELD_OUT_SEEDS` are for reporting
(and the suite's test draws its offices from the same rule with seeds of its own).

    .venv/bin/python tests/bench/bench_presence.py [--seeds held-out|tune|1,2,3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: Seeds the presence defaults were tuned on.
TUNE_SEEDS = (101, 102, 103, 104, 105, 106, 110, 111, 112)
#: Seeds never looked at while tuning.
HELD_OUT_SEEDS = (201, 202, 203, 204, 205, 206, 207, 208, 501, 502, 503, 504, 505, 506)
#: A Monday, office hours: people arrive from 07:30, leave by 17:30.
START = datetime(2030, 1, 7, 7, 0, tzinfo=UTC)


def office_of(seed: int, *, people: int = 30) -> dict[str, Any]:
    """The office of *seed*: 2–4 buildings of 3 floors, 2–4 routers, overlap 0.3–0.6."""
    rng = random.Random(f"presence-office-{seed}")
    return {
        "seed": seed,
        "people": people,
        "buildings": rng.randint(2, 4),
        "floors": 3,
        "routers": tuple(f"r{i + 1}" for i in range(rng.randint(2, 4))),
        "overlap": round(rng.uniform(0.3, 0.6), 2),
    }


def make_office(root: Path, office: dict[str, Any]) -> Path:
    from aa.tools.mining import SimulateConfig, simulate

    name = "office-{seed}-p{people}-b{buildings}-r{n}-o{overlap}".format(
        n=len(office["routers"]), **office
    )
    out = root / name
    if not (out / "world.json").is_file():
        simulate(
            SimulateConfig(out=str(out), start=START, days=11 / 24, step_seconds=120, **office)
        )
    return out


def score(spark: Any, folder: Path, presence: Any) -> dict[str, Any]:
    """Mine presence alone from *folder* and score it: the accuracy report's presence part,
    with the seconds the mining took."""
    from aa.tools.mining import MineConfig, run_mining
    from aa.tools.mining.accuracy import accuracy_report

    with tempfile.TemporaryDirectory() as adapters:
        t = time.perf_counter()
        run_mining(
            spark,
            MineConfig(
                inputs=(str(folder),), adapters=adapters, tasks=("presence",), presence=presence
            ),
        )
        seconds = time.perf_counter() - t
        report = accuracy_report(adapters, folder)
    return {**report["presence"], "seconds": round(seconds, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="held-out", help="held-out, tune or a comma list")
    ap.add_argument("--people", type=int, default=30)
    ap.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="PresenceConfig field"
    )
    args = ap.parse_args()
    seeds = {"held-out": HELD_OUT_SEEDS, "tune": TUNE_SEEDS}.get(args.seeds) or tuple(
        int(s) for s in args.seeds.split(",")
    )
    from aa.tools.mining import SparkConfig, open_session
    from aa.tools.mining.presence import PresenceConfig

    presence = PresenceConfig()
    for item in args.set:
        key, value = item.split("=", 1)
        presence = replace(presence, **{key: type(getattr(presence, key))(value)})
    root = Path(os.environ.get("AA_BENCH_DIR", "/tmp/aa-bench-mining")) / "presence"
    offices = [office_of(s, people=args.people) for s in seeds]
    folders = [(office, make_office(root, office)) for office in offices]
    print(f"load {os.getloadavg()[0]:.2f}; {presence}", flush=True)
    spark = open_session(
        SparkConfig(
            master="local[2]", shuffle_partitions=2, driver_memory="1g", class_archive_dir=""
        )
    )
    f1s = []
    try:
        for office, folder in folders:
            r = score(spark, folder, presence)
            f1s.append(r["f1"])
            print(
                f"seed {office['seed']:4}  buildings {office['buildings']}  routers "
                f"{len(office['routers'])}  overlap {office['overlap']:.2f}:  F1 {r['f1']:.3f}  "
                f"(precision {r['precision']:.3f}, recall {r['recall']:.3f}, threshold "
                f"{r['threshold_db']} dB, {r['seconds']} s)",
                flush=True,
            )
    finally:
        spark.stop()
    print(
        f"F1 over {len(f1s)} offices: min {min(f1s):.3f}  median {statistics.median(f1s):.3f}  "
        f"max {max(f1s):.3f}  (load {os.getloadavg()[0]:.2f})"
    )


if __name__ == "__main__":
    sys.exit(main())
