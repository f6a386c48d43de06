"""Routers in a line, each with a local publisher and a local subscriber that wants only its
own router's events (`type == "line-i"`): each router's CPU per event of its own, against one
router alone, under interest routing and under flooding. Every router is an `aa router`
process wired with `--peer` (no discovery); every client its own process, on loopback.

    python tests/bench/bench_line.py                    # alone, line interest, line flood
    python tests/bench/bench_line.py --routers 4 --events 20000 --rate 2000 --runs 3

Each publisher paces `--rate` events/s (a small burst every millisecond) for `--events`
events; a run ends when every subscriber has all of its router's events. A router's CPU per
event is its user + system CPU over the run (from /proc) divided by the events published on
it. Modes: *alone*, the same routers and clients but no links (each router a mesh of one:
the reference, under the same load of processes as the others, since a router's CPU per
event depends on how its events batch, which depends on the machine's load); *interest*, the
line under interest routing, where no router receives another's events, so it should stay
at the *alone* figure; *flood*, where every router receives every event, and it grows with
the line. The runs of the modes alternate (`--runs`), so each mode meets the same load of a
shared machine; the load average is printed beside each run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_ring import cpu_seconds, own_summaries, stop, tuned
from common import report, start_router


def subscriber(endpoint: str, kind: str, n: int, ready, out, finish) -> None:  # type: ignore[no-untyped-def]
    from aa.client import AsyncClient

    async def main() -> None:
        got = 0
        done = asyncio.get_running_loop().create_future()

        def on_event(_ev) -> None:  # type: ignore[no-untyped-def]
            nonlocal got
            got += 1
            if got >= n and not done.done():
                done.set_result(None)

        async with AsyncClient(endpoint) as c:
            await c.subscribe(f'type == "{kind}"', on_event)
            ready.set()
            try:
                async with asyncio.timeout(300):
                    await done
            except TimeoutError:
                pass
            out.put({"kind": kind, "got": got})
            # Stay subscribed until every subscriber is done: a subscription that goes
            # changes its router's summary, and the mesh floods while it settles.
            await asyncio.get_running_loop().run_in_executor(None, finish.wait, 60)

    asyncio.run(main())


def publisher(endpoint: str, kind: str, n: int, rate: float, start) -> None:  # type: ignore[no-untyped-def]
    from aa.client import AsyncClient

    async def main() -> None:
        async with AsyncClient(endpoint) as c:
            start.wait(60)
            t0 = time.perf_counter()
            per_tick = max(1, int(rate / 1000))
            i = 0
            while i < n:
                for _ in range(per_tick):
                    c.publish_nowait({"Seq": i, "Temperature": 20 + i % 80}, type=kind)
                    i += 1
                delay = t0 + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            await c.flush(timeout=120)

    asyncio.run(main())


def start_line(n: int, routing: str, linked: bool = True) -> tuple[list, list[str]]:  # type: ignore[type-arg]
    procs: list = []  # type: ignore[type-arg]
    endpoints: list[str] = []
    try:
        for i in range(n):
            peers = ["--peer", endpoints[i - 1]] if i and linked else []
            proc, endpoint = start_router(
                "--no-discovery",
                "--no-http",
                "--name",
                f"line-{i}",
                "--routing",
                routing,
                *peers,
            )
            procs.append(proc)
            endpoints.append(endpoint)
    except BaseException:
        stop(procs)
        raise
    return procs, endpoints


async def wait_linked(endpoints: list[str], linked: bool, timeout: float = 60.0) -> None:
    """Until every router is linked with its neighbours in the line."""
    n = len(endpoints)
    async with asyncio.timeout(timeout):
        while True:
            summaries = await own_summaries(endpoints)
            want = [min(i, 1) + (i < n - 1) for i in range(n)] if linked else [0] * n
            if [len(s["peers"]) for s in summaries] == want:
                return
            await asyncio.sleep(0.2)


def run(endpoints: list[str], procs: list, events: int, rate: float) -> dict:  # type: ignore[type-arg]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = ctx.Event()
    finish = ctx.Event()
    subs, pubs = [], []
    for i, endpoint in enumerate(endpoints):
        ready = ctx.Event()
        sub = ctx.Process(
            target=tuned, args=(subscriber, endpoint, f"line-{i}", events, ready, out, finish)
        )
        sub.start()
        ready.wait(60)
        subs.append(sub)
    # The subscriptions' summaries cross the line, and the routers settle (1 s after the
    # last change), before the clock starts.
    time.sleep(2.0)
    for i, endpoint in enumerate(endpoints):
        pub = ctx.Process(
            target=tuned, args=(publisher, endpoint, f"line-{i}", events, rate, start)
        )
        pub.start()
        pubs.append(pub)
    time.sleep(2.0)  # the publishers' imports and connections, outside the measure
    load = os.getloadavg()[0]
    cpu0 = [cpu_seconds(p.pid) for p in procs]
    t0 = time.perf_counter()
    start.set()
    got = [out.get(timeout=600) for _ in endpoints]
    wall = time.perf_counter() - t0
    cpu1 = [cpu_seconds(p.pid) for p in procs]
    counters = [s["counters"] for s in asyncio.run(own_summaries(endpoints))]
    finish.set()
    for p in pubs + subs:
        p.join(60)
    per_event = [
        round((b - a) / events * 1e6, 1) if a is not None and b is not None else None
        for a, b in zip(cpu0, cpu1)
    ]
    return {
        "router_cpu_us_per_event": per_event,
        "delivered": sorted(g["got"] for g in got),
        "wall_s": round(wall, 1),
        "load": round(load, 1),
        "events_in_per_router": [c.get("events_in", 0) for c in counters],
        "flooded_per_router": [c.get("interest_flooded", 0) for c in counters],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--routers", type=int, default=4, help="routers in the line")
    ap.add_argument("--events", type=int, default=20_000, help="events per publisher")
    ap.add_argument("--rate", type=float, default=2000.0, help="events/s per publisher")
    ap.add_argument("--runs", type=int, default=1, help="runs of each mode, alternating")
    ap.add_argument(
        "--modes",
        nargs="+",
        default=["alone", "interest", "flood"],
        choices=["alone", "interest", "flood"],
    )
    args = ap.parse_args()
    results: dict[str, list[list[float]]] = {m: [] for m in args.modes}
    for k in range(args.runs):
        for mode in args.modes:
            n = args.routers
            linked = mode != "alone"
            procs, endpoints = start_line(n, "flood" if mode == "flood" else "interest", linked)
            try:
                asyncio.run(wait_linked(endpoints, linked))
                r = run(endpoints, procs, args.events, args.rate)
            finally:
                stop(procs)
            report(
                "line",
                {
                    "mode": mode,
                    "run": k,
                    "routers": n,
                    "events_each": args.events,
                    "rate_each": args.rate,
                    **r,
                },
            )
            if None not in r["router_cpu_us_per_event"]:
                results[mode].append(r["router_cpu_us_per_event"])
    summary = {}
    for mode, runs in results.items():
        if runs:
            flat = [x for run_ in runs for x in run_]
            summary[mode] = {
                "median_us_per_event": round(statistics.median(flat), 1),
                "max_us_per_event": round(max(flat), 1),
            }
    if "alone" in summary:
        base = summary["alone"]["median_us_per_event"]
        for mode in summary:
            summary[mode]["vs_alone"] = round(summary[mode]["median_us_per_event"] / base, 2)
    report("line-summary", {"routers": args.routers, "runs": args.runs, **summary})


if __name__ == "__main__":
    main()
