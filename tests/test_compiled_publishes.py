"""The router's compiled publish reader (`router/wire/_publishes.pyx`) reads a client's publish
frames into the same events as the codec's reference path, and leaves every frame it does
not read, good or bad, to that path: the same messages and the same errors either way."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.wire import BAD_EVENTS

from aa.mesh import Event, ProtocolError
from aa.mesh.protocol import (
    NEED_DATA,
    PUBLISH_HEAD,
    Connection,
    Publish,
    pack,
    packed_event,
    packed_fields,
)
from aa.router.session import MAX_FRAME_ITEMS
from aa.router.wire import publishes

try:
    from aa.router.wire import _publishes
except ImportError:  # built without a compiler: the reference path alone runs
    _publishes = None  # type: ignore[assignment]

needs_compiled = pytest.mark.skipif(_publishes is None, reason="the reader was not compiled")


def typed(value: Any) -> Any:
    """*value* with the type of each part beside it (True is no 1, a tz is kept)."""
    if type(value) is dict:
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if type(value) in (list, tuple):
        return (type(value).__name__, [typed(v) for v in value])
    if type(value) is datetime:
        return ("datetime", value.isoformat(), str(value.tzinfo))
    if type(value) is float and value != value:
        return ("float", "nan")
    return (type(value).__name__, value)


#: Frames the compiled reader read itself (not left to the reference) in the last `read`.
compiled_reads: list[bool] = []
#: Events the compiled reader gave their bytes (`Event.packed`) in the last `read`.
kept_bytes: list[Event] = []


def counted(*args: Any) -> Any:
    got = _publishes.read(*args)
    compiled_reads.append(got is not None)
    return got


def use_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled reader, and its cache, in this process whichever path it runs."""
    monkeypatch.setattr(publishes, "_read", _publishes.read)
    monkeypatch.setattr(publishes, "_new_cache", _publishes.new_cache)


def read(
    data: bytes, compiled: bool, monkeypatch: pytest.MonkeyPatch, piece: int | None = None
) -> list[Any]:
    """What a router's session makes of *data* (given in pieces of *piece* bytes), with or
    without the compiled reader: each message (a publish's seq and its events with their
    types) or the error, as `ClientSession._process` reads them."""
    use_compiled(monkeypatch)
    monkeypatch.setattr(publishes, "_read", counted if compiled else None)
    compiled_reads.clear()
    kept_bytes.clear()
    codec = Connection(max_items=MAX_FRAME_ITEMS)
    reader = publishes.PublishReader(codec)
    out: list[Any] = []
    step = piece or len(data) or 1
    try:
        for at in range(0, len(data), step):
            codec.receive_data(data[at : at + step])
            while True:
                msg = reader.next_publish() or codec.next_message(stepwise=True)
                if msg is NEED_DATA:
                    break
                if isinstance(msg, Publish):
                    kept_bytes.extend(e for e in msg.events if e.packed is not None)
                    out.append(
                        [msg.seq, [typed([e.id, e.type, e.values, e.meta]) for e in msg.events]]
                    )
                elif repr(msg) != "IN_PROGRESS":
                    out.append(repr(msg))
    except ProtocolError as exc:
        out.append(f"{type(exc).__name__}: {exc}")
        return out
    if codec.buffered:
        out.append(WAITING)
    for e in kept_bytes:  # what the reader kept is what the codec makes of the event
        assert e.packed == packed_fields(e.id, e.type, e.values, e.meta), e
    return out


#: `read`'s last entry when the stream ended inside a frame.
WAITING = "waiting for the rest of a frame"


def same_answer(compiled: list[Any], reference: list[Any]) -> bool:
    """The two paths' answers to the same bytes agree. The one difference allowed: a stream
    that ends inside a publish frame, which the compiled reader waits to read whole, while
    the codec decodes it in steps as it comes and may find it wrong before its end (a
    connection whose frame never ends is closed all the same)."""
    if compiled == reference or compiled[-1:] != [WAITING]:
        return compiled == reference
    head = compiled[:-1]
    rest = reference[len(head) :]
    return reference[: len(head)] == head and (
        rest == [WAITING] or len(rest) == 1 and str(rest[0]).startswith("MalformedFrame")
    )


def frame(seq: int, events: list[Event]) -> bytes:
    """A publish frame as the client library sends it (each event packed as it was made)."""
    return Connection().send_publish(seq, [packed_event(e) for e in events])


def raw_frame(obj: Any) -> bytes:
    payload = pack(obj)
    return len(payload).to_bytes(4, "big") + payload


def usual(i: int) -> Event:
    values = {"Temperature": 20 + i % 80, "Sensor": "lab-1", "Humidity": 0.5, "Seq": i}
    return Event(values=values | {"Sent": 1.7e9 + i}, id=f"885c9997d9d3d569-{i:x}")


EVENTS = [
    Event(values={"none": None, "t": True, "f": False, "min": -(2**63), "max": 2**64 - 1}),
    Event(values={"s": "", "u": "å∑😀", "b": b"\x00\xff", "big": "x" * 300, "f": -0.0}, id="a"),
    Event(values={"neg": -1, "n8": -100, "n16": -30000, "n32": -(2**31), "u32": 2**32}, id="b"),
    Event(values={"s": "lab-2", "u": "å∑😀", "b": b"", "big": "x" * 31, "f": 1.5}, id="a2"),
    Event(values={"k" * 40: "v" * 70000, "inf": float("inf"), "nan": float("nan")}, id="e"),
    Event(values={}, type="ü" * 200, id="f" * 64),
    Event(values={"x": 1}, meta={"user": "eve", "ttl": 1, "path": None}, type="t", id="g"),
    Event(values={"x": 1}, type="t", id="h"),
]

#: Events the compiled reader leaves to the reference path (nested values, extensions).
OTHERS = [
    Event(values={"aware": datetime(2026, 11, 28, 9, 13, tzinfo=UTC)}, id="c"),
    Event(values={"naive": datetime(2026, 1, 1, 1, 1, 1, 5)}, id="c2"),
    Event(values={"l": [1, [2, {"d": [None]}]], "m": {"a": {}}}, type="nested", id="d"),
    Event(values={"x": 1}, meta={"m": {"n": [1]}}, id="d2"),
]


@needs_compiled
def test_a_client_s_frames_read_as_the_reference_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frames = [
        frame(1, [usual(i) for i in range(1000)]),
        frame(2, EVENTS),
        frame(3, [usual(i) for i in range(20)] + EVENTS + [usual(5)]),
        frame(2**40, [usual(1)]),
        frame(-1, [usual(2)]),
        frame(5, []),
    ]
    data = b"".join(frames)
    compiled = read(data, True, monkeypatch)
    assert compiled_reads == [True] * len(frames)
    assert compiled == read(data, False, monkeypatch)
    assert len(compiled) == len(frames) and len(compiled[0][1]) == 1000


@needs_compiled
def test_unusual_events_go_the_reference_way(monkeypatch: pytest.MonkeyPatch) -> None:
    frames = [frame(i, [usual(i), e]) for i, e in enumerate(OTHERS)]
    frames.append(raw_frame({"kind": "publish", "seq": 9, "events": [["a", None, {}, None]]}))
    frames.append(raw_frame({"kind": "publish", "seq": 10, "events": [], "more": 1}))
    data = b"".join(frames)
    compiled = read(data, True, monkeypatch)
    assert compiled_reads == [False] * (len(frames) - 1)  # a map of four keys: not tried
    assert compiled == read(data, False, monkeypatch)


@needs_compiled
@pytest.mark.parametrize("piece", [1, 7, 1000, 40_000])
def test_a_frame_in_pieces_is_read_whole_when_it_is_all_there(
    monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    from aa.mesh.protocol import Ping

    data = b"".join(
        [
            frame(1, [usual(i) for i in range(300)]),
            Connection().send(Ping(token=7)),
            frame(2, EVENTS),
            frame(3, OTHERS),
        ]
    )
    compiled = read(data, True, monkeypatch, piece)
    assert compiled_reads == [True, True, False]
    assert compiled == read(data, False, monkeypatch, piece) == read(data, False, monkeypatch)


@needs_compiled
def test_events_share_no_mutable_value(monkeypatch: pytest.MonkeyPatch) -> None:
    # Strs are kept from one event to the next; maps never are.
    use_compiled(monkeypatch)
    codec = Connection()
    codec.receive_data(frame(1, [usual(i) for i in range(3)]) * 2)
    reader = publishes.PublishReader(codec)
    events = []
    for _ in range(2):
        msg = reader.next_publish()
        assert isinstance(msg, Publish)
        events += msg.events
    assert len({id(e.values) for e in events}) == 6 and len({id(e.meta) for e in events}) == 6
    events[0].values["Sensor"] = "changed"
    assert events[1].values["Sensor"] == "lab-1"


def odd_frame(event: bytes) -> bytes:
    """A publish frame of one event given as its bytes, which may be in forms msgpack's
    packer never writes."""
    payload = PUBLISH_HEAD + b"\x01\xa6events\x91" + event
    return len(payload).to_bytes(4, "big") + payload


#: An event's bytes with its values in a form of the packer's, then the same value in other
#: forms (a longer int, an int signed or not, a float in 32 bits, a longer str or map header,
#: a key twice). Each reads as the same event; only the first is that event's `packed`.
ODD_VALUES = [
    b"\x81\xa1x\x05",
    b"\x81\xa1x\xcc\x05",
    b"\x81\xa1x\xd0\x05",
    b"\x81\xa1x\xcd\x00\x05",
    b"\x81\xa1x\xd1\x00\x05",
    b"\x81\xa1x\xce\x00\x00\x00\x05",
    b"\x81\xa1x\xd2\x00\x00\x00\x05",
    b"\x81\xa1x\xcf\x00\x00\x00\x00\x00\x00\x00\x05",
    b"\x81\xa1x\xd3\x00\x00\x00\x00\x00\x00\x00\x05",
    b"\x81\xd9\x01x\x05",
    b"\xde\x00\x01\xa1x\x05",
    b"\x82\xa1x\x04\xa1x\x05",
]


@needs_compiled
@pytest.mark.parametrize("values", ODD_VALUES)
def test_only_bytes_in_the_packer_s_form_are_kept(
    monkeypatch: pytest.MonkeyPatch, values: bytes
) -> None:
    data = odd_frame(b"\x94\xa1a\xc0" + values + b"\x80")
    compiled = read(data, True, monkeypatch)
    assert compiled_reads == [True]
    assert len(kept_bytes) == (values == ODD_VALUES[0])  # `read` checks what was kept
    assert compiled == read(data, False, monkeypatch)


@needs_compiled
@pytest.mark.parametrize(
    "value",
    [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1, -1, -32, -33, -128, -129]
    + [-32768, -32769, -(2**31), -(2**31) - 1, -(2**63), 0.5, "", "x" * 31, "x" * 32, "y" * 256]
    + ["y" * 65536, b"", b"z" * 256, b"z" * 65536, None, True, False],
)
def test_every_form_of_the_packer_s_is_kept(monkeypatch: pytest.MonkeyPatch, value: Any) -> None:
    data = frame(1, [Event(values={"v": value, **{f"k{i}": i for i in range(15)}}, id="a")])
    if len(data) > 128 * 1024:
        data = frame(1, [Event(values={"v": value}, id="a")])
    compiled = read(data, True, monkeypatch)
    assert compiled_reads == [True] and len(kept_bytes) == 1
    assert compiled == read(data, False, monkeypatch)


@needs_compiled
def test_a_stamped_publish_is_packed_as_the_reference_packs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The router packs a stamped event from the bytes the reader kept of its source: the same
    # bytes as packing it whole, for every event, kept or not, retried or not.
    from collections import Counter

    from aa.mesh import FloodRules, IdGenerator, SeenIds
    from aa.router.dispatch import Dispatcher

    rules = FloodRules("r1", seen=SeenIds(max_ids=100, max_age=60.0), initial_ttl=7)
    engine: Any = type(
        "Engine",
        (),
        {"match": staticmethod(lambda event: []), "deliver_each": staticmethod(lambda evs: None)},
    )()
    dispatcher = Dispatcher(ids=IdGenerator("feed"), rules=rules, engine=engine, counters=Counter())
    events = [usual(i) for i in range(5)] + EVENTS + OTHERS + [usual(2), Event(values={"x": 1})]
    data = frame(1, events[:8]) + odd_frame(b"\x94\xa1a\xc0" + ODD_VALUES[1] + b"\x80")
    data += frame(2, events[8:13]) + frame(3, events[13:])  # the third has nested values
    use_compiled(monkeypatch)
    codec = Connection(max_items=MAX_FRAME_ITEMS)
    codec.receive_data(data)
    reader = publishes.PublishReader(codec)
    stamped, kept = [], 0
    while (msg := reader.next_publish() or codec.next_message()) is not NEED_DATA:
        assert isinstance(msg, Publish)
        kept += sum(e.packed is not None for e in msg.events)
        stamped += dispatcher.accept(msg.events, "c1", "127.0.0.1:9", "ann", None)
    assert kept == 12  # the first two frames' events without a meta of their own
    assert len(stamped) == len(events) - 1  # usual(2) again and the second `a` are retries
    packed = [e for e in stamped if e.packed is not None]  # those of the stamp alone
    assert len(packed) == len(stamped) - 2  # two have a meta of their publisher's
    for e in packed:
        assert e.packed == packed_fields(e.id, e.type, e.values, e.meta), e


@needs_compiled
def test_a_connection_keeps_only_short_strs(monkeypatch: pytest.MonkeyPatch) -> None:
    # The strs kept from one event to the next live as long as the connection: a client
    # cannot make its session hold more than a few kB with long keys, values or types.
    use_compiled(monkeypatch)
    codec = Connection(max_items=MAX_FRAME_ITEMS)
    long = Event(values={"k" * 70: "v" * 1000, "s": "w" * 65}, type="t" * 100, id="a")
    codec.receive_data(frame(1, [usual(1), long]))
    reader = publishes.PublishReader(codec)
    assert isinstance(reader.next_publish(), Publish)
    kept = [s for s in reader._cache if s is not None]
    assert kept and max(len(s.encode()) for s in kept) <= 64


@needs_compiled
def test_large_frames_go_to_the_codec_s_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    # Bounded work: a frame of more items than `MAX_WORK`, or more bytes than the codec
    # decodes without counting, is decoded in steps by the reference path.
    many = frame(1, [Event(values={"a": 0}) for _ in range(6000)])  # 36,000 items, 42 kB
    big = frame(2, [Event(values={"x": "y" * 200_000}, id="b")])
    for data, reads in ((many, [False]), (big, [])):  # too many items; not even tried
        compiled = read(data, True, monkeypatch)
        assert compiled_reads == reads
        assert compiled == read(data, False, monkeypatch)


def bad_frames() -> list[bytes]:
    ev = ["a-1", None, {"x": 1}, {}]
    publish = {"kind": "publish", "seq": 1}
    return [raw_frame({**publish, "events": [e]}) for e in BAD_EVENTS] + [
        raw_frame({**publish, "events": [ev] * (MAX_FRAME_ITEMS + 1)}),
        raw_frame({**publish, "events": [["a-1", None, {str(k): 1 for k in range(10_001)}, {}]]}),
        raw_frame({**publish, "events": [ev] * 400 + [["a-1", 5, {}, {}]]}),
        raw_frame({**publish, "events": {"1": ev}}),
        raw_frame({"kind": "publish", "seq": "1", "events": [ev]}),
        raw_frame({"kind": "publish", "seq": True, "events": [ev]}),
        raw_frame({"kind": "publish", "seq": 1, "event": [ev]}),
        raw_frame({**publish, "events": [ev]}) + b"\x00\x00\x00\x01\xc1",
        b"\x00\x00\x00\x14" + pack({**publish, "events": []}) + b"\xc0" * 5,
        b"\x00\x00\x00\x1e" + pack({**publish, "events": [["a", None, {"x": b"\xff"}, {}]]}),
        raw_frame({**publish, "events": [["a", None, {"x": 1}, {}]]}).replace(
            b"\xa1x", b"\xa1\xff"
        ),
    ]


@needs_compiled
def test_bad_frames_get_the_same_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for data in bad_frames():
        reference = read(data, False, monkeypatch)
        assert read(data, True, monkeypatch) == reference, data[:80]
        assert "Error" in str(reference) or "Malformed" in str(reference), reference


@needs_compiled
def test_mutated_and_cut_frames_get_the_same_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    good = [frame(1, [usual(i) for i in range(40)]), frame(2, EVENTS[:4])]
    rnd = random.Random(28)
    cases = [good[0][:n] for n in range(0, len(good[0]), 97)]
    for _ in range(1500):
        data = bytearray(rnd.choice(good))
        for _ in range(rnd.randint(1, 3)):
            pos = rnd.randrange(4, len(data))
            choice = rnd.random()
            if choice < 0.6:
                data[pos] = rnd.randrange(256)
            elif choice < 0.8:
                del data[pos]
            else:
                data[pos:pos] = bytes([rnd.randrange(256)])
        cases.append(bytes(data))
    read_whole = 0
    for data in cases:
        compiled = read(data, True, monkeypatch)
        read_whole += sum(compiled_reads)
        assert same_answer(compiled, read(data, False, monkeypatch)), data
    assert read_whole > 100  # mutations within a str or a number leave a frame good


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=40)
)
flat_maps = st.dictionaries(st.text(max_size=12), scalars, max_size=8)
model_values = st.recursive(
    scalars | st.datetimes(timezones=st.just(UTC)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
maps = flat_maps | st.dictionaries(st.text(max_size=12), model_values, max_size=8)


@needs_compiled
@settings(max_examples=150, deadline=None)
@given(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.lists(
        st.tuples(
            maps,
            st.just({}) | maps,
            st.none() | st.text(min_size=1, max_size=64),
            st.none() | st.text(max_size=10),
        ),
        max_size=6,
    ),
)
def test_any_events_of_the_model_read_alike(seq: int, items: list[Any]) -> None:
    events = [Event(values=v, meta=m, id=i, type=t) for v, m, i, t in items]
    data = frame(seq, events) * 2
    with pytest.MonkeyPatch.context() as mp:
        compiled = read(data, True, mp)
        flat = all(
            all(
                type(x) not in (list, dict, datetime)
                for x in [*e.values.values(), *e.meta.values()]
            )
            for e in events
        )
        if flat:
            assert compiled_reads == [True, True]
        assert compiled == read(data, False, mp)


@needs_compiled
def test_a_wrong_cache_is_refused() -> None:
    with pytest.raises(ValueError, match="new_cache"):
        _publishes.read(frame(1, [usual(1)])[4:], len(PUBLISH_HEAD), 10, 10, None, 64, [], None)


def test_the_pure_path_reads_with_the_reference() -> None:
    code = "from aa.router.wire import publishes; print(publishes.COMPILED)"
    env = {**os.environ, "AA_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr
