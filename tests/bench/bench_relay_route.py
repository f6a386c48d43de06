"""A relay's interest routing per event, without sockets: `MeshInterests.forward_many` (what
`Relay._route` asks for every relayed group) on the 8-router ring of `bench_ring.py`, router 1
relaying router 0's events toward router 4, for the interests a subscriber can give.

    python tests/bench/bench_relay_route.py
    PYTHONPATH=/tmp/base-site python tests/bench/bench_relay_route.py   # other code, paired

Interests of router 4: ``has`` (``bench_ring.py``'s pattern, ``Temperature > -1000 and
Sensor.startswith("lab")``, wants events carrying ``Temperature``), ``eq`` (``Sensor ==
"lab-1"``), ``type`` (events of one type, the answer kept per type), ``mixed`` (a type, a
persisted-events filter and two equalities, so each event is checked against several).
Events are ``bench_ring.py``'s, in groups of 200. Prints one JSON line per interest: ns per
event, best of the repeats (the least disturbed by other processes).
"""

from __future__ import annotations

import argparse
import json
import time

from aa.mesh import Event, Interest, InterestFilter, MeshInterests

INTERESTS = {
    "has": [InterestFilter.make(has=["Temperature"])],
    "eq": [InterestFilter.make(eq=[("Sensor", "lab-1")])],
    "type": [InterestFilter.make(type="reading")],
    "mixed": [
        InterestFilter.make(type="other"),
        InterestFilter(flags=1),
        InterestFilter.make(eq=[("Sensor", "lab-2")]),
        InterestFilter.make(eq=[("Seq", 7)], has=["Humidity"]),
    ],
}


def ring_view(interest: Interest) -> MeshInterests:
    view = MeshInterests()
    for i in range(8):
        peers = [f"r{(i - 1) % 8}", f"r{(i + 1) % 8}"]
        view.put(f"r{i}", peers, interest if i == 4 else Interest.NOTHING)
    return view


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=2000, help="groups per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    events = [
        Event(
            values={"Temperature": 20 + i % 80, "Sensor": "lab-1", "Humidity": 0.5, "Seq": i},
            type="reading" if i % 2 else None,
        )
        for i in range(200)
    ]
    for name, filters in INTERESTS.items():
        view = ring_view(Interest.of(filters))
        answers = view.forward_many("r1", "r0", "r0", events)
        assert answers is not None
        best = float("inf")
        for _ in range(args.repeats):
            t = time.perf_counter()
            for _ in range(args.groups):
                view.forward_many("r1", "r0", "r0", events)
            best = min(best, time.perf_counter() - t)
        sent = sum(1 for a in answers if a)
        print(
            json.dumps(
                {
                    "bench": "relay-route",
                    "interest": name,
                    "ns_per_event": round(best / args.groups / len(events) * 1e9),
                    "share_forwarded": sent / len(events),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
