"""The event log's cost per event, without a router: N events as a router dispatches them
(five values decoded from the wire; meta stamped by the router: time, client, address,
router, ttl, path), handed to an `EventLog` a batch at a time as the router's storage does
(the events of one dispatched batch collected, then `extend`), then flushed.

    python tests/bench/bench_eventlog.py --events 200000
    python tests/bench/bench_eventlog.py --shared   # the mesh cache's encoding, as a router has it

    python tests/bench/bench_eventlog.py --stages   # the writer's stages, in this process

With --shared each batch comes encoded already (`aa.router.caches.meshcache.encode_events`, done
outside the figures): what the log adds to a router whose mesh cache is on, the default.
Reports CPU µs per event, each from the kernel's per-thread and per-process clocks:

loop      the event loop's thread: collecting, `extend`/`append`, the submits
executor  the log's executor thread (the writer thread of a log that has no process)
gil       loop + executor: what the router's own threads spend, sharing its GIL (for a
          writer thread, an upper bound: Parquet's compression runs without the GIL)
process   the log's writer process, if it has one: the machine's other cores
peak_mb   the writer process's peak resident memory (VmHWM)
wall      seconds from the first event to everything written and the file closed

--stages: what the writer process does with the same rows (as the router hands them over:
100 per chunk, `row_group_rows` per row group), timed in this process set up as the writer
process is (its malloc and collector settings), each stage by itself and the best of
--repeat passes: CPU µs per row of the compiled reader (msgpack to Arrow columns,
``reader_us``), of Parquet's encoding and compression (``parquet_us``), and of Parquet for
each column alone (``columns_us``, which need not add up to the whole).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import report


def make_events(n: int, frame: int = 100) -> list:
    """Events as a router dispatches them: values decoded from a client's frame, meta stamped
    per batch (one time stamp; the session's client id and address; a new path per event)."""
    from aa.mesh import Event
    from aa.mesh.protocol import pack, unpack

    client, address, router = "c-5f3a9e01d2c4b7a8", "127.0.0.1:54321", "r-0123456789abcdef"
    out = []
    for start in range(0, n, frame):
        values = [
            {
                "Temperature": 20 + i % 80,
                "Sensor": "lab-1",
                "Humidity": 0.5,
                "Seq": i,
                "Sent": time.time(),
            }
            for i in range(start, min(n, start + frame))
        ]
        stamp = datetime.now(UTC)
        for i, v in enumerate(unpack(pack(values)), start):
            meta = {
                "time": stamp,
                "client": client,
                "address": address,
                "router": router,
                "ttl": 8,
                "path": [router],
            }
            out.append(Event.trusted(v, "reading", meta, f"{router}-{i:x}"))
    return out


def thread_cpu(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def peak_mb(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def process_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(events: list, batch: int, data: str, shared: bool) -> dict:
    from aa.router import EventLog

    if shared:
        from aa.router.caches import encode_events

    elog = EventLog(data_dir=data, router_id="bench")
    await elog.start()
    await elog.maintain()  # the writer (thread or process) is up: not part of the figures
    executor = next(t for t in threading.enumerate() if t.name.startswith("aa-eventlog"))
    writer = getattr(elog._w, "pid", None)
    extend = getattr(elog, "extend", None)
    pending: list = []
    loop0, exec0, proc0 = time.thread_time(), thread_cpu(executor), process_cpu(writer)
    wall0 = time.perf_counter()
    loop_cpu = 0.0
    for start in range(0, len(events), batch):
        encoded = encode_events(events[start : start + batch]) if shared else None
        t = time.thread_time()
        if extend is not None:  # the router's storage: collect, then one extend per batch
            for ev in events[start : start + batch]:
                pending.append(ev)
            extend(pending, encoded=encoded) if shared else extend(pending)
            pending.clear()
        else:  # before extend: one append per event
            for ev in events[start : start + batch]:
                elog.append(ev)
        loop_cpu += time.thread_time() - t
        await asyncio.sleep(0)  # the loop runs its callbacks between batches, as a router's does
    t = time.thread_time()
    await elog.flush()
    loop_cpu += time.thread_time() - t
    wall = time.perf_counter() - wall0
    exec_cpu, proc_cpu = thread_cpu(executor) - exec0, process_cpu(writer) - proc0
    peak = peak_mb(writer)
    stats = elog.stats()
    await elog.aclose()
    assert time.thread_time() >= loop0
    n = len(events)
    return {
        "loop_us": round(loop_cpu / n * 1e6, 2),
        "executor_us": round(exec_cpu / n * 1e6, 2),
        "gil_us": round((loop_cpu + exec_cpu) / n * 1e6, 2),
        "process_us": round(proc_cpu / n * 1e6, 2),
        "peak_mb": round(peak),
        "wall_s": round(wall, 3),
        "rows": stats.rows,
        "dropped": stats.dropped,
    }


def stages(events: list, repeat: int) -> dict:
    """The --stages figures (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from aa.router.caches import encode_events
    from aa.router.eventlog import EventLogConfig, fastpath
    from aa.router.eventlog import process as writer_process
    from aa.router.eventlog import writer as writer_module
    from aa.router.eventlog.table import SCHEMA

    writer_process._tune_malloc()
    gc.set_threshold(*writer_process.GC_THRESHOLD)
    group, n, now = EventLogConfig().row_group_rows, len(events), time.time()
    chunks = [(now, 100, encode_events(events[i : i + 100]), None) for i in range(0, n, 100)]
    per_group = group // 100
    groups = [chunks[i : i + per_group] for i in range(0, len(chunks), per_group)]

    def best(work) -> float:
        times = []
        for _ in range(repeat):
            t = time.process_time()
            work()
            times.append(time.process_time() - t)
        return round(min(times) / n * 1e6, 3)

    tables = [fastpath.table_from_chunks(g, "bench") for g in groups]
    assert all(t is not None for t in tables), "rows the compiled reader does not write"

    def parquet(schema, parts, **options) -> None:
        with tempfile.TemporaryDirectory(prefix="aa-bench-eventlog-") as d:
            path = os.path.join(d, "x.parquet")
            with pq.ParquetWriter(path, schema, **options) as w:
                for t in parts:
                    w.write_table(t, row_group_size=t.num_rows)

    def options(names: set) -> dict:
        return {
            "compression": "zstd",
            "use_dictionary": [c for c in writer_module._DICTIONARY if c.split(".")[0] in names],
            "write_statistics": [c for c in writer_module._STATISTICS if c in names],
        }

    columns = {}
    for name in SCHEMA.names:
        schema = pa.schema([SCHEMA.field(name)])
        parts = [pa.table([t.column(name)], schema=schema) for t in tables]
        columns[name] = best(lambda s=schema, p=parts, k=name: parquet(s, p, **options({k})))
    return {
        "compiled": fastpath.COMPILED,
        "bytes_per_row": round(sum(len(c[2]) for c in chunks) / n, 1),
        "reader_us": best(lambda: [fastpath.table_from_chunks(g, "bench") for g in groups]),
        "parquet_us": best(lambda: parquet(SCHEMA, tables, **options(set(SCHEMA.names)))),
        "columns_us": columns,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--events", type=int, default=200_000, help="events logged")
    ap.add_argument("--batch", type=int, default=100, help="events per dispatched batch")
    ap.add_argument("--repeat", type=int, default=3, help="runs; each figure is their median")
    ap.add_argument(
        "--shared", action="store_true", help="batches come encoded (the mesh cache's encoding)"
    )
    ap.add_argument(
        "--stages", action="store_true", help="time the writer's stages in this process"
    )
    args = ap.parse_args()
    # As `aa router` has it (aa.tools.router_cmd): start-up objects frozen, higher thresholds.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    events = make_events(args.events)
    if args.stages:
        report("eventlog-writer-stages", {"events": args.events, **stages(events, args.repeat)})
        return
    runs = []
    for _ in range(args.repeat):
        data = tempfile.mkdtemp(prefix="aa-bench-eventlog-")
        try:
            runs.append(asyncio.run(run(events, args.batch, data, args.shared)))
        finally:
            shutil.rmtree(data, ignore_errors=True)
    median = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}
    report(
        "eventlog",
        {"events": args.events, "batch": args.batch, "shared": args.shared, **median, "runs": runs},
    )


if __name__ == "__main__":
    main()
