"""The pure part of going round a congested link (`aa.mesh.detour`): for whom a copy is,
which neighbours reach them, and the directed group on the wire."""

from __future__ import annotations

import pytest

from aa.mesh import (
    Connection,
    Detours,
    Event,
    Flood,
    Interest,
    InterestFilter,
    MalformedFrame,
    MeshInterests,
    PeerHello,
    detour_targets,
)
from aa.mesh.protocol import MAX_GROUP_TO, FloodGroup

HOT = Interest.of([InterestFilter(type="hot")])
#: a - b - d - e and a - c - d: two ways from a to d; e and d want hot events.
SHAPE = {"a": "bc", "b": "ad", "c": "ad", "d": "bce", "e": "d"}


def view() -> MeshInterests:
    v = MeshInterests()
    for rid, peers in SHAPE.items():
        v.put(rid, peers, HOT if rid in "de" else Interest.NOTHING)
    return v


def test_a_copy_is_for_the_wanting_routers_below_the_child() -> None:
    v = view()
    assert v.forward("a", "a", None, Event(values={}, type="hot")) == ["b"]
    assert detour_targets(v, "a", "b", Event(values={}, type="hot")) == ["d", "e"]
    assert detour_targets(v, "a", "b", Event(values={}, type="cold")) == []
    assert detour_targets(v, "a", "zz", Event(values={}, type="hot")) is None


def test_the_way_round_avoids_the_congested_link_and_the_path() -> None:
    d = Detours(view())
    assert d.first_hops("a", ["d", "e"], blocked=("a",), avoid={"b"}) == {"c": ["d", "e"]}
    assert d.first_hops("a", ["d", "e"], blocked=("a",), avoid=()) == {"b": ["d", "e"]}
    assert d.first_hops("a", ["d"], blocked=("c",), avoid={"b"}) is None  # no way round
    assert d.first_hops("c", ["e"], blocked=("a", "c"), avoid=()) == {"d": ["e"]}


def test_the_plans_follow_the_view() -> None:
    v = view()
    d = Detours(v)
    assert d.first_hops("a", ["d"], blocked=(), avoid={"b"}) == {"c": ["d"]}
    v.put("c", "a", Interest.NOTHING)  # c drops its link with d
    assert d.first_hops("a", ["d"], blocked=(), avoid={"b"}) is None


def roundtrip(msg: Flood) -> Flood:
    sender, receiver = Connection(), Connection()
    receiver.receive_data(sender.send(msg))
    got = receiver.next_message()
    assert isinstance(got, Flood)
    return got


def test_a_directed_group_crosses_the_wire_and_a_plain_one_is_unchanged() -> None:
    ev = Event(values={"x": 1}, type="hot", id="e1")
    directed = FloodGroup.encode([ev], ttl=5, path=["a"], to=["d", "e"])
    plain = FloodGroup.encode([ev], ttl=5, path=["a"])
    got = roundtrip(Flood(groups=[directed, plain])).groups
    assert got[0].to == ("d", "e") and got[1].to == ()
    assert plain.to_wire() == [5, ("a",), ("e1",), plain.blob]  # four elements, as before


@pytest.mark.parametrize("to", [[], "d", [1], ["x" * 300], ["r"] * (MAX_GROUP_TO + 1)])
def test_a_bad_to_makes_the_frame_malformed(to: object) -> None:
    ev = Event(values={}, id="e1")
    blob = FloodGroup.encode([ev], ttl=5, path=["a"]).blob
    with pytest.raises(MalformedFrame):
        Flood.from_wire({"kind": "flood", "groups": [[5, ["a"], ["e1"], blob, to]]})


def test_the_hello_says_whether_a_router_reads_directed_groups() -> None:
    assert "detours" not in PeerHello(router_id="r1").to_wire()  # an older router's hello
    assert PeerHello(router_id="r1", detours=True).to_wire()["detours"] is True
