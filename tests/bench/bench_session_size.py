"""The one-core mining run of `tests/test_mining_cluster.py`'s office, in a session opened
as for a log of unknown size (``default``) or sized by its log as `aa mine` sizes its own
(``small``): the wall time of the session's start and the mining. Run each in a fresh
process (the JVM keeps the options of the first session), alternated:

    nice -n 5 ./.venv/bin/python tests/bench/bench_session_size.py default
    nice -n 5 ./.venv/bin/python tests/bench/bench_session_size.py small
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from aa.tools.mining import (
    MineConfig,
    SimulateConfig,
    SparkConfig,
    open_session,
    resolve_inputs,
    run_mining,
    scan_inputs,
    simulate,
)


def main() -> None:
    small = sys.argv[1:] == ["small"]
    tmp = Path(tempfile.mkdtemp())
    office = tmp / "office"
    simulate(
        SimulateConfig(
            out=str(office),
            start=datetime(2030, 1, 7, 7, 0, tzinfo=UTC),
            days=6 / 24,
            step_seconds=120,
            seed=3,
            overlap=0.5,
        )
    )
    size = scan_inputs(resolve_inputs((str(office),))).bytes
    t = time.perf_counter()
    config = SparkConfig(
        master="local[1]", shuffle_partitions=1, driver_memory="1g", class_archive_dir=""
    )
    spark = open_session(config, input_bytes=size if small else None)
    try:
        run_mining(spark, MineConfig(inputs=(str(office),), adapters=str(tmp / "adapters")))
    finally:
        spark.stop()
    wall = time.perf_counter() - t
    mode = "small" if small else "default"
    print(f"{mode}: {size} bytes of log, {wall:.1f} s, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
