"""The client's compiled delivery reader (`client/_deliver.pyx`) reads a router's delivery
frames into the same events as the codec's reference path, and leaves every frame it does
not read, good or bad, to that path: the same messages and the same errors either way."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.wire import BAD_EVENTS

from aa.client import deliveries
from aa.mesh import MAX_ID_LENGTH, Event, ProtocolError
from aa.mesh.protocol import (
    DELIVER_HEAD,
    NEED_DATA,
    Connection,
    Deliver,
    pack,
    pack_with_meta,
    unpack,
)

try:
    from aa.client import _deliver
except ImportError:  # built without a compiler: the reference path alone runs
    _deliver = None  # type: ignore[assignment]

needs_compiled = pytest.mark.skipif(_deliver is None, reason="the reader was not compiled")

STAMP = {
    "time": datetime(2026, 11, 28, 9, 13, 23, 610325, tzinfo=UTC),
    "client": "26523ca365925a3f",
    "address": "127.0.0.1:50828",
    "router": "31a2278fab2b955d",
    "user": "anonymous",
    "ttl": 64,
    "path": ["31a2278fab2b955d"],
}


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
compiled_reads: list[int] = []


def counted(*args: Any) -> Any:
    items = _deliver.read(*args)
    compiled_reads.append(items is not None)
    return items


def read(
    data: bytes, compiled: bool, monkeypatch: pytest.MonkeyPatch, piece: int | None = None
) -> list[Any]:
    """What a client's connection makes of *data* (given in pieces of *piece* bytes), with
    or without the compiled reader: each message (a delivery's items with their types) or
    the error, as `Link` reads them."""
    monkeypatch.setattr(deliveries, "_read", counted if compiled else None)
    compiled_reads.clear()
    codec = Connection()
    reader = deliveries.DeliveryReader(codec)
    out: list[Any] = []
    step = piece or len(data) or 1
    try:
        for at in range(0, len(data), step):
            codec.receive_data(data[at : at + step])
            while (msg := reader.next_deliver() or codec.next_message()) is not NEED_DATA:
                if isinstance(msg, Deliver):
                    out.append(
                        [(typed(s), typed([e.id, e.type, e.values, e.meta])) for s, e in msg.items]
                    )
                else:
                    out.append(repr(msg))
    except ProtocolError as exc:
        out.append(f"{type(exc).__name__}: {exc}")
        return out
    if codec.buffered:
        out.append(WAITING)
    return out


#: `read`'s last entry when the stream ended inside a frame.
WAITING = "waiting for the rest of a frame"


def same_answer(compiled: list[Any], reference: list[Any]) -> bool:
    """The two paths' answers to the same bytes agree. The one difference allowed: a stream
    that ends inside a delivery frame, which the compiled reader waits to read whole, while
    the codec decodes it in steps as it comes and may find it wrong before its end (a
    connection whose frame never ends is closed all the same)."""
    if compiled == reference or compiled[-1:] != [WAITING]:
        return compiled == reference
    head = compiled[:-1]
    rest = reference[len(head) :]
    return reference[: len(head)] == head and (
        rest == [WAITING] or len(rest) == 1 and str(rest[0]).startswith("MalformedFrame")
    )


@needs_compiled
@pytest.mark.parametrize("piece", [1, 7, 1000, 40_000])
def test_a_frame_in_pieces_is_read_whole_when_it_is_all_there(
    monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    # The codec would decode a large frame in steps as its pieces come; the compiled reader
    # waits for the whole delivery frame instead. Other frames between them go on as before.
    from aa.mesh.protocol import Ping

    data = b"".join(
        [
            frame([([1], usual(i)) for i in range(300)]),
            Connection().send(Ping(token=7)),
            frame([([2], e) for e in EVENTS]),
            raw_frame({"kind": "deliver", "items": [[[1], ["", None, {}, {}]]]}),
        ]
    )
    compiled = read(data, True, monkeypatch, piece)
    assert compiled_reads == [True, True, False]
    assert compiled == read(data, False, monkeypatch, piece) == read(data, False, monkeypatch)


def frame(items: list[tuple[list[int], Event]]) -> bytes:
    """A delivery frame as a router builds it (each event's meta the publish's stamp)."""
    pack_with_meta([e for _, e in items], pack(STAMP))
    return Connection().send_deliver(items)


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
    Event(values={"aware": STAMP["time"], "naive": datetime(2026, 1, 1, 1, 1, 1, 5)}, id="c"),
    Event(values={"l": [1, [2, {"d": [None]}]], "m": {"a": {}}}, type="nested", id="d"),
    Event(values={"k" * 40: "v" * 70000, "inf": float("inf"), "nan": float("nan")}, id="e"),
    Event(values={}, type="ü" * 200, id="f" * 64),
]


@needs_compiled
def test_a_router_s_frames_read_as_the_reference_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frames = [
        frame([([1], usual(i)) for i in range(300)]),
        frame([([1, 2], e) for e in EVENTS]),
        frame([([i % 3 + 1], usual(i)) for i in range(20)] + [([7], e) for e in EVENTS]),
        frame([([2**40], usual(1))]),
        frame([([s], usual(i)) for i, s in enumerate([1, 1, 300, 300, 1, 2, 2, 127, 128, 0, 0])]),
        frame([([], usual(2))]),
        frame([]),
    ]
    data = b"".join(frames)
    compiled = read(data, True, monkeypatch)
    assert compiled_reads == [True] * len(frames)
    assert compiled == read(data, False, monkeypatch)
    assert len(compiled) == len(frames) and len(compiled[0]) == 300


@needs_compiled
def test_each_event_has_a_meta_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # The reader decodes a stamp the events of a publish share once; a subscriber that
    # changes one event's meta (its path list too) changes no other event.
    monkeypatch.setattr(deliveries, "_read", _deliver.read)
    codec = Connection()
    codec.receive_data(frame([([1], usual(i)) for i in range(3)]) * 2)
    reader = deliveries.DeliveryReader(codec)
    metas = []
    for _ in range(2):
        msg = reader.next_deliver()
        assert isinstance(msg, Deliver)
        metas += [e.meta for _, e in msg.items]
    assert all(m == STAMP for m in metas)
    assert len({id(m) for m in metas}) == 6 and len({id(m["path"]) for m in metas}) == 6
    metas[0]["path"].append("x")
    assert metas[1]["path"] == STAMP["path"]


def bad_frames() -> list[bytes]:
    ev = ["a-1", None, {"x": 1}, {}]
    return [
        raw_frame({"kind": "deliver", "items": [[[1], e]]})
        for e in [*BAD_EVENTS, ["a-1", None, {"x": 1}, None]]
    ] + [
        raw_frame({"kind": "deliver", "items": [[[1], ev], "not an item"]}),
        raw_frame({"kind": "deliver", "items": [[[1], ev], [[1], ev, 3]]}),
        raw_frame({"kind": "deliver", "items": [[1, ev]]}),
        raw_frame({"kind": "deliver", "items": [[["1"], ev]]}),
        raw_frame({"kind": "deliver", "items": [[[True], ev]]}),
        raw_frame({"kind": "deliver", "items": {"1": ev}}),
        raw_frame({"kind": "deliver", "items": [[[1], ev]], "more": 1}),
        raw_frame({"kind": "deliver", "items": [[[1], ev]] * 300 + [[[2], ["", None, {}, {}]]]}),
        raw_frame({"kind": "deliver", "items": [[[1], ["a", None, {"x": [0] * 70_000}, {}]]] * 2}),
        raw_frame({"kind": "deliver", "items": [[[1], ev]]}) + b"\x00\x00\x00\x01\xc1",
        b"\x00\x00\x00\x10" + pack({"kind": "deliver", "items": []}) + b"\xc0" * 5,
    ]


@needs_compiled
def test_bad_frames_get_the_same_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for data in bad_frames():
        assert read(data, True, monkeypatch) == read(data, False, monkeypatch), data[:80]


@needs_compiled
def test_mutated_and_cut_frames_get_the_same_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    good = [
        frame([([1], usual(i)) for i in range(40)]),
        frame([([1, 2], e) for e in EVENTS[:5]]),
    ]
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


@needs_compiled
def test_a_frame_of_too_many_items_is_left_to_the_steps_before_it_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A hostile router's frame of more bytes than `max_values` holds far more items than
    # that (here 20,000 tiny events, each with a nested value the reader hands to msgpack).
    # The reference refuses it in steps; the compiled reader leaves it to the reference as
    # soon as its count is over, not after building every event (a 16 MiB frame of them
    # held a client's loop for seconds).
    nested = [[1], [None, None, {"a": []}, {}]]
    payload = DELIVER_HEAD + b"\xdd" + (20_000).to_bytes(4, "big") + msgpack.packb(nested) * 20_000
    unpacked = 0

    def counting_unpack(raw: bytes) -> Any:
        nonlocal unpacked
        unpacked += 1
        return unpack(raw)

    max_values = 1_000
    got = _deliver.read(
        payload,
        len(DELIVER_HEAD),
        max_values,
        [None, None],
        Event.trusted,
        deliveries._in_model,
        counting_unpack,
        MAX_ID_LENGTH,
    )
    assert got is None
    assert unpacked <= max_values // 6  # each event counts 7 items at least
    codec = Connection(max_values=max_values)
    codec.receive_data(len(payload).to_bytes(4, "big") + payload)
    with pytest.raises(ProtocolError, match="more than 1000 values"):
        while codec.next_message() is not NEED_DATA:
            pass


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=40)
    | st.datetimes(timezones=st.just(UTC))
)
model_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
maps = st.dictionaries(st.text(max_size=12), model_values, max_size=8)


@needs_compiled
@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(min_value=0, max_value=2**63 - 1), max_size=3),
            maps,
            maps,
            st.none() | st.text(min_size=1, max_size=64),
            st.none() | st.text(max_size=10),
        ),
        max_size=6,
    )
)
def test_any_events_of_the_model_read_alike(items: list[Any]) -> None:
    events = [(sids, Event(values=v, meta=m, id=i, type=t)) for sids, v, m, i, t in items]
    data = Connection().send_deliver(events) * 2
    with pytest.MonkeyPatch.context() as mp:
        compiled = read(data, True, mp)
        assert compiled_reads == [True, True]
        assert compiled == read(data, False, mp)


def test_the_pure_path_reads_with_the_reference() -> None:
    code = "from aa.client import deliveries; print(deliveries.COMPILED)"
    env = {**os.environ, "AA_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


#: Texts alike in length and bytes: the reader keeps the keys and text values of an event
#: for the next ones of a frame, and must never give one for another.
ALIKE = ["a", "b", "é", "ab", "ba", "aé", "\x00", "\x7f", "€", "a" * 31, "b" * 31, ""]


@needs_compiled
@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(
                st.sampled_from(ALIKE),
                st.sampled_from(ALIKE) | st.integers(0, 2) | st.binary(max_size=2),
                max_size=20,
            ),
            st.none() | st.sampled_from(ALIKE),
        ),
        max_size=12,
    )
)
def test_events_of_alike_texts_read_alike(items: list[Any]) -> None:
    events = [
        ([1], Event(values=v, type=t, meta=STAMP, id=f"e-{i}")) for i, (v, t) in enumerate(items)
    ]
    data = Connection().send_deliver(events) * 2
    with pytest.MonkeyPatch.context() as mp:
        compiled = read(data, True, mp)
        assert compiled_reads == [True, True]
        assert compiled == read(data, False, mp)
