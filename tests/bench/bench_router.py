"""Issue 2 benchmark: one router, one publisher, one subscriber with an expr pattern,
events of five values, over loopback — each in its own process.

    python tests/bench/bench_router.py            # throughput, then latency at 5,000 ev/s

Throughput: the publisher sends N events as fast as the outbox allows; the subscriber
measures delivered events/s from its first to its last event. Latency: the publisher paces
5,000 events/s, each carrying its send time; the subscriber records receive − send.
Targets: ≥ 50,000 events/s delivered (issue 2); p99 < 2 ms at 5,000 events/s (issue 15;
issue 2 asked for < 5 ms).

    python tests/bench/bench_router.py --event-log      # router with a data folder, log on
    python tests/bench/bench_router.py --no-event-log   # the same, log off

    python tests/bench/bench_router.py --scrape         # what GET /metrics costs the router

--scrape: the same paced run (--rate, default 10,000 events/s, for --seconds) twice, without
and with a scraper asking ``/metrics`` every second, reporting the router's CPU as a share of
one core for each; then the router's CPU per scrape, from 300 scrapes back to back, which is
the share of a core one scrape a second costs (the paced runs' difference is within the
noise of a shared machine; this one is not).

With either log flag the router gets a fresh data folder (and no store, which the run would not
touch anyway), so the two runs differ by the event log only. Each run also reports the
router process's CPU time per event (user + system, all threads, from /proc), its log
writer's, and the publisher's and the subscriber's (each process's own clock, from before
it connects until it is done): on a shared machine they swing much less than events/s. And
how often each of the four was preempted (involuntary context switches per 1,000 events):
where a fourth busy process slows the other three on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import children, report, start_router

PATTERN = 'Temperature > -1000 and Sensor.startswith("lab")'


def values(i: int, now: float) -> dict:
    return {"Temperature": 20 + i % 80, "Sensor": "lab-1", "Humidity": 0.5, "Seq": i, "Sent": now}


def subscriber(endpoint: str, n: int, ready, out) -> None:
    from aa.client import AsyncClient

    async def main() -> None:
        cpu0, preempted0 = time.process_time(), preemptions()
        got = 0
        first = last = 0.0
        lat: list[float] = []
        done = asyncio.get_running_loop().create_future()

        def on_event(ev) -> None:
            nonlocal got, first, last
            now = time.time()
            if got == 0:
                first = now
            got += 1
            last = now
            lat.append(now - ev.values["Sent"])
            if got >= n and not done.done():
                done.set_result(None)

        async with AsyncClient(endpoint) as c:
            await c.subscribe(PATTERN, on_event)
            ready.set()
            try:
                async with asyncio.timeout(120):
                    await done
            except TimeoutError:
                pass
        cpu, preempted = time.process_time() - cpu0, preemptions() - preempted0
        out.put(
            {
                "got": got,
                "seconds": last - first,
                "latencies": lat,
                "cpu": cpu,
                "preempted": preempted,
            }
        )

    asyncio.run(main())


def publisher(endpoint: str, n: int, rate: float | None, out) -> None:
    from aa.client import AsyncClient

    async def main() -> None:
        cpu0, preempted0 = time.process_time(), preemptions()
        async with AsyncClient(endpoint) as c:
            if rate is None:
                for i in range(n):
                    if c.pending >= 50_000:
                        await c.publish(values(i, time.time()))
                    else:
                        c.publish_nowait(values(i, time.time()))
                    if i % 2000 == 0:
                        await asyncio.sleep(0)
            else:
                start = time.perf_counter()
                per_tick = max(1, int(rate / 1000))  # a small burst every millisecond
                i = 0
                while i < n:
                    for _ in range(per_tick):
                        c.publish_nowait(values(i, time.time()))
                        i += 1
                    target = start + i / rate
                    delay = target - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
            await c.flush(timeout=120)
        out.put((time.process_time() - cpu0, preemptions() - preempted0))

    asyncio.run(main())


def preemptions() -> int:
    """Involuntary context switches of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def process_preemptions(pid: int) -> int:
    """Involuntary context switches of process *pid*'s threads so far (0 when it is gone)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if line.startswith("nonvoluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) process *pid* used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu(pid: int) -> float:
    """CPU seconds the running child processes of *pid* used so far (the event log's writer)."""
    total = 0.0
    for child in children(pid):
        try:
            total += process_cpu(child)
        except (OSError, IndexError):
            continue
    return total


def run(endpoint: str, n: int, rate: float | None) -> dict:
    ctx = mp.get_context("spawn")
    ready, out, pub_out = ctx.Event(), ctx.Queue(), ctx.Queue()
    sub = ctx.Process(target=subscriber, args=(endpoint, n, ready, out))
    sub.start()
    ready.wait(30)
    pub = ctx.Process(target=publisher, args=(endpoint, n, rate, pub_out))
    pub.start()
    result = out.get(timeout=180)
    result["publisher_cpu"], result["publisher_preempted"] = pub_out.get(timeout=180)
    pub.join(60)
    sub.join(60)
    return result


def scrape_cost(proc, endpoint: str, http_url: str, rate: float, seconds: float) -> None:
    """The --scrape measurement (see the module docstring)."""
    import threading

    import httpx

    n = int(rate * seconds)
    shares = {}
    with httpx.Client(base_url=http_url, timeout=10) as http:
        assert http.get("/metrics").status_code == 200
        for scraping in (False, True):
            stop = threading.Event()

            def scrape(stop: threading.Event = stop) -> None:
                while not stop.wait(1.0):
                    http.get("/metrics").raise_for_status()

            scraper = threading.Thread(target=scrape) if scraping else None
            c0, t0 = process_cpu(proc.pid), time.perf_counter()
            if scraper is not None:
                scraper.start()
            run(endpoint, n, rate)
            stop.set()
            if scraper is not None:
                scraper.join()
            shares[scraping] = (process_cpu(proc.pid) - c0) / (time.perf_counter() - t0)
        k = 300
        c0, t0 = process_cpu(proc.pid), time.perf_counter()
        for _ in range(k):
            http.get("/metrics").raise_for_status()
        per_scrape = (process_cpu(proc.pid) - c0) / k
        wall = (time.perf_counter() - t0) / k
        size = len(http.get("/metrics").content)
    report(
        "router-metrics-scrape",
        {
            "rate": rate,
            "events_per_run": n,
            "router_core_share_without_scrapes": round(shares[False], 4),
            "router_core_share_scraped_each_second": round(shares[True], 4),
            "router_cpu_ms_per_scrape": round(per_scrape * 1000, 3),
            "scrape_wall_ms": round(wall * 1000, 3),
            "core_share_of_one_scrape_per_s": round(per_scrape, 5),
            "target_core_share": 0.01,
            "scrape_bytes": size,
        },
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--events", type=int, default=500_000, help="events for the throughput run")
    ap.add_argument("--latency-events", type=int, default=50_000, help="events for the latency run")
    ap.add_argument("--rate", type=float, default=5000.0, help="events/s for the latency run")
    ap.add_argument(
        "--event-log",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="give the router a fresh data folder (no store) with the event log on, "
        "or off (default: no data folder)",
    )
    ap.add_argument(
        "--scrape",
        action="store_true",
        help="measure what scraping GET /metrics once a second costs the router (at --rate, "
        "default here 10,000 events/s)",
    )
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds of each --scrape run")
    args = ap.parse_args()
    if args.scrape:
        proc, endpoint = start_router("--http-port", "0")
        try:
            assert proc.stdout is not None
            http_url = proc.stdout.readline().rsplit(" ", 1)[-1].strip()
            run(endpoint, 2000, None)  # warm up
            rate = args.rate if args.rate != 5000.0 else 10_000.0
            scrape_cost(proc, endpoint, http_url, rate, args.seconds)
        finally:
            proc.terminate()
            proc.wait(10)
        return
    data = None
    extra: tuple[str, ...] = ()
    if args.event_log is not None:
        data = tempfile.mkdtemp(prefix="aa-bench-router-")
        extra = (
            "--data-dir",
            data,
            "--no-store",
            "--event-log" if args.event_log else "--no-event-log",
        )
    proc, endpoint = start_router(*extra)
    try:
        run(endpoint, 2000, None)  # warm up
        c0, w0 = process_cpu(proc.pid), children_cpu(proc.pid)
        p0 = process_preemptions(proc.pid)
        wp0 = {c: process_preemptions(c) for c in children(proc.pid)}
        r = run(endpoint, args.events, None)
        cpu, writer = process_cpu(proc.pid) - c0, children_cpu(proc.pid) - w0
        preempted = process_preemptions(proc.pid) - p0
        writer_preempted = sum(process_preemptions(c) - wp0.get(c, 0) for c in children(proc.pid))
        per_k = 1000 / args.events
        tput = r["got"] / r["seconds"] if r["seconds"] else 0.0
        report(
            "router-throughput",
            {
                "events": r["got"],
                "events_per_s": round(tput),
                "target": 50_000,
                "event_log": args.event_log,
                "router_cpu_us_per_event": round(cpu / args.events * 1e6, 2),
                "log_writer_cpu_us_per_event": round(writer / args.events * 1e6, 2),
                "publisher_cpu_us_per_event": round(r["publisher_cpu"] / args.events * 1e6, 2),
                "subscriber_cpu_us_per_event": round(r["cpu"] / args.events * 1e6, 2),
                "preempted_per_1000_events": {
                    "router": round(preempted * per_k, 2),
                    "log_writer": round(writer_preempted * per_k, 2),
                    "publisher": round(r["publisher_preempted"] * per_k, 2),
                    "subscriber": round(r["preempted"] * per_k, 2),
                },
            },
        )
        r = run(endpoint, args.latency_events, args.rate)
        lat = sorted(r["latencies"])
        q = statistics.quantiles(lat, n=100)
        report(
            "router-latency",
            {
                "rate": args.rate,
                "events": r["got"],
                "p50_ms": round(q[49] * 1000, 3),
                "p99_ms": round(q[98] * 1000, 3),
                "max_ms": round(lat[-1] * 1000, 3),
                "target_p99_ms": 2,
            },
        )
    finally:
        proc.terminate()
        # With the log on, the router's stop waits for its writer to write what it was given.
        proc.wait(120 if args.event_log else 10)
        if data is not None:
            if args.event_log:
                report_log(data, published=2000 + args.events + args.latency_events)
            shutil.rmtree(data, ignore_errors=True)


def report_log(data: str, *, published: int) -> None:
    """How many of the published events the event log holds once the router stopped."""
    import pyarrow.dataset as ds

    rows = ds.dataset(
        os.path.join(data, "eventlog"), format="parquet", partitioning="hive"
    ).count_rows()
    report("router-event-log", {"published": published, "logged": rows, "lost": published - rows})


if __name__ == "__main__":
    main()
