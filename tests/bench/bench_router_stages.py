"""The router's CPU per event by stage, in one process: no sockets, no clients, so its figures
move far less with the machine's load than bench_router.py's.

    python tests/bench/bench_router_stages.py                  # 60 frames of 1,000 events
    python tests/bench/bench_router_stages.py --frames 200
    python tests/bench/bench_router_stages.py --python-stamp   # the stamping loop not compiled
    python tests/bench/bench_router_stages.py --session        # a real client session

A `Router` is started (port 0, discovery off) with one subscriber of bench_router.py's pattern,
a fake key that keeps its deliveries as the session would queue them. Each publish frame of
bench_router.py's events is decoded as a session decodes it (whole by the compiled reader
where it is built, else in steps), accepted `DISPATCH_STEP` events at a time (stamping, seen
ids, matching, deliveries), the sinks flushed (the mesh cache's block, which packs each
event), and one delivery frame built of what the subscriber got. With ``--session`` the
subscriber is a real client session's subscription (`aa.router.session`) on a transport
that keeps nothing: its deliveries are queued as the router queues them (permissions, the
slow-consumer check), and the delivery frame is what the session's flush writes. CPU time
per event of each stage (`time.process_time_ns`), with the collector tuned as `aa router`
tunes it. Run it once per path (``AA_PURE_PYTHON=1``), or with another tree on
``PYTHONPATH`` to compare two versions of the code.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import report

PATTERN = 'Temperature > -1000 and Sensor.startswith("lab")'
GC_THRESHOLD = (50_000, 20, 100)  # what `aa router` sets (aa.tools.router_cmd)


class Key:
    """A subscriber key queueing its deliveries as a client session does."""

    scope = None

    def __init__(self) -> None:
        self.pending: list[list[Any]] = []

    def deliver(self, event: Any) -> None:
        self.pending.append([[1], event])


class Transport:
    """A transport that takes every write at once (nothing buffered, nothing kept)."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 2) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def session_key(router: Any) -> tuple[Any, Any]:
    """A client session's subscription (the router's own class) and the session, open."""
    from aa.router import session as sessions

    session = sessions.ClientSession(router)
    session.connection_made(Transport())
    session.client_id = "bench-sub"
    session.phase = sessions.Phase.OPEN
    sub = sessions.SessionSubscriber(session, 1)
    session.subscriptions[1] = sub
    return sub, session


async def run(frames: int, per_frame: int, real_session: bool = False) -> dict[str, float]:
    from aa.mesh import Event
    from aa.mesh.protocol import Connection, PatternSpec, Publish
    from aa.router import Router, RouterConfig
    from aa.router.dispatch import DISPATCH_STEP

    try:  # a session's reader of the usual publish frame (absent in older trees)
        from aa.router.wire import PublishReader as reader
    except ImportError:
        reader = None

    router = Router(RouterConfig(port=0))
    await router.start()
    try:
        key: Any = Key()
        session = None
        if real_session:
            key, session = session_key(router)
        router.engine.subscribe(key, PatternSpec(source=PATTERN))
        wire = []
        for f in range(frames):
            events = tuple(
                Event(
                    values={
                        "Temperature": 20 + i % 80,
                        "Sensor": "lab-1",
                        "Humidity": 0.5,
                        "Seq": i,
                        "Sent": 1.7e9 + i,
                    },
                    id=f"bench-{f}-{i:x}",
                )
                for i in range(per_frame)
            )
            wire.append(Connection().send(Publish(seq=f + 1, events=events)))
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLD)
        dispatcher, out = router.dispatcher, Connection()
        clock = time.process_time_ns
        spent = dict.fromkeys(("decode", "accept", "sinks", "deliver"), 0)
        for frame in wire:
            t0 = clock()
            conn = Connection(max_items=10 * per_frame)
            conn.receive_data(frame)
            msg = reader(conn).next_publish() if reader else None
            while not isinstance(msg, Publish):
                msg = conn.next_message(stepwise=True)
            t1 = clock()
            events = msg.events
            for start in range(0, len(events), DISPATCH_STEP):
                chunk = events[start : start + DISPATCH_STEP]
                dispatcher.accept(chunk, "bench", "127.0.0.1:1", "anonymous", "bench")
            t2 = clock()
            router._flush_sinks()
            t3 = clock()
            if session is None:
                pending, key.pending = key.pending, []
                out.send_deliver(pending)
            else:
                router.deliveries.flush()
            t4 = clock()
            for stage, ns in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                spent[stage] += ns
    finally:
        await router.aclose()
    n = frames * per_frame
    figures = {f"{stage}_us_per_event": round(ns / n / 1000, 3) for stage, ns in spent.items()}
    figures["total_us_per_event"] = round(sum(spent.values()) / n / 1000, 3)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frames", type=int, default=60, help="publish frames (default: 60)")
    ap.add_argument("--events", type=int, default=1000, help="events per frame (default: 1000)")
    ap.add_argument(
        "--python-stamp",
        action="store_true",
        help="stamp with the Python loop even where the compiled one is built",
    )
    ap.add_argument(
        "--session",
        action="store_true",
        help="deliver to a real client session (on a transport that keeps nothing)",
    )
    args = ap.parse_args()
    if args.python_stamp:
        from aa.router import dispatch

        dispatch._compiled_stamp = None
    from aa.mesh import event_path

    figures = asyncio.run(run(args.frames, args.events, args.session))
    report(
        "router-stages",
        {
            "path": event_path(),
            "events": args.frames * args.events,
            "session": args.session,
            **figures,
        },
    )


if __name__ == "__main__":
    main()
