"""Client caches at scale: does matching slow down with the number of caches, and is memory
given back when they go?

    python tests/bench/bench_client_caches.py                      # 10,000 range caches
    python tests/bench/bench_client_caches.py --kind equality      # x == i instead
    python tests/bench/bench_client_caches.py --caches 2000 --events 500   # a quick check

A real ``aa router`` process (no discovery, loopback only) and real TCP clients. Each cache
is one client id's (``bench-<i>``): a connection says hello, registers the cache's pattern
and closes (the cache stays: its keep-alive timeout is an hour); --concurrency connections
at a time. Patterns, distinct per cache:

- ``range``: ``x > i and y < i``: two range atoms on two fields;
- ``equality``: ``x == i``.

The burst: one `AsyncClient` publishes --events events ``{x: v, y: v}`` (v spread over the
caches' constants, so each event is a candidate for about half the range patterns and is
taken by none of them, or by one equality cache) and waits until the router acknowledged
every one (`flush`); the figure is that wait from the first publish. It is taken with no
caches (the baseline), with them, and after they were removed (a connection per cache
again, ``CacheRemove``). RSS is the router's resident memory (/proc/PID/status) at each
step, the last after the router had a few seconds to give memory back.

Output: one JSON line (tests/bench/common.py `report`) with the figures and the load.
Bounded: at most --caches connections (each closed at once) and --events events per burst,
and every wait has a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report, start_router

from aa.client import AsyncClient, ClientConfig
from aa.mesh import Connection, PatternSpec
from aa.mesh.protocol import (
    CacheDone,
    CacheRegister,
    CacheRemove,
    Error,
    Hello,
    Message,
)

#: Seconds any one wait may take before the benchmark gives up.
TIMEOUT = 120.0


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def pattern(kind: str, i: int) -> str:
    return f"x > {i} and y < {i}" if kind == "range" else f"x == {i}"


async def _request(endpoint: str, client_id: str, message: Message) -> None:
    """One connection: hello as *client_id*, *message*, its answer, close."""
    host, _, port = endpoint.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    codec = Connection()
    try:
        writer.write(codec.send(Hello(client_id=client_id)) + codec.send(message))
        while True:
            data = await reader.read(1 << 16)
            if not data:
                raise RuntimeError(f"{client_id}: the router closed the connection")
            codec.receive_data(data)
            for got in codec.next_messages():
                if isinstance(got, CacheDone):
                    return
                if isinstance(got, Error):
                    raise RuntimeError(f"{client_id}: {got.code}: {got.message}")
    finally:
        writer.close()


async def _each(endpoint: str, n: int, concurrency: int, make: Any) -> float:
    """Run ``make(i)`` → (client id, message) for i < n, *concurrency* at a time; seconds."""
    start = time.perf_counter()
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            client_id, message = make(i)
            await _request(endpoint, client_id, message)

    async with asyncio.timeout(TIMEOUT * 4):
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def _burst(endpoint: str, events: int, spread: int, seed: int) -> float:
    """Seconds from the first publish of *events* events to the router's last ack."""
    config = ClientConfig(
        routers=(endpoint,), name="bench-publisher", max_outbox=max(events * 2, 10_000)
    )
    async with AsyncClient(config=config, client_id=f"bench-publisher-{seed}") as client:
        await client.wait_connected(TIMEOUT)
        values = [(seed * 7919 + j * 104729) % spread for j in range(events)]
        start = time.perf_counter()
        for v in values:
            client.publish_nowait({"x": v, "y": v})
        await client.flush(TIMEOUT)
        return time.perf_counter() - start


async def run(args: argparse.Namespace) -> dict[str, Any]:
    proc, endpoint = start_router()
    try:
        pid = proc.pid
        await _burst(endpoint, args.events, args.caches, seed=0)  # warm-up
        figures: dict[str, Any] = {
            "kind": args.kind,
            "caches": args.caches,
            "events": args.events,
            "rss_before_mb": round(rss(pid) / 2**20, 1),
            "burst_no_caches_s": round(await _burst(endpoint, args.events, args.caches, 1), 3),
        }
        figures["register_s"] = round(
            await _each(
                endpoint,
                args.caches,
                args.concurrency,
                lambda i: (
                    f"bench-{i}",
                    CacheRegister(
                        req=1, pattern=PatternSpec(source=pattern(args.kind, i)), timeout=3600.0
                    ),
                ),
            ),
            2,
        )
        figures["rss_with_caches_mb"] = round(rss(pid) / 2**20, 1)
        bursts = [await _burst(endpoint, args.events, args.caches, s) for s in (2, 3, 4)]
        figures["burst_with_caches_s"] = [round(b, 3) for b in bursts]
        figures["rss_after_burst_mb"] = round(rss(pid) / 2**20, 1)
        figures["remove_s"] = round(
            await _each(
                endpoint,
                args.caches,
                args.concurrency,
                lambda i: (f"bench-{i}", CacheRemove(req=1)),
            ),
            2,
        )
        await asyncio.sleep(args.settle)  # the router's own trims and sweeps; nothing to await
        figures["rss_after_removal_mb"] = round(rss(pid) / 2**20, 1)
        figures["burst_after_removal_s"] = round(
            await _burst(endpoint, args.events, args.caches, 5), 3
        )
        figures["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        return figures
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--caches", type=int, default=10_000)
    p.add_argument("--events", type=int, default=1_000)
    p.add_argument("--kind", choices=("range", "equality"), default="range")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--settle", type=float, default=5.0, help="seconds before the last RSS")
    args = p.parse_args()
    report("client-caches", asyncio.run(run(args)))


if __name__ == "__main__":
    main()
