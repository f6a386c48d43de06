"""Issue 4 benchmarks: the store, history replay, client caches and the event log, each
against an `aa router` in its own process, over loopback.

    python tests/bench/bench_store.py                      # everything
    python tests/bench/bench_store.py --only persist,replay

persist    one publisher sends N events with meta persist=True as fast as its outbox
           allows; events/s from the first publish to the last acknowledgement (acks come
           only once the store committed). Target: ≥ 20,000 events/s into SQLite.
replay     then a new subscriber asks for the history of all of them; seconds from the
           subscribe call to the last historical event. Target: 100,000 events in < 2 s.
caches     bench_router's throughput run (publisher → router → subscriber) on a router
           without client caches, then on one holding 1,000 client caches (1,000 client
           ids, --patterns distinct patterns among them, each cache taking a share of the
           events). Target: ≥ 70% of the throughput without caches.
eventlog   the same throughput run without and with --event-log.

Besides events/s, each run reports the router process's CPU time per event (user + system,
from /proc): on a shared machine wall-clock rates swing with the load, CPU per event much
less.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench_router
from common import report, start_router


def router_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) the process used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def values(i: int) -> dict:
    return {
        "Temperature": 20 + i % 80,
        "Sensor": "lab-1",
        "Humidity": 0.5,
        "Seq": i,
        "Sent": time.time(),
    }


async def persist(endpoint: str, n: int) -> float:
    from aa.client import AsyncClient

    meta = {"persist": True}
    async with AsyncClient(endpoint) as c:
        start = time.perf_counter()
        for i in range(n):
            if c.pending >= 50_000:
                await c.publish(values(i), type="reading", meta=meta)
            else:
                c.publish_nowait(values(i), type="reading", meta=meta)
            if i % 2000 == 0:
                await asyncio.sleep(0)
        await c.flush(timeout=300)
        return time.perf_counter() - start


async def replay(endpoint: str, n: int) -> tuple[int, float]:
    from aa.client import AsyncClient

    got = 0
    done = asyncio.get_running_loop().create_future()

    def on_event(ev) -> None:
        nonlocal got
        got += 1
        if got >= n and not done.done():
            done.set_result(None)

    async with AsyncClient(endpoint) as c:
        start = time.perf_counter()
        await c.subscribe("True", on_event, history={"since": None})
        try:
            async with asyncio.timeout(120):
                await done
        except TimeoutError:
            pass
        return got, time.perf_counter() - start


def cache_pattern(form: str, k: int) -> str:
    """The k-th distinct pattern. Sensor values in the run are all "lab-1" and temperatures
    20..99: one equality pattern takes every event; range patterns take a share each."""
    if form == "eq":
        return f'Sensor == "lab-{k}"'
    return f"Temperature > {100 - k % 100} + {k // 100}"  # a range: evaluated, not looked up


async def register_caches(endpoint: str, count: int, patterns: int, form: str) -> None:
    from aa.client import AsyncClient

    async def one(i: int) -> None:
        async with AsyncClient(endpoint, client_id=f"cache-{i}") as c:
            await c.cache_register(cache_pattern(form, i % patterns), max_count=1000, timeout=3600)

    for start in range(0, count, 50):
        await asyncio.gather(*(one(i) for i in range(start, min(count, start + 50))))


def throughput(endpoint: str, pid: int, n: int) -> dict:
    bench_router.run(endpoint, 2000, None)  # warm up
    c0 = router_cpu(pid)
    r = bench_router.run(endpoint, n, None)
    cpu = router_cpu(pid) - c0
    rate = r["got"] / r["seconds"] if r["seconds"] else 0.0
    return {
        "events": r["got"],
        "events_per_s": round(rate),
        "router_cpu_us_per_event": round(cpu / n * 1e6, 2),
    }


def stop(proc) -> None:
    proc.terminate()
    proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--events", type=int, default=100_000, help="persisted events, and events replayed"
    )
    ap.add_argument(
        "--throughput-events", type=int, default=200_000, help="events per throughput run"
    )
    ap.add_argument("--caches", type=int, default=1000, help="client caches for the caches run")
    ap.add_argument("--patterns", type=int, default=10, help="distinct patterns among the caches")
    ap.add_argument(
        "--form",
        choices=("eq", "range"),
        default="eq",
        help='the caches\' patterns: Sensor == "lab-K" (looked up in an index) or '
        "Temperature > N (evaluated per event)",
    )
    ap.add_argument(
        "--only", default="persist,replay,caches,eventlog", help="comma-separated sections"
    )
    args = ap.parse_args()
    only = set(args.only.split(","))
    common = ("--no-http", "--no-discovery")
    data = tempfile.mkdtemp(prefix="aa-bench-store-")
    try:
        if only & {"persist", "replay"}:
            proc, endpoint = start_router(*common, "--data-dir", data)
            try:
                c0 = router_cpu(proc.pid)
                seconds = asyncio.run(persist(endpoint, args.events))
                cpu = router_cpu(proc.pid) - c0
                report(
                    "store-persist",
                    {
                        "events": args.events,
                        "events_per_s": round(args.events / seconds),
                        "router_cpu_us_per_event": round(cpu / args.events * 1e6, 2),
                        "target": 20_000,
                    },
                )
                if "replay" in only:
                    got, seconds = asyncio.run(replay(endpoint, args.events))
                    report(
                        "store-replay",
                        {"events": got, "seconds": round(seconds, 3), "target_seconds": 2},
                    )
            finally:
                stop(proc)
        if "caches" in only:
            proc, endpoint = start_router(*common)
            try:
                base = throughput(endpoint, proc.pid, args.throughput_events)
            finally:
                stop(proc)
            proc, endpoint = start_router(*common)
            try:
                asyncio.run(register_caches(endpoint, args.caches, args.patterns, args.form))
                with_caches = throughput(endpoint, proc.pid, args.throughput_events)
            finally:
                stop(proc)
            report(
                "router-with-client-caches",
                {
                    "caches": args.caches,
                    "distinct_patterns": args.patterns,
                    "form": args.form,
                    "without": base,
                    "with": with_caches,
                    "ratio": round(with_caches["events_per_s"] / max(1, base["events_per_s"]), 3),
                    "cpu_ratio": round(
                        base["router_cpu_us_per_event"] / with_caches["router_cpu_us_per_event"], 3
                    ),
                    "target_ratio": 0.7,
                },
            )
        if "eventlog" in only:
            runs = {}
            for label, extra in (("off", ("--no-event-log",)), ("on", ("--event-log",))):
                log_dir = tempfile.mkdtemp(prefix="aa-bench-log-", dir=data)
                proc, endpoint = start_router(*common, "--no-store", "--data-dir", log_dir, *extra)
                try:
                    runs[label] = throughput(endpoint, proc.pid, args.throughput_events)
                finally:
                    stop(proc)
            report(
                "router-event-log",
                {
                    **runs,
                    "ratio": round(
                        runs["on"]["events_per_s"] / max(1, runs["off"]["events_per_s"]), 3
                    ),
                    "cpu_ratio": round(
                        runs["off"]["router_cpu_us_per_event"]
                        / runs["on"]["router_cpu_us_per_event"],
                        3,
                    ),
                    "budget_ratio": 0.85,
                },
            )
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
