"""Router-to-router messages through the frame codec; how a router acts on flood groups a
peer sends (duplicates dropped unread, partly seen groups, bad blobs, packing once, the frame
cap); and beacons."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import UTC
from typing import Any

import msgpack
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from support import line, mesh, wait_for
from support.meshes import FAST

from aa.mesh import (
    META_PATH,
    META_TTL,
    Beacon,
    Event,
    FloodRules,
    InvalidValue,
    MalformedFrame,
    RouterInfo,
    Source,
    UsageError,
)
from aa.mesh.beacon import BEACON_MAGIC, MAX_BEACON_BYTES, decode_beacon, encode_beacon
from aa.mesh.protocol import (
    MAX_GROUP_EVENTS,
    MAX_KNOWN_ROUTERS,
    MESH_PROTOCOL_VERSION,
    Connection,
    Control,
    Error,
    Flood,
    FloodGroup,
    KnownRouter,
    Message,
    PeerHello,
    PeerRouters,
    event_from_wire,
    pack,
    unpack,
)
from aa.router import Router, RouterConfig


def round_trip(msg: object) -> object:
    a, b = Connection(), Connection()
    b.receive_data(a.send(msg))  # type: ignore[arg-type]
    return b.next_message()


def raw_frame(data: dict) -> Connection:
    payload = pack(data)
    c = Connection()
    c.receive_data(len(payload).to_bytes(4, "big") + payload)
    return c


def test_peer_hello_round_trip() -> None:
    hello = PeerHello(
        router_id="r1",
        name="lab",
        peer="10.0.0.1:7447",
        client="10.0.0.1:7448",
        routers=(
            KnownRouter(peer="10.0.0.2:7447", router_id="r2", client="10.0.0.2:7448", name="b"),
        ),
    )
    assert round_trip(hello) == hello
    assert round_trip(PeerHello(router_id="r1", keepalive=5)).keepalive == 5.0


@pytest.mark.parametrize("keepalive", [0, -1, 3601, float("nan"), float("inf"), True, "5"])
def test_a_peer_hello_with_a_bad_keepalive_is_refused(keepalive: Any) -> None:
    with pytest.raises(InvalidValue, match="keepalive"):
        PeerHello(router_id="r1", keepalive=keepalive)


async def test_routers_with_different_keepalives_keep_their_link() -> None:
    """A router that expects a keep-alive every 0.1 s does not cut the link to one that
    sends one a second: its hello says so, and the link waits three of the longer. (The
    quick router sends its summaries more often than its keep-alive, so it never pings and
    hears only the slow router's own keep-alives.)"""
    slow = dataclasses.replace(FAST, keepalive=1.0, info_interval=30.0)
    quick = dataclasses.replace(FAST, keepalive=0.1, info_interval=0.05)
    async with (
        Router(RouterConfig(port=0, name="slow", mesh=slow)) as a,
        Router(RouterConfig(port=0, name="quick", mesh=quick)) as b,
    ):
        b.mesh.add_peer(a.endpoint)
        await wait_for(lambda: a.id in b.mesh.links and b.id in a.mesh.links)
        link = b.mesh.links[a.id]
        # Quiet for several of the quick router's link timeouts (0.3 s), the same link lives.
        await wait_for(lambda: time.monotonic() - link.last_heard > 0.5, timeout=10)
        await wait_for(
            lambda: link.since is not None and time.monotonic() - link.since > 2.5, timeout=10
        )
        assert b.mesh.links.get(a.id) is link and link.state == "up"


def test_peer_routers_round_trip_and_cap() -> None:
    msg = PeerRouters(
        routers=[KnownRouter(peer=f"10.0.{i // 250}.{i % 250 + 1}:7447") for i in range(5)]
    )
    assert round_trip(msg) == msg
    too_many = [{"peer": "10.0.0.1:1"}] * (MAX_KNOWN_ROUTERS + 1)
    with pytest.raises(MalformedFrame):
        raw_frame({"kind": "peer-routers", "routers": too_many}).next_message()


def _group(*ids: str, ttl: int = 15, path: tuple[str, ...] = ("r1", "r2")) -> FloodGroup:
    return FloodGroup.encode(
        [Event(values={"T": 101, "i": i}, id=i) for i in ids], ttl=ttl, path=path
    )


def test_flood_round_trip() -> None:
    g = _group("e1", "e2")
    got = round_trip(Flood(groups=[g, _group("e3", ttl=3, path=("r9",))]))
    assert isinstance(got, Flood) and got.groups[0] == g and got.event_count == 3
    events = got.groups[0].decode()
    assert [(e.id, e.values["i"], e.meta) for e in events] == [
        ("e1", "e1", {META_TTL: 15, META_PATH: ["r1", "r2"]}),
        ("e2", "e2", {META_TTL: 15, META_PATH: ["r1", "r2"]}),
    ]


def test_group_header_is_authoritative_for_ttl_and_path() -> None:
    # The blob keeps what the origin stamped; a relay forwards it unchanged under a new header.
    ev = Event(values={}, id="e1", meta={META_TTL: 64, META_PATH: ["r1"], "time": "t"})
    g = FloodGroup.encode([ev], ttl=64, path=["r1"])
    relayed = FloodGroup.trusted(62, ["r1", "r2", "r3"], g.ids, g.blob)
    received = round_trip(Flood(groups=[relayed]))
    assert isinstance(received, Flood)
    (got,) = received.groups[0].decode(ttl=61, path=["r1", "r2", "r3", "r4"])
    assert got.meta == {META_TTL: 61, META_PATH: ["r1", "r2", "r3", "r4"], "time": "t"}


def test_group_split_halves_and_keeps_the_header() -> None:
    g = _group("a", "b", "c", ttl=9, path=("r1",))
    first, second = g.split()
    assert (first.ids, second.ids) == (("a",), ("b", "c"))
    assert [e.id for e in first.decode() + second.decode()] == ["a", "b", "c"]
    assert (second.ttl, second.path) == (9, ("r1",))
    with pytest.raises(UsageError):
        first.split()


GOOD_BLOB = pack([["e1", None, {}, {}]])


@pytest.mark.parametrize(
    "groups",
    [
        [["3", ["r1"], ["e1"], GOOD_BLOB]],  # ttl not an int
        [[None, ["r1"], ["e1"], GOOD_BLOB]],
        [[3, [], ["e1"], GOOD_BLOB]],  # empty path
        [[3, "r1", ["e1"], GOOD_BLOB]],  # path not a list
        [[3, ["r1"] * 1000, ["e1"], GOOD_BLOB]],  # path too long
        [[3, [7], ["e1"], GOOD_BLOB]],  # path entry not an id
        [[3, ["r1"], [], GOOD_BLOB]],  # no ids
        [[3, ["r1"], [5], GOOD_BLOB]],  # id not a str
        [[3, ["r1"], ["x" * 65], GOOD_BLOB]],  # id too long
        [[3, ["r1"], "e1", GOOD_BLOB]],  # ids not a list
        [[3, ["r1"], ["e"] * (MAX_GROUP_EVENTS + 1), GOOD_BLOB]],
        [[3, ["r1"], ["e1"], [["e1", None, {}, {}]]]],  # events not a blob
        [[3, ["r1"], ["e1"], "blob"]],
        [[3, ["r1"], ["e1"]]],  # not four fields
        [{"ttl": 3}],
        "groups",
    ],
)
def test_flood_from_peer_is_checked(groups: object) -> None:
    with pytest.raises(MalformedFrame):
        raw_frame({"kind": "flood", "groups": groups}).next_message()


def test_the_old_flood_form_is_malformed() -> None:
    with pytest.raises(MalformedFrame):
        raw_frame(
            {"kind": "flood", "events": [["e1", None, {}, {"ttl": 3, "path": ["r1"]}]]}
        ).next_message()


@pytest.mark.parametrize(
    ("ids", "blob"),
    [
        (["e1"], b"\xc1"),  # not msgpack
        (["e1"], b"\x91"),  # truncated
        (["e1"], pack({"e1": 1})),  # not an array
        (["e1"], pack([["e1", None, {}]])),  # not an event
        (["e1"], pack([["e1", None, {"x": {1: 2}}, {}]])),  # outside the value model
        (["e1"], pack([[None, None, {}, {}]])),  # no id
        (["e1"], pack([["e2", None, {}, {}]])),  # another id
        (["e1", "e2"], pack([["e2", None, {}, {}], ["e1", None, {}, {}]])),  # another order
        (["e1", "e2"], pack([["e1", None, {}, {}]])),  # fewer events
        (["e1"], pack([["e1", None, {}, {}], ["e2", None, {}, {}]])),  # more events
    ],
)
def test_a_bad_blob_is_malformed_when_decoded(ids: list[str], blob: bytes) -> None:
    # The header is sound, so the frame decodes; the blob is only read when it is needed.
    msg = raw_frame({"kind": "flood", "groups": [[3, ["r1"], ids, blob]]}).next_message()
    assert isinstance(msg, Flood)
    with pytest.raises(MalformedFrame):
        msg.groups[0].decode()


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
    | st.binary(max_size=5)
    | st.datetimes(timezones=st.sampled_from([None, UTC]))
)


def _mostly(
    usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any], in_ten: int = 8
) -> st.SearchStrategy[Any]:
    """*usual* in *in_ten* draws out of ten, else *odd* (`one_of` draws its branches evenly)."""
    return st.integers(0, 9).flatmap(lambda k: usual if k < in_ten else odd)


# Mostly sound events, with now and then one thing wrong: a key that is no str, a nested or
# odd value, a type or id that is not one, a nil meta; and now and then no event at all.
_keys = _mostly(st.text(max_size=3), st.integers(0, 3) | st.binary(max_size=2), 9)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3),
    max_leaves=8,
)
_maps = st.dictionaries(_keys, _mostly(_scalars, _values, 9), max_size=5)
_events = st.tuples(
    _mostly(st.just("e1"), st.sampled_from(["e2", None, 7])),
    _mostly(st.sampled_from([None, "reading"]), st.integers(0, 1), 9),
    _maps,
    _mostly(_maps, st.none() | _values, 9),
).map(list)
_items = _mostly(_events, st.lists(_values, max_size=5) | _values, 9)


@given(item=_items)
@settings(max_examples=500, deadline=None)
def test_fast_decoding_accepts_exactly_what_the_full_check_does(item: Any) -> None:
    # `FloodGroup.decode` skips `event_from_wire` for flat events fresh from msgpack; it must
    # come to the same answer on anything a peer can send (bar the blob's ttl and path,
    # which it replaces unread).
    blob = pack([item])
    try:
        expected: Any = event_from_wire(_with_hop(unpack(blob)[0]))
        if expected.id != "e1":
            raise MalformedFrame("another id")
        expected.meta.update({META_TTL: 4, META_PATH: ["r1", "r2"]})
    except MalformedFrame:
        expected = MalformedFrame
    try:
        got: Any = FloodGroup(ttl=5, path=("r1",), ids=("e1",), blob=blob).decode(
            ttl=4, path=["r1", "r2"]
        )[0]
    except MalformedFrame:
        got = MalformedFrame
    event("refused" if expected is MalformedFrame else "accepted")
    assert got == expected


def _with_hop(item: Any) -> Any:
    if type(item) is list and len(item) == 4 and type(item[3]) is dict:
        item[3].update({META_TTL: 4, META_PATH: None})
    return item


@pytest.mark.parametrize(
    "fields",
    [
        {"ttl": 1.0, "path": ["r1"], "ids": ["e"], "blob": b""},
        {"ttl": 1, "path": ["r1"], "ids": ["e"], "blob": bytearray()},
        {"ttl": 1, "path": ["r1"], "ids": ("e", None), "blob": b""},
    ],
)
def test_flood_group_validates(fields: dict) -> None:
    with pytest.raises(InvalidValue):
        FloodGroup(**fields)
    with pytest.raises(InvalidValue):
        Flood(groups=[fields])  # type: ignore[list-item]


def test_control_round_trip_and_forwarding() -> None:
    msg = Control(
        id="c1",
        ttl=64,
        path=("r1",),
        topic="quench.prototype",
        body={"pattern": "x > 1"},
        to="client-7",
    )
    assert round_trip(msg) == msg
    hop = FloodRules("r2").receive(msg.id, msg.ttl, msg.path, 0.0)
    assert hop is not None
    fwd = msg.forwarded(hop.ttl, hop.path)
    assert (fwd.ttl, fwd.path, fwd.body, fwd.to) == (63, ("r1", "r2"), msg.body, "client-7")


@pytest.mark.parametrize(
    "fields",
    [
        {"id": "", "ttl": 1, "path": ["r1"], "topic": "t"},
        {"id": "c", "ttl": "1", "path": ["r1"], "topic": "t"},
        {"id": "c", "ttl": 1, "path": [], "topic": "t"},
        {"id": "c", "ttl": 1, "path": ["r1"], "topic": ""},
        {"id": "c", "ttl": 1, "path": ["r1"], "topic": "t", "body": {"x": object()}},
        {"id": "c", "ttl": 1, "path": ["r1"], "topic": "t", "body": []},
    ],
)
def test_control_validates(fields: dict) -> None:
    with pytest.raises(InvalidValue):
        Control(**fields)


def test_bad_hello_is_malformed() -> None:
    with pytest.raises(MalformedFrame):
        raw_frame({"kind": "peer-hello", "router_id": "r1", "peer": "nohost"}).next_message()
    with pytest.raises(MalformedFrame):
        raw_frame(
            {"kind": "peer-hello", "router_id": "r1", "routers": [{"peer": 5}]}
        ).next_message()


# -- a router acting on flood groups from a peer ---------------------------------------------


class FakePeer:
    """A peer router played by the test: says hello to a router, then sends what it is told
    and keeps what it gets."""

    def __init__(self, router_id: str = "fake") -> None:
        self.id = router_id
        self.conn = Connection()
        self.got: list[Message] = []
        self.closed = asyncio.Event()

    async def connect(self, router: Router) -> None:
        self.reader, self.writer = await asyncio.open_connection(*router.address)
        self.writer.write(self.conn.send(PeerHello(router_id=self.id, name=self.id)))
        self._task = asyncio.create_task(self._read())
        await wait_for(lambda: self.id in router.mesh.links)

    async def _read(self) -> None:
        while data := await self.reader.read(65536):
            self.conn.receive_data(data)
            self.got.extend(self.conn.next_messages())
        self.closed.set()

    def send(self, *groups: FloodGroup) -> None:
        self.writer.write(self.conn.send(Flood(groups=groups)))

    async def aclose(self) -> None:
        self.writer.close()
        await self._task


def _events(*ids: str, **values: Any) -> list[Event]:
    return [Event(values={"n": i, **values}, id=eid) for i, eid in enumerate(ids)]


async def test_a_group_of_seen_ids_is_dropped_without_reading_its_events() -> None:
    async with mesh(2, line(2)) as (a, b):
        got: list[Event] = []
        b.subscribe("True", got.append)
        ev = a.publish({"first": True})
        assert ev is not None and ev.id is not None
        fake = FakePeer()
        await fake.connect(a)
        # Every id seen already: the blob, which would not even decode, is never read.
        fake.send(FloodGroup(ttl=5, path=("fake",), ids=(ev.id,), blob=b"\xc1\xc1"))
        fake.send(FloodGroup.encode(_events("fresh-1"), ttl=5, path=["fake"]))
        await wait_for(lambda: [e.id for e in got] == [ev.id, "fresh-1"])
        assert a.mesh.counters["duplicates"] == 1 and a.mesh.counters["peer_errors"] == 0
        assert "fake" in a.mesh.links and not fake.closed.is_set()
        assert a.counters["dispatched"] == 2
        await fake.aclose()


async def test_a_partly_seen_group_dispatches_and_forwards_only_the_fresh_events() -> None:
    async with mesh(2, line(2)) as (a, b):
        got: list[Event] = []
        b.subscribe("True", got.append)
        ev = a.publish({"first": True})
        assert ev is not None and ev.id is not None
        await wait_for(lambda: len(got) == 1)
        fake = FakePeer()
        await fake.connect(a)
        fake.send(FloodGroup.encode(_events("f1", ev.id, "f2"), ttl=10, path=["fake"]))
        await wait_for(lambda: len(got) == 3)
        assert [e.id for e in got] == [ev.id, "f1", "f2"]
        assert a.mesh.counters["duplicates"] == 1 and a.counters["dispatched"] == 3
        # b got a group re-encoded without the duplicate: two events came in, none dropped.
        assert b.mesh.counters["events_in"] == 3 and b.mesh.counters["duplicates"] == 0
        assert got[2].meta[META_PATH] == ["fake", a.id, b.id] and got[2].meta[META_TTL] == 8
        assert got[2].values == {"n": 2}
        await fake.aclose()


async def test_a_group_whose_events_do_not_match_its_ids_closes_the_link() -> None:
    async with mesh(2, line(2)) as (a, b):
        got: list[Event] = []
        b.subscribe("True", got.append)
        fake = FakePeer()
        await fake.connect(a)
        good = FloodGroup.encode(_events("x2"), ttl=5, path=["fake"])
        fake.send(FloodGroup(ttl=5, path=("fake",), ids=("x1",), blob=good.blob))
        async with asyncio.timeout(5):
            await fake.closed.wait()
        assert any(type(m) is Error and m.code == "malformed" for m in fake.got)  # type: ignore[attr-defined]
        assert a.mesh.counters["peer_errors"] == 1 and "fake" not in a.mesh.links
        # The ids of a bad group are not recorded as seen: their events still get through.
        assert a.publish({"again": 1}, id="x1") is not None
        await wait_for(lambda: [e.id for e in got] == ["x1"])
        assert a.counters["dispatched"] == 1


async def test_a_router_of_the_one_by_one_flood_protocol_is_refused_at_the_hello() -> None:
    async with mesh(1) as (a,):
        reader, writer = await asyncio.open_connection(*a.address)
        conn = Connection()
        writer.write(conn.send(PeerHello(router_id="old", protocol=MESH_PROTOCOL_VERSION - 1)))
        got: list[Message] = []
        async with asyncio.timeout(5):
            while data := await reader.read(65536):
                conn.receive_data(data)
                got.extend(conn.next_messages())
        writer.close()
        assert any(type(m) is Error and m.code == "protocol" for m in got)  # type: ignore[attr-defined]
        assert "old" not in a.mesh.links


async def test_events_are_packed_once_at_the_origin_and_never_by_relays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    packed: list[int] = []
    encode = FloodGroup.encode.__func__  # type: ignore[attr-defined]

    def counting(cls: type, events: list[Event], **kwargs: Any) -> FloodGroup:
        packed.append(len(events))
        return encode(cls, events, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(FloodGroup, "encode", classmethod(counting))
    # r0 has three peers; r3 relays to r4.
    async with mesh(5, [(0, 1), (0, 2), (0, 3), (3, 4)]) as routers:
        for i in range(20):
            routers[0].publish({"i": i})
        await wait_for(lambda: all(r.counters["dispatched"] == 20 for r in routers))
        assert packed == [20]
        assert (
            routers[0].mesh.counters["events_out"] == 60
            and routers[3].mesh.counters["events_out"] == 20
        )


async def test_frames_over_the_cap_are_split_and_an_event_too_large_is_dropped() -> None:
    async with mesh(2, line(2)) as (a, b):
        got: list[Event] = []
        b.subscribe("True", got.append)
        a.mesh.links[b.id].codec.max_frame = 16 * 1024
        frames = a.mesh.counters["frames_out"]
        for i in range(40):
            a.publish({"i": i, "pad": "x" * 1000})  # one batch, one 40 KiB group
        await wait_for(lambda: len(got) == 40)
        assert [e.values["i"] for e in got] == list(range(40))
        assert a.mesh.counters["frames_out"] - frames >= 3 and a.mesh.counters["events_out"] == 40
        a.publish({"big": "x" * 20_000})
        last = a.publish({"small": True})
        assert last is not None
        await wait_for(lambda: got[-1].id == last.id)
        assert len(got) == 41 and a.mesh.counters["dropped_large"] == 1
        assert b.counters["dispatched"] == 41


# -- beacons --------------------------------------------------------------------------------


def test_beacon_round_trip_is_small() -> None:
    b = Beacon(
        router_id="0123456789abcdef",
        name="lab router",
        peer="10.0.0.1:7447",
        client="10.0.0.1:7448",
    )
    data = encode_beacon(b)
    assert data.startswith(BEACON_MAGIC) and len(data) < 120
    assert decode_beacon(data) == b


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello",
        BEACON_MAGIC,
        BEACON_MAGIC + b"\x02" + msgpack.packb({"i": "r"}),  # a future format
        BEACON_MAGIC + b"\x01\xc1",  # not msgpack
        BEACON_MAGIC + b"\x01" + msgpack.packb([1, 2]),
        BEACON_MAGIC + b"\x01" + msgpack.packb({"i": "r1", "p": "bad"}),
        BEACON_MAGIC + b"\x01" + msgpack.packb({"p": "10.0.0.1:1"}),
        BEACON_MAGIC + b"\x01" + b"\x00" * MAX_BEACON_BYTES,
    ],
)
def test_garbage_is_not_a_beacon(data: bytes) -> None:
    with pytest.raises(MalformedFrame):
        decode_beacon(data)


def test_router_info_fills_unspecified_hosts() -> None:
    b = Beacon(router_id="r1", peer="0.0.0.0:7447", client="0.0.0.0:7448")
    info = RouterInfo.from_beacon(b, sender_host="10.0.0.5", via="broadcast")
    assert (info.peer, info.client, info.source) == (
        "10.0.0.5:7447",
        "10.0.0.5:7448",
        Source.DISCOVERED,
    )
    fixed = RouterInfo.from_beacon(
        Beacon(router_id="r1", peer="10.9.9.9:1"), sender_host="10.0.0.5", via="zeroconf"
    )
    assert fixed.peer == "10.9.9.9:1" and fixed.client is None
    assert RouterInfo(peer="h:1", via="configured").source is Source.CONFIGURED
