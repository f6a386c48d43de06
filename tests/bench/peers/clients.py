"""The Python clients of bench_peers.py: one publisher or one subscriber of one system, each
run as its own process by the interpreter that has that system's client library (the
project's for Aa, tests/bench/peers/.venv's for the peers).

    python clients.py SYSTEM sub ADDRESS --events N
    python clients.py SYSTEM pub ADDRESS --events N [--rate R]

SYSTEM is one of
  aa-client  Aa, the blocking `aa.client.Client` of the README (callback subscription)
  aa-async   Aa, `aa.client.AsyncClient` (as tests/bench/bench_router.py drives it)
  nats       nats-py against nats-server (core NATS, at most once)
  mqtt       paho-mqtt against Mosquitto (MQTT 3.1.1, QoS 0, TCP_NODELAY)
  zenoh-router  zenoh-python in client mode at both ends, through a Zenoh router
             (servers.py) listening on ADDRESS
  zenoh      zenoh-python, peer to peer: the subscriber listens on ADDRESS, the publisher
             connects to it; no scouting (multicast and gossip off), loopback only

Every event carries the same five values as bench_router.py's, the last one its send time.
Aa's clients publish them as values and subscribe with an `expr` pattern over them; the
peers route on a subject / topic / key and carry the values as a msgpack payload, packed by
the publisher and unpacked by the subscriber (as an application on them would do).

The publisher sends N events as fast as its client takes them, or paced at R events/s in
a burst every millisecond; then it waits until its client has written them all out.
The subscriber prints `ready` once its subscription is in place, then, at the end, one JSON
line: events received, the time of the first and the last (time.time()), and latency
quantiles (receive − send). It stops after N events, after IDLE_S seconds without one, or
after DEADLINE_S seconds in all: got < N then tells how many the system lost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

SYSTEMS = ("aa-client", "aa-async", "nats", "mqtt", "zenoh-router", "zenoh")
PATTERN = 'Temperature > -1000 and Sensor.startswith("lab")'  # Aa: as bench_router.py
SUBJECT = "lab.readings"  # NATS
TOPIC = "lab/readings"  # MQTT; also the Zenoh key expression
IDLE_S = 10.0  # a subscriber that got events but none for this long stops: the rest is lost
DEADLINE_S = 300.0  # a subscriber stops after this long whatever happened (the run's bound)
POLL_S = 0.1  # how often a waiting subscriber looks at the clock (not on the event path)
OUTBOX_HIGH = 50_000  # aa-async: past this many unacknowledged events, await room (bench_router)


def values(i: int, now: float) -> dict[str, Any]:
    return {"Temperature": 20 + i % 80, "Sensor": "lab-1", "Humidity": 0.5, "Seq": i, "Sent": now}


class Recorder:
    """Counts a subscriber's events and their latency; `on(sent)` is the hot path."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.got = 0
        self.first = self.last = 0.0
        self.lat: list[float] = []
        self.done = threading.Event()
        self.cpu_s = 0.0  # CPU seconds from `ready()` to the end of `wait()`

    def on(self, sent: float) -> None:
        now = time.time()
        if self.got == 0:
            self.first = now
        self.got += 1
        self.last = now
        self.lat.append(now - sent)
        if self.got >= self.n:
            self.done.set()

    def finished(self, started: float) -> bool:
        if self.done.is_set() or time.monotonic() - started > DEADLINE_S:
            return True
        return self.got > 0 and time.time() - self.last > IDLE_S

    def wait(self) -> None:
        started = time.monotonic()
        while not self.finished(started):
            self.done.wait(POLL_S)
        self.cpu_s = time.process_time() - _cpu_start[0]

    async def await_done(self) -> None:
        started = time.monotonic()
        while not self.finished(started):  # noqa: ASYNC110 (done, or idle/deadline: time-based)
            await asyncio.sleep(POLL_S)
        self.cpu_s = time.process_time() - _cpu_start[0]

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "got": self.got,
            "first": self.first,
            "last": self.last,
            "cpu_s": self.cpu_s,
        }
        if len(self.lat) >= 2:
            lat = sorted(self.lat)
            q = statistics.quantiles(lat, n=100)
            out.update(p50_ms=q[49] * 1000, p99_ms=q[98] * 1000, max_ms=lat[-1] * 1000)
        return out


_cpu_start = [0.0]


def ready() -> None:
    """A subscriber's subscription is in place: its CPU time is counted from here."""
    _cpu_start[0] = time.process_time()
    print("ready", flush=True)


def sending() -> None:
    """A publisher starts sending: its CPU time is counted from here (connecting and
    importing its client left out)."""
    _cpu_start[0] = time.process_time()


def sent() -> None:
    """A publisher has sent all (its client has written them out): one JSON line with the
    CPU seconds (all its threads) since `sending()`."""
    print(json.dumps({"cpu_s": time.process_time() - _cpu_start[0]}), flush=True)


def paced(n: int, rate: float, send: Callable[[int], object]) -> None:
    """Call send(i) for i < n at *rate* per second, a small burst every millisecond."""
    per_tick = max(1, int(rate / 1000))
    start = time.perf_counter()
    i = 0
    while i < n:
        for _ in range(min(per_tick, n - i)):
            send(i)
            i += 1
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


async def apaced(n: int, rate: float, send: Callable[[int], object]) -> None:
    """`paced` for asyncio clients: the same bursts, awaiting instead of sleeping."""
    per_tick = max(1, int(rate / 1000))
    start = time.perf_counter()
    i = 0
    while i < n:
        for _ in range(min(per_tick, n - i)):
            r = send(i)
            if asyncio.iscoroutine(r):
                await r
            i += 1
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)


# -- Aa -------------------------------------------------------------------------------------


def aa_client_sub(address: str, rec: Recorder) -> None:
    from aa.client import Client

    with Client(address) as c:
        c.subscribe(PATTERN, lambda ev: rec.on(ev.values["Sent"]))
        ready()
        rec.wait()


def aa_client_pub(address: str, n: int, rate: float | None) -> None:
    from aa.client import Client

    with Client(address) as c:
        sending()
        if rate is None:
            for i in range(n):
                c.publish(values(i, time.time()))
        else:
            paced(n, rate, lambda i: c.publish(values(i, time.time())))
        c.flush(timeout=DEADLINE_S)
        sent()


def aa_async_sub(address: str, rec: Recorder) -> None:
    from aa.client import AsyncClient

    async def main() -> None:
        async with AsyncClient(address) as c:
            await c.subscribe(PATTERN, lambda ev: rec.on(ev.values["Sent"]))
            ready()
            await rec.await_done()

    asyncio.run(main())


def aa_async_pub(address: str, n: int, rate: float | None) -> None:
    from aa.client import AsyncClient

    async def main() -> None:
        async with AsyncClient(address) as c:
            sending()
            if rate is None:
                for i in range(n):
                    if c.pending >= OUTBOX_HIGH:
                        await c.publish(values(i, time.time()))
                    else:
                        c.publish_nowait(values(i, time.time()))
                    if i % 2000 == 0:
                        await asyncio.sleep(0)
            else:
                await apaced(n, rate, lambda i: c.publish_nowait(values(i, time.time())))
            await c.flush(timeout=DEADLINE_S)
            sent()

    asyncio.run(main())


# -- NATS -----------------------------------------------------------------------------------


def nats_url(address: str) -> str:
    return f"nats://{address}"


def nats_sub(address: str, rec: Recorder) -> None:
    import msgpack
    import nats

    async def main() -> None:
        nc = await nats.connect(nats_url(address), allow_reconnect=False, connect_timeout=10)

        async def on_msg(msg: Any) -> None:
            rec.on(msgpack.unpackb(msg.data)["Sent"])

        await nc.subscribe(SUBJECT, cb=on_msg)
        await nc.flush(timeout=10)  # the server has the subscription
        ready()
        await rec.await_done()
        await nc.close()

    asyncio.run(main())


def nats_pub(address: str, n: int, rate: float | None) -> None:
    import msgpack
    import nats

    async def main() -> None:
        nc = await nats.connect(nats_url(address), allow_reconnect=False, connect_timeout=10)
        pack = msgpack.packb
        sending()
        if rate is None:
            for i in range(n):
                await nc.publish(SUBJECT, pack(values(i, time.time())))
        else:
            await apaced(n, rate, lambda i: nc.publish(SUBJECT, pack(values(i, time.time()))))
        await nc.flush(timeout=DEADLINE_S)
        sent()
        await nc.close()

    asyncio.run(main())


# -- MQTT -----------------------------------------------------------------------------------


def mqtt_connect(address: str, role: str) -> Any:
    import paho.mqtt.client as mqtt

    host, port = address.rsplit(":", 1)
    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=f"bench-{role}-{os.getpid()}",
        protocol=mqtt.MQTTv311,
    )
    connected = threading.Event()
    c.on_connect = lambda *a: connected.set()
    # TCP_NODELAY, as asyncio (Aa, nats-py), Go (nats-server) and Zenoh set it by default
    # and Mosquitto does here (set_tcp_nodelay): without it Nagle holds small messages back.
    c.on_socket_open = lambda client, userdata, sock: sock.setsockopt(
        socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
    )
    c.connect(host, int(port))
    c.loop_start()
    if not connected.wait(10):
        raise SystemExit(f"mqtt: no CONNACK from {address}")
    return c


def mqtt_sub(address: str, rec: Recorder) -> None:
    import msgpack

    c = mqtt_connect(address, "sub")
    subscribed = threading.Event()
    c.on_subscribe = lambda *a: subscribed.set()
    c.on_message = lambda client, userdata, msg: rec.on(msgpack.unpackb(msg.payload)["Sent"])
    c.subscribe(TOPIC, qos=0)
    if not subscribed.wait(10):
        raise SystemExit(f"mqtt: no SUBACK from {address}")
    ready()
    rec.wait()
    c.disconnect()
    c.loop_stop()


def mqtt_pub(address: str, n: int, rate: float | None) -> None:
    import msgpack

    c = mqtt_connect(address, "pub")
    pack = msgpack.packb
    last: list[Any] = [None]

    def send(i: int) -> None:
        last[0] = c.publish(TOPIC, pack(values(i, time.time())), qos=0)

    sending()
    if rate is None:
        for i in range(n):
            send(i)
    else:
        paced(n, rate, send)
    if last[0] is not None:
        last[0].wait_for_publish(DEADLINE_S)  # QoS 0: written to the socket
    sent()
    c.disconnect()
    c.loop_stop()


# -- Zenoh ----------------------------------------------------------------------------------


def zenoh_session(address: str, role: str, mode: str = "peer") -> Any:
    """A session confined to loopback (servers.zenoh_config). Peer to peer, the subscriber
    listens on *address* and the publisher connects to it; in client mode both connect to
    the router listening there."""
    import zenoh
    from servers import zenoh_config

    listen = mode == "peer" and role == "sub"
    zenoh.init_log_from_env_or("error")
    return zenoh.open(zenoh.Config.from_json5(zenoh_config(mode, address, listen=listen)))


def zenoh_sub(address: str, rec: Recorder, mode: str = "peer") -> None:
    import msgpack

    with zenoh_session(address, "sub", mode) as s:
        s.declare_subscriber(
            TOPIC, lambda sample: rec.on(msgpack.unpackb(sample.payload.to_bytes())["Sent"])
        )
        ready()
        rec.wait()


def zenoh_pub(address: str, n: int, rate: float | None, mode: str = "peer") -> None:
    import msgpack
    import zenoh

    with zenoh_session(address, "pub", mode) as s:
        # BLOCK, not the default DROP: a full queue waits instead of losing events.
        pub = s.declare_publisher(TOPIC, congestion_control=zenoh.CongestionControl.BLOCK)
        deadline = time.monotonic() + 10
        while not pub.matching_status:  # the subscriber's declaration has not arrived yet
            if time.monotonic() > deadline:
                raise SystemExit("zenoh: the subscriber never matched")
            time.sleep(0.01)
        pack = msgpack.packb
        sending()
        if rate is None:
            for i in range(n):
                pub.put(pack(values(i, time.time())))
        else:
            paced(n, rate, lambda i: pub.put(pack(values(i, time.time()))))
        sent()  # its background threads may still be writing: a lower bound
        # Zenoh has no flush: stay connected until bench_peers.py closes our stdin, which it
        # does once the subscriber has reported, so closing cannot cut the last batches.
        sys.stdin.read()


SUBSCRIBERS: dict[str, Callable[[str, Recorder], None]] = {
    "aa-client": aa_client_sub,
    "aa-async": aa_async_sub,
    "nats": nats_sub,
    "mqtt": mqtt_sub,
    "zenoh": zenoh_sub,
    "zenoh-router": lambda address, rec: zenoh_sub(address, rec, "client"),
}
PUBLISHERS: dict[str, Callable[[str, int, float | None], None]] = {
    "aa-client": aa_client_pub,
    "aa-async": aa_async_pub,
    "nats": nats_pub,
    "mqtt": mqtt_pub,
    "zenoh": zenoh_pub,
    "zenoh-router": lambda address, n, rate: zenoh_pub(address, n, rate, "client"),
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("system", choices=SYSTEMS)
    ap.add_argument("role", choices=("pub", "sub"))
    ap.add_argument(
        "address",
        help="HOST:PORT of the broker (zenoh: of the subscriber's listener)",
    )
    ap.add_argument("--events", type=int, required=True)
    ap.add_argument(
        "--rate", type=float, default=None, help="events/s (publisher; default: as fast as it can)"
    )
    args = ap.parse_args()
    if args.role == "sub":
        rec = Recorder(args.events)
        SUBSCRIBERS[args.system](args.address, rec)
        print(json.dumps(rec.result()), flush=True)
    else:
        PUBLISHERS[args.system](args.address, args.events, args.rate)


if __name__ == "__main__":
    main()
