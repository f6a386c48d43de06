"""Golden tests: the compiled event path and the pure-Python one put the same bytes on the
wire and give the same errors.

This file is also a program: `python tests/test_compiled_golden.py` prints, as JSON, the
frames a fixed set of messages and events encode to, what a fixed set of malformed frames
and values decode to (the message, or the error's class and text), what a seen-id filter
answers, and the outcome of 3,000 seeded mutations of valid frames. The tests run it twice,
with and without `AA_PURE_PYTHON=1`, and compare the two answers whole.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from aa.mesh import _speedups

MUTATIONS = 3000


def _deep(levels: int) -> Any:
    """A list nested *levels* deep."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def _events() -> list[Any]:
    from aa.mesh import Event

    aware = datetime(2026, 11, 27, 17, 0, 0, 123456, tzinfo=UTC)
    naive = datetime(2026, 11, 27, 17, 0, 0, 5)
    values = [
        {"Temperature": 20, "Sensor": "lab-1", "Humidity": 0.5, "Seq": 7, "Sent": 1.5},
        {"none": None, "t": True, "f": False, "min": -(2**63), "max": 2**64 - 1, "z": 0},
        {"s": "", "u": "å∑😀", "b": b"\x00\xff", "big": "x" * 300, "f": -0.0, "inf": 1e308},
        {"aware": aware, "naive": naive, "l": [1, [2, [3, {"d": [None]}]]], "m": {"a": {}}},
        {"nested": [[[[[[[[[[]]]]]]]]]], "dict": {str(i): i for i in range(20)}},
    ]
    return [
        Event(values=v, type=t, meta=m, id=i)
        for v, t, m, i in zip(
            values,
            ["reading", None, "x", "ü", None],
            [{}, {"user": "ann"}, {"path": ["r1", "r2"], "ttl": 3}, {}, {"k": [1.5]}],
            ["a-1", "b" * 64, None, "c-ff", "d-10"],
        )
    ]


def _messages(events: list[Any]) -> list[Any]:
    from aa.mesh.protocol import (
        Ack,
        Bye,
        Deliver,
        Error,
        Hello,
        PatternSpec,
        Ping,
        Publish,
        Subscribe,
        Update,
    )

    return [
        Hello(client_id="c1", name="golden", secret="s" * 16),
        Publish(seq=1, events=tuple(events)),
        Ack(seq=2**40),
        Subscribe(sub_id=3, pattern=PatternSpec(source="Temperature > 1"), params={"x": 1}),
        Update(sub_id=3, params={"x": [1, 2.5, "a"]}),
        Deliver(items=tuple(((1, 2), e) for e in events)),
        Error(code="bad", message="wrong", ref=4, fatal=True),
        Ping(token=9),
        Bye(),
    ]


def _outcome(frame: bytes, max_items: int | None = 1000) -> str:
    """What a fresh codec makes of *frame*: the messages' reprs, or the error."""
    from aa.mesh.protocol import NEED_DATA, Connection

    conn = Connection(max_items=max_items)
    conn.receive_data(frame)
    out = []
    try:
        while (msg := conn.next_message()) is not NEED_DATA:
            out.append(repr(msg))
    except Exception as exc:
        out.append(f"{type(exc).__name__}: {exc}")
    return " | ".join(out)


def _session_outcome(frame: bytes) -> str:
    """What a router's client session makes of *frame*: the compiled publish reader where
    it is built and reads it, the codec's steps otherwise (`ClientSession._process`)."""
    from aa.mesh.protocol import IN_PROGRESS, NEED_DATA, Connection
    from aa.router.session import MAX_FRAME_ITEMS
    from aa.router.wire import PublishReader

    conn = Connection(max_items=MAX_FRAME_ITEMS)
    reader = PublishReader(conn)
    conn.receive_data(frame)
    out = []
    try:
        while (msg := reader.next_publish() or conn.next_message(stepwise=True)) is not NEED_DATA:
            if msg is not IN_PROGRESS:
                out.append(repr(msg))
    except Exception as exc:
        out.append(f"{type(exc).__name__}: {exc}")
    return " | ".join(out)


def _frame(obj: Any) -> bytes:
    from aa.mesh.protocol import pack

    payload = pack(obj)
    return len(payload).to_bytes(4, "big") + payload


def _bad_frames() -> list[bytes]:
    import msgpack

    ev = ["a-1", None, {"x": 1}, {}]
    publish = {"kind": "publish", "seq": 1}
    bad_events: list[Any] = [
        "not a list",
        ["a-1", None, {"x": 1}],
        ["", None, {"x": 1}, {}],
        ["a" * 65, None, {"x": 1}, {}],
        [5, None, {"x": 1}, {}],
        ["a-1", 5, {"x": 1}, {}],
        ["a-1", None, [1], {}],
        ["a-1", None, {"x": 1}, [1]],
        ["a-1", None, {1: 1}, {}],
        ["a-1", None, {"x": msgpack.ExtType(1, b"not a date")}, {}],
        ["a-1", None, {"x": msgpack.ExtType(9, b"")}, {}],
        ["a-1", None, {"x": {"y": {2: 1}}}, {}],
        ["a-1", None, {"x": _deep(34)}, {}],
        ["a-1", None, {"x": 1}, {"m": {"n": [1, {5: 2}]}}],
    ]
    frames = [_frame({**publish, "events": [e]}) for e in bad_events]
    frames += [
        _frame({**publish, "events": [["a-1", None, {"x": 1}, None]]}),  # good: nil meta
        _frame({**publish, "events": [ev] * 1001}),  # over max_items
        _frame({**publish, "events": [ev] * 400 + [bad_events[9]]}),  # stepped, bad at the end
        _frame({**publish, "events": [["a-1", None, {"x": "y" * 9000}, {}]]}),  # stepped, good
        _frame({"kind": "deliver", "items": [[[1], e] for e in bad_events[:5]]}),
        _frame({"kind": "deliver", "items": [[[1], ev]] * 300 + [[[2], bad_events[3]]]}),
        _frame({"kind": "deliver", "items": [[[1], ev], "not an item"]}),
        _frame({"kind": "deliver", "items": [[[1], ev], [[1], ev, 3]]}),
        _frame({"kind": "deliver", "items": [[[1], ev], [1, ev]]}),
        _frame({"kind": "deliver", "items": {"1": ev}}),
        _frame({"kind": "deliver", "items": [[[1, 2], ["a-2", None, {"x": 1}, None]]]}),
        _frame({"kind": "nope"}),
        _frame([1, 2]),
        (20 * 1024 * 1024).to_bytes(4, "big"),
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x00\x10",
        b"\x00\x00\x00\x03\xc1\xc1\xc1",
        b"\x00\x00\x00\x02\xd4\x05",
    ]
    return frames


def _mutations(frames: list[bytes]) -> list[str]:
    rnd = random.Random(28)
    out = []
    for _ in range(MUTATIONS):
        data = bytearray(rnd.choice(frames))
        for _ in range(rnd.randint(1, 4)):
            pos = rnd.randrange(4, len(data)) if len(data) > 4 else 0
            choice = rnd.random()
            if choice < 0.6:
                data[pos] = rnd.randrange(256)
            elif choice < 0.8:
                del data[pos]
            else:
                data[pos:pos] = bytes([rnd.randrange(256)])
        out.append(_outcome(bytes(data)))
    return out


def _values_errors() -> list[str]:
    from aa.mesh import Event, check_value, check_values

    cases: list[Any] = [
        {"x": object()},
        {"x": 2**64},
        {"x": -(2**63) - 1},
        {1: 2},
        {"x": [1, {"y": set()}]},
        {"x": {"y": {3: 1}}},
        [1],
        {"x": _deep(34)},
        {"ok": (1, 2)},
    ]
    out = []
    for case in cases:
        for check in (check_values, check_value, lambda v: Event(values=v)):
            try:
                check(case)
                out.append("ok")
            except Exception as exc:
                out.append(f"{type(exc).__name__}: {exc}")
    return out


def _seen_ids() -> list[bool]:
    from aa.mesh import SeenIds

    seen = SeenIds(max_ids=8, max_age=10.0)
    ids = [f"id-{i % 11}" for i in range(60)]
    return [seen.check(i, now=n * 0.4) for n, i in enumerate(ids)]


def _stamped() -> list[Any]:
    """A publish stamped by a router's dispatcher (the compiled loop or the reference)."""
    from aa.mesh import Event, FloodRules, IdGenerator, SeenIds
    from aa.router.dispatch import Dispatcher

    rules = FloodRules("r1", seen=SeenIds(max_ids=100, max_age=60.0), initial_ttl=7)
    counters: Any = Counter()
    engine: Any = type(
        "Engine",
        (),
        {"match": staticmethod(lambda event: []), "deliver_each": staticmethod(lambda evs: None)},
    )()
    dispatcher = Dispatcher(ids=IdGenerator("feed"), rules=rules, engine=engine, counters=counters)
    events = [
        *_events(),
        Event(values={"x": 1}, id="a-1"),
        Event(values={"x": 2}, meta={"user": "eve", "ttl": 1, "k": 2}),
        Event(values={"x": 1}, id="a-1"),
    ]
    out = dispatcher.accept(events, "c1", "127.0.0.1:9", "ann", "a")
    return [
        [e.id, e.type, repr(e.values), repr([(k, v) for k, v in e.meta.items() if k != "time"])]
        for e in out
    ] + [counters["duplicates"]]


def golden() -> dict[str, Any]:
    """Everything the two paths must agree on, as JSON-able data."""
    from aa.mesh import Event, event_path
    from aa.mesh.protocol import (
        Connection,
        pack,
        pack_events,
        pack_with_meta,
        packed_event,
        unpacked_event,
    )

    events = _events()
    conn = Connection()
    frames = [conn.send(m) for m in _messages(events)]
    frames.append(conn.send_deliver([((1,), e) for e in events]))
    frames.append(conn.send_publish(5, [packed_event(e) for e in events]))
    decoded = [_outcome(f, None) for f in frames]
    bad = _bad_frames()
    stamp = {"time": datetime(2026, 11, 27, 17, 0, tzinfo=UTC), "ttl": 8, "path": ["r1"]}
    stamped = [Event.trusted(e.values, e.type, stamp, e.id or "x-1") for e in events]
    pack_with_meta(stamped, pack(stamp))
    return {
        "path": event_path(),
        "frames": [f.hex() for f in frames],
        "events": [packed_event(e).hex() for e in events],
        "pack_events": pack_events(events).hex(),
        "pack_with_meta": [packed_event(e).hex() for e in stamped],
        "round_trip": [repr(unpacked_event(packed_event(e))) for e in events],
        "decoded": decoded,
        "bad_frames": [_outcome(f) for f in bad],
        "mutations": _mutations(frames[:6] + bad[:4]),
        "session": [_session_outcome(f) for f in [*frames, *bad]],
        "values": _values_errors(),
        "seen_ids": _seen_ids(),
        "stamped": _stamped(),
    }


def run(pure: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != _speedups.PURE_ENV}
    if pure:
        env[_speedups.PURE_ENV] = "1"
    out = subprocess.run(
        [sys.executable, __file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def both() -> tuple[dict[str, Any], dict[str, Any]]:
    """The program's answers on the compiled path and on the pure one (whichever path this
    process runs: the two runs choose their own)."""
    compiled = run(pure=False)
    if compiled["path"] != "compiled event path":
        pytest.skip("this install has no compiled event path: nothing to compare")
    return compiled, run(pure=True)


def test_the_two_runs_are_the_two_paths(both):
    compiled, pure = both
    assert (compiled["path"], pure["path"]) == ("compiled event path", "pure Python")


@pytest.mark.parametrize(
    "part",
    [
        "frames",
        "events",
        "pack_events",
        "pack_with_meta",
        "round_trip",
        "decoded",
        "values",
        "seen_ids",
        "stamped",
        "session",
    ],
)
def test_same_bytes_and_answers(both, part):
    compiled, pure = both
    assert compiled[part] == pure[part]


def test_same_errors_for_malformed_frames(both):
    compiled, pure = both
    assert compiled["bad_frames"] == pure["bad_frames"]
    # the cases say something: each malformed frame is refused with a reason
    assert all("Error" in o or "Malformed" in o or "Unknown" in o for o in pure["bad_frames"][:14])


def test_same_outcome_for_mutated_frames(both):
    compiled, pure = both
    assert len(pure["mutations"]) == MUTATIONS
    diff = [(i, c, p) for i, (c, p) in enumerate(zip(compiled["mutations"], pure["mutations"]))]
    assert [d for d in diff if d[1] != d[2]] == []


def test_golden_data_is_what_this_path_makes():
    """This process (either path) makes what the program prints for it."""
    here = golden()
    there = run(pure=not _speedups.COMPILED)
    assert here["path"] == _speedups.event_path()
    assert here["frames"] == there["frames"]
    assert here["bad_frames"] == there["bad_frames"]


if __name__ == "__main__":
    json.dump(golden(), sys.stdout)
