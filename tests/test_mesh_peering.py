"""Router-to-router messages through the frame codec, and beacons."""

from __future__ import annotations

import msgpack
import pytest

from aa.mesh.beacon import BEACON_MAGIC, MAX_BEACON_BYTES, Beacon, RouterInfo, decode_beacon, encode_beacon
from aa.mesh.codec import Connection, pack
from aa.mesh.errors import InvalidValue, MalformedFrame
from aa.mesh.event import META_PATH, META_TTL, Event
from aa.mesh.flood import FloodRules
from aa.mesh.peering import MAX_KNOWN_ROUTERS, Control, Flood, KnownRouter, PeerHello, PeerRouters
from aa.mesh.peers import Source


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
        routers=(KnownRouter(peer="10.0.0.2:7447", router_id="r2", client="10.0.0.2:7448", name="b"),),
    )
    assert round_trip(hello) == hello


def test_peer_routers_round_trip_and_cap() -> None:
    msg = PeerRouters(routers=[KnownRouter(peer=f"10.0.{i // 250}.{i % 250 + 1}:7447") for i in range(5)])
    assert round_trip(msg) == msg
    too_many = [{"peer": "10.0.0.1:1"}] * (MAX_KNOWN_ROUTERS + 1)
    with pytest.raises(MalformedFrame):
        raw_frame({"kind": "peer-routers", "routers": too_many}).next_message()


def test_flood_round_trip() -> None:
    ev = Event(values={"T": 101}, id="e1", meta={META_TTL: 15, META_PATH: ["r1", "r2"]})
    got = round_trip(Flood(events=[ev]))
    assert isinstance(got, Flood) and got.events == (ev,)


@pytest.mark.parametrize(
    "event",
    [
        [None, None, {}, {"ttl": 3, "path": ["r1"]}],  # no id
        ["e1", None, {}, {"path": ["r1"]}],  # no ttl
        ["e1", None, {}, {"ttl": 3}],  # no path
        ["e1", None, {}, {"ttl": 3, "path": []}],
        ["e1", None, {}, {"ttl": "3", "path": ["r1"]}],
        ["e1", None, {}, {"ttl": 3, "path": ["r1"] * 1000}],
        ["e1", None, "nope", {}],
        {"i": "e1", "v": {}},  # the old map form
    ],
)
def test_flood_from_peer_is_checked(event: object) -> None:
    with pytest.raises(MalformedFrame):
        raw_frame({"kind": "flood", "events": [event]}).next_message()


def test_control_round_trip_and_forwarding() -> None:
    msg = Control(id="c1", ttl=64, path=("r1",), topic="quench.prototype", body={"pattern": "x > 1"}, to="client-7")
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
        raw_frame({"kind": "peer-hello", "router_id": "r1", "routers": [{"peer": 5}]}).next_message()


# -- beacons --------------------------------------------------------------------------------


def test_beacon_round_trip_is_small() -> None:
    b = Beacon(router_id="0123456789abcdef", name="lab router", peer="10.0.0.1:7447", client="10.0.0.1:7448")
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
    assert (info.peer, info.client, info.source) == ("10.0.0.5:7447", "10.0.0.5:7448", Source.DISCOVERED)
    fixed = RouterInfo.from_beacon(Beacon(router_id="r1", peer="10.9.9.9:1"), sender_host="10.0.0.5", via="zeroconf")
    assert fixed.peer == "10.9.9.9:1" and fixed.client is None
    assert RouterInfo(peer="h:1", via="configured").source is Source.CONFIGURED
