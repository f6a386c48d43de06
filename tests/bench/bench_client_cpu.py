"""Each client's CPU per event, by stage, steadier under load than a run end to end.

    python tests/bench/bench_client_cpu.py                       # every stage, 100,000 events
    python tests/bench/bench_client_cpu.py --events 20000 --repeats 3

The workload of bench_peers.py (events of five values, packed as they are published,
read on arrival), against one real router (`aa router --port 0`):

- publish: a blocking `Client` publishes --events events (a values dict built per event, as
  bench_peers.py's publisher does) and flushes; the CPU seconds of the whole process (its
  client thread too) per event, best of --repeats.
- deliver: a subscriber's `Link` is given the bytes the router sent a subscriber of
  bench_peers.py's pattern (recorded once, --deliver-events events), and reads them and
  hands every event to a callback (`AsyncClient`'s delivery path, without the socket and
  the loop); the CPU per event, best of --repeats.
- deliver by frame size: the same path given --frame-events events (distinct ids, so the
  duplicate filter holds as many pairs as a busy subscriber's) in frames of 50, 200 and
  1,000 events that a router's stamp could have made, without a router: the CPU per event
  for each size, best of --repeats (a router sends bench_peers.py's subscriber frames of
  150-200 events on average).

Prints one JSON line, `client-cpu`, with `publish_us_per_event`, `deliver_us_per_event`,
`deliver_us_per_event_by_frame` and the event path (`aa --version`'s: compiled or pure
Python; `AA_PURE_PYTHON=1` selects the pure one). Pair it with the code before by running
it from that tree's `PYTHONPATH`.
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

PATTERN = 'Temperature > -1000 and Sensor.startswith("lab")'  # as bench_peers.py

FRAME_SIZES = (50, 200, 1000)

#: A router's stamp, as bench_peers.py's subscriber gets it on every event.
STAMP = {
    "client": "0acd35131770b4aa",
    "address": "127.0.0.1:49936",
    "router": "8aaa214d8afe9fa9",
    "ttl": 64,
    "path": ["8aaa214d8afe9fa9"],
    "user": "anonymous",
}


def values(i: int, now: float) -> dict[str, Any]:
    return {"Temperature": 20 + i % 80, "Sensor": "lab-1", "Humidity": 0.5, "Seq": i, "Sent": now}


def publish_cpu(address: str, n: int) -> float:
    from aa.client import Client

    with Client(address) as c:
        t0 = time.process_time()
        for i in range(n):
            c.publish(values(i, time.time()))
        c.flush(timeout=300)
        return (time.process_time() - t0) / n * 1e6


def record_deliveries(address: str, n: int) -> list[bytes]:
    """The bytes a subscriber of `PATTERN` reads while *n* events are published (from its
    subscription on: the next read starts with a frame)."""
    from aa.client import Client

    chunks: list[bytes] = []
    got = [0]
    with Client(address) as sub:
        sub.subscribe(PATTERN, lambda ev: got.__setitem__(0, got[0] + 1))
        link = sub._async._link
        assert link is not None
        read = link.data_received

        def recording(data: bytes) -> None:
            chunks.append(bytes(data))
            read(data)

        link.data_received = recording  # type: ignore[method-assign]
        with Client(address) as pub:
            for i in range(n):
                pub.publish(values(i, time.time()))
            pub.flush(timeout=300)
        deadline = time.monotonic() + 60
        while got[0] < n and time.monotonic() < deadline:
            time.sleep(0.05)
    if got[0] < n:
        raise SystemExit(f"the subscriber got {got[0]} of {n} events")
    return chunks


def deliver_cpu(chunks: list[bytes], n: int) -> float:
    from aa.client import AsyncClient
    from aa.client.link import Link
    from aa.mesh import PatternSpec

    async def run() -> float:
        from aa.client.subscription import Subscription

        client = AsyncClient("127.0.0.1:1")  # never connected: its delivery path alone
        count = [0]

        def on(ev: Any) -> None:
            count[0] += 1
            ev.values["Sent"]

        spec = PatternSpec(kernel="python", format="expr", source=PATTERN)
        client._subs[1] = Subscription(client, 1, spec, {}, on, None)
        link = Link(lambda _link, msg: client._on_message(msg), lambda: None)
        t0 = time.process_time()
        for chunk in chunks:
            link.data_received(chunk)
        took = time.process_time() - t0
        if count[0] != n:
            raise SystemExit(f"the replay delivered {count[0]} of {n} events")
        return took / n * 1e6

    return asyncio.run(run())


def stamped_frames(n: int, size: int) -> list[bytes]:
    """*n* events of bench_peers.py's shape as a router delivers them, *size* to a frame."""
    from datetime import UTC, datetime

    from aa.mesh import Event
    from aa.mesh.protocol import Connection

    codec = Connection()
    meta = {"time": datetime(2026, 11, 28, 12, 10, 11, 616516, tzinfo=UTC), **STAMP}
    frames = []
    for first in range(0, n, size):
        items = [
            ((1,), Event(values=values(i, 1.8e9 + i / 1e4), meta=meta, id=f"b54136774bbc26df-{i}"))
            for i in range(first, min(n, first + size))
        ]
        frames.append(codec.send_deliver(items))
    return frames


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--events", type=int, default=100_000, help="events published per repeat")
    ap.add_argument("--deliver-events", type=int, default=20_000, help="events recorded")
    ap.add_argument("--repeats", type=int, default=5, help="repeats of each stage (best kept)")
    ap.add_argument(
        "--frame-events", type=int, default=100_000, help="events per frame size replayed"
    )
    args = ap.parse_args()
    from aa.mesh import event_path

    router, address = start_router()
    try:
        publish_cpu(address, 2000)  # warm-up
        pub = [publish_cpu(address, args.events) for _ in range(args.repeats)]
        chunks = record_deliveries(address, args.deliver_events)
    finally:
        router.terminate()
        router.wait()
    deliver = [deliver_cpu(chunks, args.deliver_events) for _ in range(args.repeats)]
    by_frame = {}
    for size in FRAME_SIZES:
        frames = stamped_frames(args.frame_events, size)
        by_frame[str(size)] = round(
            min(deliver_cpu(frames, args.frame_events) for _ in range(args.repeats)), 3
        )
    report(
        "client-cpu",
        {
            "event_path": event_path(),
            "code": str(Path(__import__("aa.client").client.__file__).parent),
            "events": args.events,
            "publish_us_per_event": round(min(pub), 3),
            "publish_us_all": [round(x, 3) for x in pub],
            "deliver_us_per_event": round(min(deliver), 3),
            "deliver_us_all": [round(x, 3) for x in deliver],
            "deliver_us_per_event_by_frame": by_frame,
            "load": list(os.getloadavg()),
        },
    )


if __name__ == "__main__":
    main()
