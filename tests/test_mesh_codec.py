"""The wire codec: frames in, messages out, types kept, bad frames refused clearly."""

from __future__ import annotations

import itertools
import random
import struct
from datetime import UTC, datetime, timedelta, timezone

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aa.mesh import (
    IN_PROGRESS,
    NEED_DATA,
    Connection,
    Event,
    FrameTooLarge,
    InvalidValue,
    MalformedFrame,
    UnknownMessage,
    event_from_json,
    event_to_json,
)
from aa.mesh.protocol import (
    MAX_FRAME_VALUES,
    Deliver,
    Hello,
    PatternSpec,
    Ping,
    Publish,
    Subscribe,
    codec,
)

VALUES = {
    "int": 3,
    "neg": -(2**63),
    "big": 2**64 - 1,
    "float": 2.0,
    "bool": True,
    "none": None,
    "str": "lab-1 ✓",
    "bytes": b"\x00\xff",
    "aware": datetime(2026, 11, 21, 7, 0, 0, 123456, tzinfo=UTC),
    "naive": datetime(2026, 11, 21, 7, 0, 0),
    "list": [1, "two", 3.0, [None]],
    "map": {"nested": {"deep": [b"x", False]}},
}


def roundtrip(msg):
    a, b = Connection(), Connection()
    b.receive_data(a.send(msg))
    out = b.next_message()
    assert b.next_message() is NEED_DATA
    return out


def test_every_value_type_survives_exactly():
    ev = Event(values=VALUES, type="reading", meta={"persist": True}, id="abc-1")
    got = roundtrip(Publish(seq=1, events=(ev,))).events[0]
    assert got.values == VALUES
    for name, value in VALUES.items():
        assert type(got.values[name]) is type(value), name
    assert got.values["naive"].tzinfo is None
    assert got.values["aware"].tzinfo is not None
    assert (got.id, got.type, got.meta) == ("abc-1", "reading", {"persist": True})


def test_aware_datetime_in_another_zone_keeps_its_instant():
    t = datetime(2026, 1, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    got = roundtrip(Publish(seq=1, events=(Event(values={"t": t}),))).events[0]
    assert got.values["t"] == t


def test_json_form_keeps_types_too():
    ev = Event(values=VALUES, type="t", id="x")
    back = event_from_json(event_to_json(ev))
    assert back.values == VALUES and all(type(back.values[k]) is type(v) for k, v in VALUES.items())


def test_byte_at_a_time_and_many_frames_in_one_chunk():
    a, b = Connection(), Connection()
    data = b"".join(a.send(Ping(token=i)) for i in range(50))
    for i in range(0, len(data), 7):
        b.receive_data(data[i : i + 7])
    assert [m.token for m in b.next_messages()] == list(range(50))


def test_a_frame_carries_a_batch_of_events():
    events = tuple(Event(values={"i": i}, id=f"e{i}") for i in range(1000))
    got = roundtrip(Publish(seq=9, events=events))
    assert [e.values["i"] for e in got.events] == list(range(1000))


def test_a_publish_frame_of_packed_events_is_the_frame_of_the_events():
    from aa.mesh import UsageError
    from aa.mesh.protocol import packed_event

    events = tuple(
        Event(values={"i": i, "at": datetime(2030, 1, 1, tzinfo=UTC)}, id=f"e{i}")
        for i in range(300)
    )
    a, b = Connection(), Connection()
    frame = a.send_publish(2**40, [packed_event(e) for e in events])
    assert frame == a.send(Publish(seq=2**40, events=events))  # byte for byte
    b.receive_data(frame)
    (got,) = b.next_messages()
    assert got.seq == 2**40 and got.events == events
    with pytest.raises(UsageError, match="over the cap"):
        Connection(max_frame=1000).send_publish(1, [packed_event(e) for e in events])


def test_oversized_frame_is_refused_before_it_is_buffered():
    b = Connection(max_frame=1024)
    b.receive_data(struct.pack(">I", 10_000_000))
    with pytest.raises(FrameTooLarge, match="over the cap"):
        b.next_message()
    with pytest.raises(FrameTooLarge):  # the codec stays broken: the owner must close
        b.next_message()


def frame(obj) -> bytes:
    payload = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(payload)) + payload


@pytest.mark.parametrize(
    "payload, error, text",
    [
        (b"\xc1garbage", MalformedFrame, "not valid msgpack"),
        (msgpack.packb([1, 2]), MalformedFrame, "must be a msgpack map"),
        (msgpack.packb({"kind": "teleport"}), UnknownMessage, "unknown message kind 'teleport'"),
        (msgpack.packb({"no": "kind"}), UnknownMessage, "unknown message kind None"),
        (msgpack.packb({"kind": "publish", "seq": "x", "events": []}), MalformedFrame, "int seq"),
        (
            msgpack.packb({"kind": "publish", "seq": 1, "events": [[None, None, {1: 2}, {}]]}),
            MalformedFrame,
            "must be str",
        ),
        (
            msgpack.packb({"kind": "publish", "seq": 1, "events": [[None, None, 3, {}]]}),
            MalformedFrame,
            "values must be a map",
        ),
        (
            msgpack.packb({"kind": "publish", "seq": 1, "events": [{"v": {}}]}),
            MalformedFrame,
            "must be an array",
        ),
        (msgpack.packb({"kind": "hello"}), MalformedFrame, "bad 'hello' message"),
        (
            msgpack.packb(
                {"kind": "subscribe", "sub_id": 1, "pattern": {"kernel": "lua", "source": "x"}}
            ),
            MalformedFrame,
            "unknown pattern kernel",
        ),
        (msgpack.packb({"kind": "hello", "client_id": "x" * 65}), MalformedFrame, "1 to 64"),
        # Every check of an event, in a publish and in a deliver frame (both decode events
        # on a fast path: each wrong field must still be caught and named).
        *[
            (msgpack.packb(wrap(ev)), MalformedFrame, text)
            for wrap in (
                lambda ev: {
                    "kind": "publish",
                    "seq": 1,
                    "events": [[None, None, {"a": 1}, {}], ev],
                },
                lambda ev: {
                    "kind": "deliver",
                    "items": [[[1], [None, None, {"a": 1}, {}]], [[1], ev]],
                },
            )
            for ev, text in (
                (["x" * 65, None, {"a": 1}, {}], "event id must be a str of 1 to 64"),
                (["", None, {"a": 1}, {}], "event id must be a str of 1 to 64"),
                ([7, None, {"a": 1}, {}], "event id must be a str"),
                (["e", 5, {"a": 1}, {}], "event type must be str or nil"),
                (["e", None, {"a": 1}, 3], "meta must be a map"),
                (["e", None, {"a": 1}, {"k": {1: 2}}], "must be str"),
                (
                    [
                        "e",
                        None,
                        {
                            "a": [
                                [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
                            ]
                        },
                        {},
                    ],
                    "nested deeper",
                ),
                (["e", None, {"a": 1}], "must be an array"),
            )
        ],
    ],
)
@pytest.mark.parametrize("stepped", [False, True], ids=["whole", "in steps"])
def test_bad_frames_raise_clear_errors(payload, error, text, stepped, monkeypatch):
    if stepped:  # every frame takes the path of large ones (decoded in steps)
        monkeypatch.setattr(codec, "STEP_ABOVE", 0)
    b = Connection()
    b.receive_data(struct.pack(">I", len(payload)) + payload)
    with pytest.raises(error, match=text):
        b.next_message()
    with pytest.raises(error):  # and stays broken
        b.next_message()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(100, 20_000), min_size=1, max_size=8), st.integers(0, 2**32))
def test_a_large_frame_decoded_in_steps_is_the_frame_decoded_whole(cuts, seed):
    """Any chunking of the bytes, decoded one step per call (`stepwise`): the same messages
    as decoding each frame whole, and `IN_PROGRESS` / `NEED_DATA` between."""
    rng = random.Random(seed)
    a = Connection()
    publish = Publish(
        seq=1,
        events=tuple(
            Event(
                values={"i": i, "pad": "é" * rng.randrange(300), "l": [i, {"k": None}]}, id=f"e{i}"
            )
            for i in range(400)
        ),
    )
    data = a.send(publish) + a.send(Ping(token=7)) + a.send(publish)
    assert len(data) > 2 * codec.STEP_ABOVE
    b = Connection()
    got, states, pos = [], set(), 0
    for cut in itertools.cycle(cuts):
        b.receive_data(data[pos : pos + cut])
        pos += cut
        while (msg := b.next_message(stepwise=True)) is not NEED_DATA:
            states.add(msg) if msg is IN_PROGRESS else got.append(msg)
        if pos >= len(data):
            break
    assert got == [publish, Ping(token=7), publish]
    assert states == {IN_PROGRESS} and b.buffered == 0


def test_a_large_frame_of_too_many_values_is_refused_early():
    b = Connection()
    payload = msgpack.packb(
        {"kind": "publish", "seq": 1, "events": [[None, "t", {"v": [[[]] * 10_000] * 1600}, {}]]}
    )
    b.receive_data(
        struct.pack(">I", len(payload)) + payload[: 2 * MAX_FRAME_VALUES]
    )  # the rest never needed
    with pytest.raises(MalformedFrame, match=f"more than {MAX_FRAME_VALUES} values"):
        while b.next_message() is not NEED_DATA:
            pass


def test_values_outside_the_model_are_refused_when_building_an_event():
    with pytest.raises(InvalidValue, match="set is not an event value"):
        Event(values={"s": {1, 2}})
    with pytest.raises(InvalidValue, match="64-bit"):
        Event(values={"n": 2**70})
    with pytest.raises(InvalidValue, match="map keys must be str"):
        Event(values={"m": {1: "x"}})


def test_subscribe_and_deliver_round_trip():
    spec = PatternSpec(format="script", source="forward()")
    msg = roundtrip(
        Subscribe(sub_id=4, pattern=spec, params={"threshold": 30}, history={"since": None})
    )
    assert (msg.sub_id, msg.pattern, msg.params) == (4, spec, {"threshold": 30})
    ev = Event(values={"a": 1}, id="x")
    got = roundtrip(Deliver(items=(((1, 2), ev),)))
    assert got.items[0][0] == (1, 2) and got.items[0][1].values == {"a": 1}


def test_hello_validates_on_construction():
    with pytest.raises(InvalidValue):
        Hello(client_id=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields",
    [
        {"values": {1: 2}},
        {"values": {"a": object()}},
        {"values": {"a": 2**70}},
        {"values": {}, "type": 3},
        {"values": {}, "id": ""},
        {"values": {}, "id": "x" * 65},
        {"values": {}, "meta": {"a": {1}}},
    ],
)
def test_event_checked_refuses_what_the_constructor_refuses(fields):
    """Publishers build events with `Event.checked` (the cheap path): same checks, same words."""
    with pytest.raises(InvalidValue) as by_constructor:
        Event(**fields)
    with pytest.raises(InvalidValue) as by_checked:
        Event.checked(**fields)
    assert str(by_checked.value) == str(by_constructor.value)
    good = Event.checked({"a": 1}, "t", {"m": 2}, "id-1")
    assert good == Event(values={"a": 1}, type="t", meta={"m": 2}, id="id-1")


@pytest.mark.parametrize("item", [[], {}], ids=["empty lists", "empty maps"])
def test_a_step_of_dense_msgpack_stays_small(item):
    """Each step decodes `STEP_BYTES` of a frame of empty lists or maps (every byte one to
    build), and pieces grow only for sparse data: empty lists hold no item, and once counted
    as sparse they grew the pieces to 64 KiB, ~10 ms of work in one step. (Pieces of small
    ints may grow: no object is built for them.)"""
    payload = msgpack.packb(
        {"kind": "publish", "seq": 1, "events": [[None, "t", {"v": [[item] * 10_000] * 100}, {}]]}
    )
    b = Connection()
    b.receive_data(struct.pack(">I", len(payload)) + payload)
    steps = 0
    with pytest.raises(MalformedFrame, match=f"more than {MAX_FRAME_VALUES} values"):
        while b.next_message(stepwise=True) is IN_PROGRESS:
            steps += 1
    assert steps >= MAX_FRAME_VALUES // codec.STEP_BYTES - 1  # ~1 value per byte: 4 KiB a step


_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**65), 2**65),
    st.floats(),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.sampled_from([set(), object(), 1j]),
)
_nested = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=2), st.integers(0, 3)), inner, max_size=3),
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(st.one_of(st.text(max_size=2), st.integers(0, 2)), _nested, max_size=4),
    st.integers(0, 20),
    st.integers(1, 5),
)
def test_the_stepped_check_of_nested_values_agrees_with_the_model(values, depth, per_step):
    """A large frame's events have their nested values checked a step at a time
    (`_check_steps`): refused exactly when the model's own check refuses, however deep."""
    from aa.mesh.values import _check_steps, _valid_map

    for _ in range(depth):  # each wrap two levels: past 16 the model refuses
        values = {"d": [values]}
    valid = _valid_map(values, 0)
    try:
        for _ in _check_steps(values, "values", per_step):
            pass
    except InvalidValue:
        assert not valid
    else:
        assert valid
    flat = _valid_map(values, 0, flat=True)
    assert flat is None or flat == valid
