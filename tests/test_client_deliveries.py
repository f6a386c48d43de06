"""A client's delivery path: how reading a router's delivery frames treats the program's
garbage collector (held off for the frames of one read, and always given back)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from aa.client.link import Link
from aa.mesh import Event
from aa.mesh.protocol import Connection, Message

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
