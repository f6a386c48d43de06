"""A publisher at a steady rate that times every acknowledgement, for network-namespace
tests (`ip netns exec NS python netns_pacer.py ROUTER --rate N --size B --seconds S`).

It speaks the wire protocol itself (`support.wire`): one `Publish` frame every `TICK`
seconds with rate × TICK events of about *size* bytes, each frame its own sequence number,
so the router's cumulative acks tell when each frame was acknowledged. It prints JSON lines:
``{"ok": true, "started": true}`` once connected, ``{"ok": true, "t": T, "acked": N}`` about
every second, and at the end (after waiting up to `DRAIN` seconds for the last acks)
``{"ok": true, "done": true, "frames": F, "acked": A, "max_wait": W, "worst_sent_at": T}``
— a frame never acknowledged counts as waiting until the end.
"""

from __future__ import annotations

import argparse
import json
import select
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `support` when run as a script

from aa.mesh import Event
from aa.mesh.protocol import Ack, Error, Hello, Publish
from support.wire import Wire

#: Seconds between two frames.
TICK = 0.01
#: Seconds to wait for the last acks after publishing stops.
DRAIN = 30.0


def fail(why: str) -> None:
    print(json.dumps({"ok": False, "error": why}), flush=True)
    sys.exit(1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("endpoint")
    p.add_argument("--rate", type=int, default=1000, help="events per second")
    p.add_argument("--size", type=int, default=200, help="bytes of padding per event")
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    host, port = args.endpoint.rsplit(":", 1)
    wire = Wire(host, int(port))
    wire.send(Hello(client_id="pacer"))
    per_frame = max(1, round(args.rate * TICK))
    pad = "x" * args.size
    sent_at: dict[int, float] = {}
    waits: dict[int, float] = {}
    acked = 0
    print(json.dumps({"ok": True, "started": True}), flush=True)
    start = time.monotonic()
    seq = 0
    next_report = start + 1.0

    def take_acks(timeout: float) -> None:
        nonlocal acked
        ready, _, _ = select.select([wire.sock], [], [], max(timeout, 0))
        if not ready:
            return
        data = wire.sock.recv(1 << 20)
        if not data:
            fail("the router closed the connection")
        wire.codec.receive_data(data)
        wire.got += wire.codec.next_messages()
        now = time.monotonic()
        for m in wire.got:
            if type(m) is Error:
                fail(repr(m))
            if type(m) is Ack:
                for s in range(acked + 1, m.seq + 1):  # type: ignore[attr-defined]
                    waits[s] = now - sent_at[s]
                acked = max(acked, m.seq)  # type: ignore[attr-defined]
        wire.got.clear()

    while (now := time.monotonic()) - start < args.seconds:
        due = start + seq * TICK
        if now >= due:
            seq += 1
            events = tuple(Event(values={"seq": seq, "j": j, "pad": pad}) for j in range(per_frame))
            sent_at[seq] = time.monotonic()
            wire.send(Publish(seq=seq, events=events))
        if now >= next_report:
            print(json.dumps({"ok": True, "t": round(now - start, 2), "acked": acked}), flush=True)
            next_report += 1.0
        take_acks(due + TICK - time.monotonic() if now >= due else due - now)
    end = time.monotonic() + DRAIN
    while acked < seq and time.monotonic() < end:
        take_acks(end - time.monotonic())
    now = time.monotonic()
    for s in range(acked + 1, seq + 1):
        waits[s] = now - sent_at[s]
    worst = max(waits, key=waits.__getitem__)
    print(
        json.dumps(
            {
                "ok": True,
                "done": True,
                "frames": seq,
                "acked": acked,
                "max_wait": round(waits[worst], 3),
                "worst_sent_at": round(sent_at[worst] - start, 2),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
