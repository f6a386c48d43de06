"""A client's delivery path: how reading a router's delivery frames treats the program's
garbage collector (held off for the frames of one read, and always given back), and the
compiled hand-over of delivered events to the subscriptions, with its duplicate filter,
held to the Python reference (`aa.client.deliveries`) and `SeenIds`."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aa.client import deliveries
from aa.client.link import Link
from aa.mesh import Event, SeenIds
from aa.mesh.protocol import Connection, Message

try:
    from aa.client import _deliver
except ImportError:  # built without a compiler: the reference path alone runs
    _deliver = None  # type: ignore[assignment]

needs_compiled = pytest.mark.skipif(_deliver is None, reason="the module was not compiled")

STAMP = {
    "time": datetime(2026, 11, 28, 9, 13, 23, 610325, tzinfo=UTC),
    "router": "31a2278fab2b955d",
    "ttl": 64,
    "path": ["31a2278fab2b955d"],
}


def frame(n: int, first: int = 0) -> bytes:
    """A router's delivery frame of *n* events for subscription 1."""
    events = [
        ((1,), Event(values={"Seq": i, "Sensor": "lab-1"}, meta=STAMP, id=f"e-{i}"))
        for i in range(first, first + n)
    ]
    return Connection().send_deliver(events)


@pytest.fixture
def collector_on() -> Iterator[None]:
    """The collector on for the test, and as it was after."""
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not was:
            gc.disable()


async def test_no_collection_runs_while_a_frame_s_events_are_handed_over(
    collector_on: None,
) -> None:
    collections: list[int] = []
    got: list[Message] = []

    def counting(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    link = Link(lambda _link, msg: got.append(msg), lambda: None)
    data = frame(5000)
    gc.callbacks.append(counting)
    try:
        link.data_received(data)
    finally:
        gc.callbacks.remove(counting)
    assert len(got) == 1
    assert collections == []
    assert gc.isenabled()


async def test_the_collector_is_back_on_when_a_callback_raises(collector_on: None) -> None:
    def failing(_link: Link, msg: Message) -> None:
        raise RuntimeError("the program's own bug")

    link = Link(failing, lambda: None)
    with pytest.raises(RuntimeError):
        link.data_received(frame(3))
    assert gc.isenabled()


async def test_the_collector_is_back_on_after_a_bad_frame(collector_on: None) -> None:
    link = Link(lambda _link, msg: None, lambda: None)
    link.data_received(b"\x00\x00\x00\x03\x93\x01\x02")  # no message: the link is closed
    assert link.lost.done()
    assert gc.isenabled()


async def test_a_program_s_collector_left_off_stays_off() -> None:
    got: list[Message] = []
    link = Link(lambda _link, msg: got.append(msg), lambda: None)
    was = gc.isenabled()
    gc.disable()
    try:
        link.data_received(frame(3))
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()
    assert len(got) == 1


#: Checks of (sub id, event id, seconds later): few ids and subs, so pairs come again (and
#: some ids have more subs than the filter keeps in a tuple), and time steps around the
#: window's halves.
checks = st.lists(
    st.tuples(
        st.integers(1, 3) | st.integers(1, 12),
        st.sampled_from(["a", "b", "c", "d", "e", "f"]),
        st.sampled_from([0.0, 0.0, 0.1, 2.4, 2.5, 4.9, 5.0, 7.0]),
    ),
    max_size=80,
)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(checks, st.integers(2, 9) | st.just(200_000), st.sampled_from([1.0, 5.0, 10.0]))
def test_the_compiled_filter_answers_as_seen_ids_of_pairs(
    seq: list[tuple[int, str, float]], max_ids: int, max_age: float
) -> None:
    reference = SeenIds(max_ids=max_ids, max_age=max_age)
    compiled = _deliver.DeliveredIds(max_ids=max_ids, max_age=max_age)
    now = 100.0
    for sid, eid, later in seq:
        now += later
        assert compiled.check(sid, eid, now) == reference.check((sid, eid), now), (sid, eid, now)
        assert len(compiled) == len(reference)


@needs_compiled
def test_an_event_id_of_many_subscriptions_costs_what_the_reference_does() -> None:
    """A router that names one event id for 40,000 subscriptions (in one item, or over many
    frames): each check stays constant time, as in `SeenIds` of pairs, and the answers are
    the same (each pair once, its second copy dropped)."""
    items = [(tuple(range(40_000)), Event(values={}, id="e-1"))]
    cpu, sizes = [], []
    for compiled in (False, True):
        seen = (
            deliveries.delivered_ids(200_000, 60.0)
            if compiled
            else SeenIds(max_ids=200_000, max_age=60.0)
        )
        hand = deliveries.hand_over if compiled else deliveries._hand_over_reference
        log: list[tuple[int, str | None]] = []
        subs: dict[int, Any] = {7: Taker(7, log), 39_999: Taker(39_999, log)}
        start = time.thread_time()
        hand(items, subs, seen, 0.0)
        hand(items, subs, seen, 1.0)  # the second copy: dropped
        cpu.append(time.thread_time() - start)
        sizes.append((len(seen), log))
    assert sizes[1] == sizes[0] == (40_000, [(7, "e-1"), (39_999, "e-1")])
    assert cpu[1] < 4 * cpu[0] + 0.05, cpu


class Taker:
    """A subscription as `hand_over` sees one: what it was handed, in order."""

    def __init__(self, sid: int, log: list[tuple[int, str | None]]) -> None:
        self.sid = sid
        self.log = log

    def deliver(self, event: Event) -> None:
        self.log.append((self.sid, event.id))


def frames_of(spec: list[list[tuple[list[int], str | None, bool]]]) -> list[list[Any]]:
    return [
        [
            (tuple(sids), Event(values={}, meta={"historical": True} if old else {}, id=eid))
            for sids, eid, old in items
        ]
        for items in spec
    ]


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.lists(st.integers(1, 4), max_size=3),
                st.none() | st.sampled_from(["a", "b", "c"]),
                st.booleans(),
            ),
            max_size=6,
        ),
        max_size=5,
    )
)
def test_the_compiled_hand_over_delivers_as_the_reference(
    spec: list[list[tuple[list[int], str | None, bool]]],
) -> None:
    # Subscription 4 is gone (unsubscribed): its events are dropped, its pairs still noted.
    logs: list[list[tuple[int, str | None]]] = []
    for hand_over, seen in [
        (_deliver.hand_over, _deliver.DeliveredIds(max_ids=100, max_age=60.0)),
        (deliveries._hand_over_reference, SeenIds(max_ids=100, max_age=60.0)),
    ]:
        log: list[tuple[int, str | None]] = []
        subs = {sid: Taker(sid, log) for sid in (1, 2, 3)}
        for at, items in enumerate(frames_of(spec)):
            hand_over(items, subs, seen, float(at))
        logs.append(log)
    assert logs[0] == logs[1]


async def test_a_second_copy_of_a_live_event_reaches_its_subscription_once() -> None:
    from aa.client import AsyncClient

    client = AsyncClient("127.0.0.1:1")  # never connected: its delivery path alone
    log: list[tuple[int, str | None]] = []
    client._subs = {1: Taker(1, log), 2: Taker(2, log)}  # type: ignore[dict-item]
    link = Link(lambda _link, msg: client._on_message(msg), lambda: None)
    data = frame(3)  # e-0, e-1, e-2 for subscription 1
    again = Connection().send_deliver(
        [((1, 2), Event(values={}, meta=STAMP, id="e-1")), ((2,), Event(values={}, id=None))]
    )
    link.data_received(data + data + again)
    assert log == [(1, "e-0"), (1, "e-1"), (1, "e-2"), (2, "e-1"), (2, None)]
