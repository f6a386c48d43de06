"""One `aa mine` run, timed end to end, with the CPU seconds of Spark's JVM and of Python.

On a shared machine the wall-clock time of a mining run follows the load; the CPU time of
the driver's JVM (which in local mode also runs every task) is steadier, and is what a
change to the mining code moves. Pair runs of two trees in the same minutes: ``--tools``
runs the mining code of another checkout (its ``tools`` folder) with this environment's
``aa`` otherwise, e.g. main's, unpacked with ``git archive main | tar -x -C /tmp/base``.

    .venv/bin/python tests/bench/bench_mining_cpu.py [--tools /tmp/base/tools] -- \\
        -q --adapters /tmp/a /tmp/office
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any


def jvm_cpu_seconds() -> float:
    """User and system CPU seconds of the running Spark JVM (PySpark's gateway process)."""
    from pyspark import SparkContext

    gateway: Any = SparkContext._gateway
    pid = gateway.proc.pid
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    args = sys.argv[1:]
    tools = None
    if args[:1] == ["--tools"]:
        tools, args = args[1], args[2:]
    args = args[1:] if args[:1] == ["--"] else args
    import aa.tools

    if tools:
        aa.tools.__path__[:] = [os.path.abspath(tools)]
    import aa.tools.mining as mining

    stop = mining.stop_session
    cpu: dict[str, float] = {}

    def measured_stop(spark: Any, **kw: Any) -> Any:
        cpu["jvm"] = jvm_cpu_seconds()
        return stop(spark, **kw)

    mining.stop_session = measured_stop  # the command imports it at call time
    from aa.tools.cli import main as aa_main

    load = os.getloadavg()[0]
    t = time.perf_counter()
    sys.argv = ["aa", "mine", *args]
    rc = aa_main()
    wall = time.perf_counter() - t
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        f"mining code {os.path.dirname(mining.__file__ or '')}: wall {wall:.1f} s, "
        f"JVM CPU {cpu.get('jvm', float('nan')):.1f} s, Python CPU "
        f"{usage.ru_utime + usage.ru_stime:.1f} s, load {load:.1f}/{os.getloadavg()[0]:.1f}",
        file=sys.stderr,
    )
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
