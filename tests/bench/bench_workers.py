"""Issue 11 benchmark: the worker tier. One router; 100 distinct script patterns (which
all run in worker processes), subscribed by 10 clients of one subscriber process; one
publisher; each in its own process.

    python tests/bench/bench_workers.py                 # throughput, latency, kill cost
    python tests/bench/bench_workers.py --events 2000   # a short run, to validate

Every script forwards every event (`if Seq >= -i: forward()`, i = 0..99), so each event
published is 100 deliveries: "events delivered" counts deliveries, as a subscriber sees
them.

- Throughput: the publisher sends N events as fast as the outbox allows; the subscriber
  counts deliveries per second from its first to its last. Target: >= 20,000 delivered/s.
- Latency: the publisher paces `--rate` delivered events/s (rate / 100 events/s in), each
  carrying its send time; receive - send per delivery. Target: p99 < 10 ms at 5,000/s.
- Kill and replace (in this process, an embedded router): a worker holding the 100
  patterns is killed (SIGKILL) and an event published at once; the time until all 100
  deliveries of it arrive is the cost of noticing the death, taking the spare, re-creating
  the 100 patterns and re-running the batch. Then the same with a pattern stuck in one long
  call into C (a catastrophic regular expression), which the router's watchdog must find.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import report, start_router  # noqa: E402

PATTERNS = 100
CLIENTS = 10


def script(i: int) -> str:
    return f"if Seq >= -{i}:\n    forward()"


def subscriber(endpoint: str, n: int, ready, out) -> None:
    from aa.client import AsyncClient

    async def main() -> None:
        got = 0
        first = last = 0.0
        lat: list[float] = []
        done = asyncio.get_running_loop().create_future()

        def on_event(ev) -> None:
            nonlocal got, first, last
            now = time.time()
            if "Warm" in ev.values:
                return
            if got == 0:
                first = now
            got += 1
            last = now
            lat.append(now - ev.values["Sent"])
            if got >= n and not done.done():
                done.set_result(None)

        clients = [AsyncClient(endpoint, client_id=f"bench-sub-{c}") for c in range(CLIENTS)]
        for c in clients:
            await c.connect()
        for i in range(PATTERNS):
            await clients[i % CLIENTS].subscribe(script(i), on_event, format="script")
        ready.set()
        try:
            async with asyncio.timeout(180):
                await done
        except TimeoutError:
            pass
        for c in clients:
            await c.aclose()
        out.put({"got": got, "seconds": last - first, "latencies": lat})

    asyncio.run(main())


def publisher(endpoint: str, n: int, rate: float | None) -> None:
    from aa.client import AsyncClient

    async def main() -> None:
        async with AsyncClient(endpoint) as c:
            await c.publish({"Seq": 0, "Warm": True, "Sent": time.time()})  # workers started, spare ready
            await asyncio.sleep(2.0)
            if rate is None:
                for i in range(n):
                    if c.pending >= 20_000:
                        await c.publish({"Seq": i, "Sent": time.time()})
                    else:
                        c.publish_nowait({"Seq": i, "Sent": time.time()})
                    if i % 500 == 0:
                        await asyncio.sleep(0)
            else:
                start = time.perf_counter()
                for i in range(n):
                    c.publish_nowait({"Seq": i, "Sent": time.time()})
                    delay = start + (i + 1) / rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
            await c.flush(timeout=180)

    asyncio.run(main())


def run(endpoint: str, events: int, rate: float | None) -> dict:
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    sub = ctx.Process(target=subscriber, args=(endpoint, events * PATTERNS, ready, out))
    sub.start()
    ready.wait(60)
    pub = ctx.Process(target=publisher, args=(endpoint, events, rate))
    pub.start()
    result = out.get(timeout=300)
    pub.join(60)
    sub.join(60)
    return result


async def kill_costs(rounds: int) -> dict:
    from aa.router import Router, RouterConfig

    async with Router(RouterConfig(port=0)) as router:
        got: list[int] = []
        for i in range(PATTERNS):
            router.subscribe(script(i), lambda ev: got.append(ev.values["Seq"]), format="script")
        pool = router.engine.workers

        async def deliveries_of(seq: int, count: int) -> None:
            async with asyncio.timeout(60):
                while got.count(seq) < count:
                    await asyncio.sleep(0.001)

        async def warm() -> None:
            async with asyncio.timeout(60):
                while not pool.warm:
                    await asyncio.sleep(0.01)

        router.publish({"Seq": 1, "Sent": 0.0})
        await deliveries_of(1, PATTERNS)
        killed: list[float] = []
        for r in range(rounds):
            await warm()
            (slot,) = [s for s in pool._slots if s.proc is not None]
            t0 = time.perf_counter()
            os.kill(slot.proc.pid, signal.SIGKILL)
            router.publish({"Seq": 1000 + r, "Sent": 0.0})
            await deliveries_of(1000 + r, PATTERNS)
            killed.append(time.perf_counter() - t0)
        stuck: list[float] = []
        for r in range(rounds):
            await warm()
            bad = router.subscribe(f"import re\nif Seq == {2000 + r}:\n    re.match('(a+)+$', 'a' * 40 + 'b')", None, format="script")
            await asyncio.sleep(0.5)  # compiled on its worker
            t0 = time.perf_counter()
            router.publish({"Seq": 2000 + r, "Sent": 0.0})
            await deliveries_of(2000 + r, PATTERNS)
            stuck.append(time.perf_counter() - t0)
            assert bad.failure is not None
    return {
        "kill_to_recovered_ms": [round(k * 1000, 1) for k in killed],
        "kill_median_ms": round(statistics.median(killed) * 1000, 1),
        "stuck_to_recovered_ms": [round(k * 1000, 1) for k in stuck],
        "stuck_median_ms": round(statistics.median(stuck) * 1000, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=20_000, help="events published for the throughput run")
    ap.add_argument("--latency-events", type=int, default=3_000, help="events published for the latency run")
    ap.add_argument("--rate", type=float, default=5000.0, help="delivered events/s for the latency run")
    ap.add_argument("--kills", type=int, default=5, help="rounds of each kill measurement")
    args = ap.parse_args()
    load = os.getloadavg()
    proc, endpoint = start_router()
    try:
        r = run(endpoint, args.events, None)
        tput = r["got"] / r["seconds"] if r["seconds"] else 0.0
        report("workers-throughput", {"patterns": PATTERNS, "delivered": r["got"], "delivered_per_s": round(tput),
                                      "target": 20_000, "load": load})
        r = run(endpoint, args.latency_events, args.rate / PATTERNS)
        lat = sorted(r["latencies"])
        q = statistics.quantiles(lat, n=100)
        report("workers-latency", {"delivered_per_s": args.rate, "delivered": r["got"], "p50_ms": round(q[49] * 1000, 3),
                                   "p99_ms": round(q[98] * 1000, 3), "max_ms": round(lat[-1] * 1000, 3),
                                   "target_p99_ms": 10, "load": os.getloadavg()})
    finally:
        proc.terminate()
        proc.wait(10)
    report("workers-kill-and-replace", {"patterns": PATTERNS, **asyncio.run(kill_costs(args.kills)), "load": os.getloadavg()})


if __name__ == "__main__":
    main()
