"""Slow subscribers against a real router: what do 20 clients that never read cost it?

    python tests/bench/bench_slow_subscribers.py                 # the hostile case below
    python tests/bench/bench_slow_subscribers.py --slow 0        # the same without them
    python tests/bench/bench_slow_subscribers.py --rate 5000 --slow-seconds 30

A real `aa router` process; a publisher process sending 1 KB events at a steady rate (one
frame per millisecond, each event carrying its send time); a victim subscriber process that
reads every event and records its delivery latency (receive − send, CLOCK_MONOTONIC of this
machine); and, in this process, 20 subscribers on raw sockets with the same pattern that
connect, subscribe and never read again. Phases:

1. warm-up (`--warm-seconds`): publisher and victim only; the router's caches fill; the
   router's RSS at its end is the baseline;
2. slow (`--slow-seconds`): the 20 non-readers connect and hang; RSS sampled every 0.25 s
   (its peak is "during");
3. after: the non-readers close; publishing goes on for `--after-seconds`; RSS at its end
   is "after".

It prints one JSON line: RSS before/during/after (and the differences, in MB), the victim's
latency p50/p99/max in each phase, its events received, and the router's CPU share.
Targets (the issue's): during < +200 MB, after < +50 MB, victim p99 < 10 ms, max < 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import report, start_router

PATTERN = 'kind == "flood"'
MB = 1_000_000


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _connect(endpoint: str, client_id: str):
    from aa.mesh import Connection
    from aa.mesh.protocol import Hello

    host, port = endpoint.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    codec = Connection()
    writer.write(codec.send(Hello(client_id=client_id)))
    return reader, writer, codec


def publisher(endpoint: str, rate: float, size: int, stop) -> None:
    """1 KB events at *rate* per second, a frame every millisecond, until *stop* is set."""
    from aa.mesh import Event
    from aa.mesh.protocol import Publish

    async def main() -> None:
        reader, writer, codec = await _connect(endpoint, "bench-publisher")

        async def discard() -> None:  # the acks
            while await reader.read(1 << 16):
                pass

        acks = asyncio.create_task(discard())
        pad = "x" * size
        start = time.monotonic()
        sent = seq = 0
        while not stop.is_set():
            due = int((time.monotonic() - start) * rate)
            if due > sent:
                now = time.monotonic()
                seq += 1
                events = tuple(
                    Event(values={"kind": "flood", "i": i, "sent": now, "pad": pad})
                    for i in range(sent, due)
                )
                writer.write(codec.send(Publish(seq=seq, events=events)))
                sent = due
                await writer.drain()
            await asyncio.sleep(0.001)
        writer.close()
        acks.cancel()

    asyncio.run(main())


def victim(endpoint: str, ready, stop, out) -> None:
    """Subscribes to the flood, reads everything, records (receive time, latency) per event."""
    from aa.mesh import PatternSpec
    from aa.mesh.protocol import Deliver, Subscribe

    async def main() -> None:
        reader, writer, codec = await _connect(endpoint, "bench-victim")
        writer.write(codec.send(Subscribe(sub_id=1, pattern=PatternSpec(source=PATTERN))))
        ready.set()
        got: list[tuple[float, float]] = []
        while not stop.is_set():
            try:
                async with asyncio.timeout(0.5):
                    data = await reader.read(1 << 20)
            except TimeoutError:
                continue
            if not data:
                break
            now = time.monotonic()
            codec.receive_data(data)
            for m in codec.next_messages():
                if type(m) is Deliver:
                    got += [(now, now - e.values["sent"]) for _, e in m.items]
        writer.close()
        out.put(got)

    asyncio.run(main())


def non_reader(endpoint: str) -> socket.socket:
    """A subscriber to the flood that, once subscribed, never reads."""
    from aa.mesh import Connection, PatternSpec
    from aa.mesh.protocol import Hello, Subscribe, Subscribed

    host, port = endpoint.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    codec = Connection()
    sock.sendall(
        codec.send(Hello(client_id=f"non-reader-{sock.getsockname()[1]}"))
        + codec.send(Subscribe(sub_id=1, pattern=PatternSpec(source=PATTERN)))
    )
    while True:
        codec.receive_data(sock.recv(1 << 16))
        if any(type(m) is Subscribed for m in codec.next_messages()):
            return sock


def quantiles(lat: list[float]) -> dict[str, float | int]:
    if not lat:
        return {"n": 0}
    lat = sorted(lat)
    return {
        "n": len(lat),
        "p50_ms": round(lat[len(lat) // 2] * 1000, 2),
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 2),
        "max_ms": round(lat[-1] * 1000, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slow", type=int, default=20, help="subscribers that never read")
    ap.add_argument("--rate", type=float, default=5000, help="events per second")
    ap.add_argument("--size", type=int, default=1000, help="bytes of padding per event")
    ap.add_argument("--warm-seconds", type=float, default=10)
    ap.add_argument("--slow-seconds", type=float, default=20)
    ap.add_argument("--after-seconds", type=float, default=10)
    ap.add_argument(
        "--timeline", action="store_true", help="also print the victim's worst latency per second"
    )
    ap.add_argument("router_args", nargs="*", help="more `aa router` options (after --)")
    args = ap.parse_args()

    proc, endpoint = start_router("--no-http", *args.router_args)
    pid = proc.pid
    ctx = mp.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    vic = ctx.Process(target=victim, args=(endpoint, ready, stop, out))
    vic.start()
    assert ready.wait(60), "the victim did not subscribe"
    pub = ctx.Process(target=publisher, args=(endpoint, args.rate, args.size, stop))
    pub.start()
    try:
        t_warm = time.monotonic()
        time.sleep(args.warm_seconds)
        before = rss_of(pid)
        cpu0, t_slow = process_cpu(pid), time.monotonic()
        socks = [non_reader(endpoint) for _ in range(args.slow)]
        peak = before
        while time.monotonic() - t_slow < args.slow_seconds:
            peak = max(peak, rss_of(pid))
            time.sleep(0.25)
        during = rss_of(pid)
        peak = max(peak, during)
        cpu_slow = (process_cpu(pid) - cpu0) / (time.monotonic() - t_slow)
        for s in socks:
            s.close()
        t_after = time.monotonic()
        time.sleep(args.after_seconds)
        after = rss_of(pid)
        t_end = time.monotonic()
    finally:
        stop.set()
        got = out.get(timeout=60)
        pub.join(30)
        vic.join(30)
        proc.terminate()
        proc.wait(30)

    def phase(a: float, b: float) -> list[float]:
        return [lat for t, lat in got if a <= t < b]

    if args.timeline:
        worst: dict[int, float] = {}
        for t, lat in got:
            second = int(t - t_slow) if t >= t_slow else -1 - int(t_slow - t)
            worst[second] = max(worst.get(second, 0.0), lat)
        for second in sorted(worst):
            print(f"t={second:+4d} s (0: slow ones connect)  worst {worst[second] * 1000:8.1f} ms")
    report(
        "router-slow-subscribers",
        {
            "load": os.getloadavg()[0],
            "slow_subscribers": args.slow,
            "rate": args.rate,
            "event_bytes": args.size,
            "rss_before_mb": round(before / MB, 1),
            "rss_during_peak_mb": round(peak / MB, 1),
            "rss_after_mb": round(after / MB, 1),
            "rss_during_growth_mb": round((peak - before) / MB, 1),
            "rss_after_growth_mb": round((after - before) / MB, 1),
            "router_core_share_slow_phase": round(cpu_slow, 3),
            "victim_warm": quantiles(phase(t_warm + 2, t_slow)),
            "victim_slow": quantiles(phase(t_slow, t_after)),
            "victim_after": quantiles(phase(t_after, t_end)),
            "targets": "during < +200 MB, after < +50 MB, victim p99 < 10 ms, max < 100 ms",
        },
    )


if __name__ == "__main__":
    main()
