"""A client's publish is stamped as a batch: the events' meta, their encoding (packed once
for all the batch's alike stamps) and the order of their deliveries are what stamping each
event on its own made."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from aa.mesh import Event
from aa.mesh.protocol import PatternSpec, pack, pack_with_meta, packed_event
from aa.router import Router, RouterConfig


class Key:
    """A subscriber key that keeps what it is given."""

    scope = None

    def __init__(self, name: str, got: list[tuple[str, Event]]) -> None:
        self.name = name
        self.got = got

    def deliver(self, event: Event) -> None:
        self.got.append((self.name, event))


@pytest.fixture
def router() -> Iterator[Router]:
    yield Router(RouterConfig(port=0))


def fresh(event: Event) -> bytes:
    """*event*'s encoding made now, from its fields alone."""
    return packed_event(Event.trusted(event.values, event.type, event.meta, event.id))


def test_a_batch_is_stamped_and_encoded_as_each_event_alone(router: Router) -> None:
    events = [
        Event(values={"x": 1}, id="a-1"),
        Event(values={"x": 2}, type="reading", meta={"unit": "C", "ttl": 99}, id="a-2"),
        Event(values={"x": 3, "when": [1.5, "s"]}, id="a-3"),
        Event(values={"x": 4}),
        Event(values={"x": 1}, id="a-1"),  # a retry: dropped
    ]
    out = router.dispatcher.accept(events, "c1", "127.0.0.1:9", "ann", "a")
    assert [e.values["x"] for e in out] == [1, 2, 3, 4]
    assert router.counters["duplicates"] == 1
    stamp = ["time", "client", "address", "router", "ttl", "path", "user"]
    assert [list(e.meta) for e in out] == [stamp, ["unit", *stamp], stamp, stamp]
    assert out[1].meta["ttl"] != 99  # the publisher's own router keys are replaced
    assert {e.meta["user"] for e in out} == {"ann"}
    assert len({id(e.meta) for e in out}) == 4  # each event its own map
    for e in out:
        assert e.packed is not None or e.meta.get("unit") == "C"
        assert packed_event(e) == fresh(e)


def test_without_a_user_the_stamp_has_no_user_key(router: Router) -> None:
    out = router.dispatcher.accept([Event(values={"x": 1}, id="b-1")], "c1", "a", None, "b")
    assert "user" not in out[0].meta
    assert packed_event(out[0]) == fresh(out[0])


def test_pack_with_meta_makes_what_packed_event_makes() -> None:
    meta: dict[str, Any] = {"time": None, "path": ["r1"], "ttl": 3}
    events = [
        Event.trusted({"x": i, "s": "é" * i, "l": [i, {"y": None}]}, t, dict(meta), f"e-{i}")
        for i, t in enumerate(["a", None, "ü" * 40])
    ]
    pack_with_meta(events, pack(meta))
    assert [e.packed for e in events] == [fresh(e) for e in events]


def test_pack_with_meta_leaves_what_it_cannot_encode_to_packed_event() -> None:
    bad = Event.trusted({"x": object()}, None, {}, "e-1")
    pack_with_meta([bad], pack({}))
    assert bad.packed is None


def test_deliveries_keep_subscription_order_across_buckets(router: Router) -> None:
    got: list[tuple[str, Event]] = []
    engine = router.engine
    # three subscribers, two patterns: each event goes to each in the order they subscribed
    engine.subscribe(Key("first", got), PatternSpec(source="x > 0"))
    engine.subscribe(Key("second", got), PatternSpec(source="x > 1"))
    engine.subscribe(Key("third", got), PatternSpec(source="x > 0"))
    events = [Event(values={"x": i}, id=f"c-{i}") for i in range(3)]
    router.dispatcher.accept(events, "c1", "a", None, "c")
    assert [(name, e.values["x"]) for name, e in got] == [
        ("first", 1),
        ("third", 1),
        ("first", 2),
        ("second", 2),
        ("third", 2),
    ]
