"""Issue 13 benchmark: throughput with TLS against without, in the same run.

    python tests/bench/bench_tls.py                         # 200,000 events, 3 rounds each
    python tests/bench/bench_tls.py --events 20000 --runs 1   # a quick check

Two `aa router` processes run side by side: one plaintext, one with the mesh's certificates
(TLS, mutual-TLS CA, and users: the publisher is "alice" and the subscriber "bob", so every
event is also stamped with its user). For each round, on each router in turn, a publisher
process sends N events of five values as fast as its outbox allows and a subscriber process
with an expression pattern measures delivered events/s from its first to its last event
(the method of `bench_router.py`). Reported: the median, min and max of each, and the
ratio of the medians. Target: TLS keeps at least 70% of the plaintext throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import report, start_router

PATTERN = 'Temperature > -1000 and Sensor.startswith("lab")'


def _config(endpoint: str, certs: str | None, user: str) -> object:
    from aa.client import ClientConfig

    if certs is None:
        return ClientConfig(routers=(endpoint,), ca=None, cert=None, key=None)
    d = Path(certs)
    return ClientConfig(
        routers=(endpoint,), ca=d / "ca.pem", cert=d / f"{user}.pem", key=d / f"{user}.key"
    )


def subscriber(endpoint: str, certs: str | None, n: int, ready, out) -> None:  # type: ignore[no-untyped-def]
    from aa.client import AsyncClient

    async def main() -> None:
        got = 0
        first = last = 0.0
        done = asyncio.get_running_loop().create_future()

        def on_event(ev) -> None:  # type: ignore[no-untyped-def]
            nonlocal got, first, last
            now = time.perf_counter()
            if got == 0:
                first = now
            got += 1
            last = now
            if got >= n and not done.done():
                done.set_result(None)

        async with AsyncClient(config=_config(endpoint, certs, "bob")) as c:  # type: ignore[arg-type]
            await c.subscribe(PATTERN, on_event)
            ready.set()
            try:
                async with asyncio.timeout(180):
                    await done
            except TimeoutError:
                pass
        out.put({"got": got, "seconds": last - first})

    asyncio.run(main())


def publisher(endpoint: str, certs: str | None, n: int) -> None:
    from aa.client import AsyncClient

    async def main() -> None:
        async with AsyncClient(config=_config(endpoint, certs, "alice")) as c:  # type: ignore[arg-type]
            for i in range(n):
                v = {
                    "Temperature": 20 + i % 80,
                    "Sensor": "lab-1",
                    "Humidity": 0.5,
                    "Seq": i,
                    "Sent": 0.0,
                }
                if c.pending >= 50_000:
                    await c.publish(v)
                else:
                    c.publish_nowait(v)
                if i % 2000 == 0:
                    await asyncio.sleep(0)
            await c.flush(timeout=180)

    asyncio.run(main())


def run(endpoint: str, certs: str | None, n: int) -> float:
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    sub = ctx.Process(target=subscriber, args=(endpoint, certs, n, ready, out))
    sub.start()
    ready.wait(30)
    pub = ctx.Process(target=publisher, args=(endpoint, certs, n))
    pub.start()
    r = out.get(timeout=240)
    pub.join(60)
    sub.join(60)
    if r["got"] < n:
        raise RuntimeError(f"only {r['got']} of {n} events arrived")
    return float(r["got"] / r["seconds"]) if r["seconds"] else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--events", type=int, default=200_000, help="events per run")
    ap.add_argument(
        "--runs",
        "--repeats",
        dest="repeats",
        metavar="N",
        type=int,
        default=3,
        help="rounds (each: plaintext, then TLS)",
    )
    args = ap.parse_args()
    from aa.tools.certs_cmd import init_ca, issue

    certs = tempfile.mkdtemp(prefix="aa-bench-tls-")
    d = Path(certs)
    init_ca(d)
    issue(d, "bench", "router", days=2)
    for user in ("alice", "bob"):
        issue(d, user, "client", days=2)
    plain, plain_ep = start_router()
    tls, tls_ep = start_router(
        "--cert", str(d / "bench.pem"), "--key", str(d / "bench.key"), "--ca", str(d / "ca.pem")
    )
    figures: dict[str, list[float]] = {"plain": [], "tls": []}
    try:
        run(plain_ep, None, 2000)  # warm up both
        run(tls_ep, certs, 2000)
        for _ in range(args.repeats):
            figures["plain"].append(run(plain_ep, None, args.events))
            figures["tls"].append(run(tls_ep, certs, args.events))
    finally:
        for p in (plain, tls):
            p.terminate()
            p.wait(10)
    med = {k: statistics.median(v) for k, v in figures.items()}
    report(
        "tls-throughput",
        {
            "events": args.events,
            "repeats": args.repeats,
            **{f"{k}_events_per_s": round(med[k]) for k in med},
            **{f"{k}_min_max": [round(min(v)), round(max(v))] for k, v in figures.items()},
            "tls_over_plain": round(med["tls"] / med["plain"], 3) if med["plain"] else None,
            "target": 0.70,
        },
    )


if __name__ == "__main__":
    main()
