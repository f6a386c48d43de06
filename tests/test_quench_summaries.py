"""Quenching and interest routing as one mechanism: under interest routing a publisher's router
answers from the interest summaries it already holds, so a subscriber anywhere in the mesh is
heard of when its router's summary arrives, and nothing of quenching crosses a link. Real
routers over loopback sockets; nothing sleeps. (Å's flooded quenching, kept under
``--routing flood``: tests/test_quench_mesh.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from support import FAST, line, mesh, routing_by_interest, wait_for
from support.waits import patience

from aa.client import AsyncClient
from aa.mesh import Connection, Control, Event, Interest, InterestFilter
from aa.mesh.protocol import Error, Hello, Message, Quench, Quenched, QuenchNotice, Unquench
from aa.router import Router
from aa.router.quench import QUENCH_TOPIC, SUMMARY_SUB, summary_answers
from aa.router.quench import service as quench_service

SNOW = {"SnowDepthSensor": True, "SnowDepth": 50}


class Changes:
    """A quench callback that records (sub_id, router_id, interested)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bool]] = []

    def __call__(self, sub_id: str, router_id: str, interested: bool) -> None:
        self.seen.append((sub_id, router_id, interested))


def tap(routers: Sequence[Router]) -> list[Counter[str]]:
    """Per router, the control messages it receives from its links, by topic."""
    counts: list[Counter[str]] = []
    for r in routers:
        seen: Counter[str] = Counter()
        relay = r.mesh.relay
        inner = relay.receive_control

        def counting(
            link: Any, msg: Control, seen: Counter[str] = seen, inner: Any = inner
        ) -> None:
            seen[msg.topic] += 1
            inner(link, msg)

        relay.receive_control = counting  # type: ignore[method-assign]
        counts.append(seen)
    return counts


@pytest.mark.parametrize("routing", ["interest", "flood"])
async def test_a_subscriber_two_hops_away_is_heard_of_by_its_summary(routing: str) -> None:
    config = dataclasses.replace(FAST, routing=routing)
    async with (
        mesh(3, line(3), config=config) as rs,
        AsyncClient(rs[0].endpoint) as pub,
        AsyncClient(rs[2].endpoint) as sub_client,
    ):
        r1, _, r3 = rs
        topics = tap(rs)
        await wait_for(lambda: all(len(r.mesh.interests.table.view) == 3 for r in rs))
        if routing == "interest":
            await wait_for(lambda: routing_by_interest(rs))
        changes = Changes()
        q = await pub.quench(SNOW, changes, type="snow")
        assert not q.interested  # told at once: nobody in the mesh listens
        sub = await sub_client.subscribe('type == "snow" and SnowDepth > 10')
        start = time.monotonic()
        await q.wait_interested(timeout=patience())
        heard = time.monotonic() - start
        await sub.aclose()
        await q.wait_uninterested(timeout=patience())
        quench_msgs = sum(t[QUENCH_TOPIC] for t in topics)
        if routing == "interest":
            assert changes.seen == [(SUMMARY_SUB, r3.id, True), (SUMMARY_SUB, r3.id, False)]
            assert quench_msgs == 0  # only summaries told r1: no registration, report or keep-alive
            assert [r.quench.registrations() for r in rs[1:]] == [[], []]
            assert heard < patience(1.0)  # one summary flood over two hops
        else:  # Å's way: flooded registrations, each subscription reported by id
            assert changes.seen == [
                (f"{sub_client.client_id}#{sub.id}", r3.id, True),
                (f"{sub_client.client_id}#{sub.id}", r3.id, False),
            ]
            assert quench_msgs > 0
        assert r1.quench.counters["notices"] == 2


async def test_local_answers_stay_exact_and_remote_ones_follow_declared_needs() -> None:
    async with (
        mesh(2, line(2)) as (r1, r2),
        AsyncClient(r1.endpoint) as pub,
        AsyncClient(r2.endpoint) as sub_client,
    ):
        await wait_for(lambda: routing_by_interest([r1, r2]))
        changes = Changes()
        q = await pub.quench(SNOW, changes)
        narrow = await sub_client.subscribe("SnowDepth == 80")  # Å §4.4: never matches 50
        await sub_client.subscribe("Rain > 3")
        sent = r2.mesh.counters["interest_sent"]
        await wait_for(lambda: r2.mesh.counters["interest_sent"] > sent)
        await wait_for(lambda: r1.mesh.interests.listening_of(r2.id) == r2.mesh.interests.listening)
        assert not q.interested  # the summary arrived, and says no
        await sub_client.subscribe("SnowDepth == 80", needs=["SnowDepth"])
        await q.wait_interested(timeout=patience())
        assert changes.seen == [(SUMMARY_SUB, r2.id, True)]
        local = r1.subscribe("SnowDepthSensor == True")  # on the publisher's own router: by id
        await wait_for(lambda: len(q.interest) == 2)
        ((sub_id, router_id, _),) = changes.seen[1:]
        assert router_id == r1.id and sub_id != SUMMARY_SUB
        local.close()
        await wait_for(lambda: len(q.interest) == 1)
        assert narrow


async def test_interest_of_a_router_that_leaves_goes_with_its_summary() -> None:
    async with mesh(3, line(3)) as (r1, _, r3), AsyncClient(r1.endpoint) as pub:
        changes = Changes()
        q = await pub.quench(SNOW, changes)
        r3.subscribe("SnowDepth > 1")
        await q.wait_interested(timeout=patience())
        await r3.aclose()  # its summary is forgotten three of its intervals later
        await q.wait_uninterested(timeout=patience())
        assert changes.seen[-1] == (SUMMARY_SUB, r3.id, False)


def test_summary_answers_err_toward_someone_listening() -> None:
    snow = Event(values={"SnowDepth": 50, "Site": "a"}, type="snow")
    by_type = Interest.of([InterestFilter(type="snow")])
    named = Interest.of([InterestFilter.make(has=["SnowDepth"])])
    other_site = Interest.of([InterestFilter.make(eq=[("Site", "b")], has=["Site"])])
    assert summary_answers(by_type, snow) and summary_answers(named, snow)
    assert summary_answers(Interest.ANYTHING, snow)  # widened past its caps, or a catch-all
    assert not summary_answers(other_site, snow)
    assert not summary_answers(Interest.NOTHING, snow)
    assert not summary_answers(None, snow)  # a router we know nothing of


async def test_mentioned_only_narrows_local_answers_only() -> None:
    async with mesh(2, line(2)) as (r1, r2), AsyncClient(r1.endpoint) as pub:
        strict = await pub.quench({"Symbol": "ABB"}, mentioned_only=True)
        r1.subscribe("True")  # a catch-all here: exactly known not to name Symbol
        r2.subscribe('type == "quote" or True')  # there: its summary says "anything"
        await strict.wait_interested(timeout=patience())
        assert strict.interest == {(r2.id, SUMMARY_SUB)}


async def test_publisher_fail_over_keeps_remote_interest_without_flapping() -> None:
    async with mesh(3, [(0, 2), (1, 2)]) as (r0, r1, r2):
        r2.subscribe("SnowDepth > 1")
        pub = AsyncClient([r0.endpoint, r1.endpoint])
        pub.quench_stale_grace = 0.5
        await pub.connect()
        try:
            changes = Changes()
            q = await pub.quench(SNOW, changes)
            await q.wait_interested(timeout=patience())
            await r0.aclose()  # the publisher's router goes: it fails over to r1
            await wait_for(
                lambda: pub.connected and pub.router is not None and pub.router[0] == r1.id
            )
            await wait_for(lambda: any(reg["owned"] for reg in r1.quench.registrations()))
            r1.subscribe("SnowDepthSensor")
            await wait_for(lambda: len(q.interest) == 2)
            assert changes.seen[0] == (SUMMARY_SUB, r2.id, True)
            assert [c for c in changes.seen if not c[2]] == []  # r2's was confirmed by r1
        finally:
            await pub.aclose()


class _QuenchWire:
    """A publisher's raw connection: quench and unquench as fast as it likes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.codec = Connection()
        self.got: list[Message] = []

    @classmethod
    async def open(cls, endpoint: str, client_id: str) -> _QuenchWire:
        host, _, port = endpoint.rpartition(":")
        wire = cls(*await asyncio.open_connection(host, int(port)))
        wire.writer.write(wire.codec.send(Hello(client_id=client_id)))
        return wire

    async def send(self, *messages: Message) -> None:
        self.writer.write(b"".join(self.codec.send(m) for m in messages))
        await self.writer.drain()

    async def until(self, done: Any) -> None:
        async with asyncio.timeout(patience(10.0)):
            while not done(self.got):
                data = await self.reader.read(1 << 16)
                assert data, "the router closed the connection"
                self.codec.receive_data(data)
                self.got += self.codec.next_messages()

    def quenched(self) -> int:
        return sum(type(m) is Quenched for m in self.got)

    def interest(self) -> set[tuple[str, str]]:
        held: set[tuple[str, str]] = set()
        for m in self.got:
            if type(m) is QuenchNotice:
                for rid, sub, on in m.changes:
                    (held.add if on else held.discard)((rid, sub))
            elif type(m) is Quenched:
                held.clear()  # a registration anew: what holds is told again
        return held


async def test_a_publisher_registering_again_and_again_costs_no_summary_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks = [0]

    def counted(interest: Interest | None, prototype: Event) -> bool:
        checks[0] += 1
        return summary_answers(interest, prototype)

    monkeypatch.setattr(quench_service, "summary_answers", counted)
    async with mesh(3, line(3)) as (r1, r2, r3):
        await wait_for(lambda: routing_by_interest([r1, r2, r3]))
        wire = await _QuenchWire.open(r1.endpoint, "looping-publisher")
        try:
            register = Quench(reg=1, values=SNOW, type="snow")
            await wire.send(register)
            await wire.until(lambda got: wire.quenched() == 1)
            assert checks[0] == 2  # one per other router: r2's summary and r3's
            for _ in range(50):  # the same registration again, in a loop
                await wire.send(register)
            await wire.until(lambda got: wire.quenched() == 51)
            for _ in range(50):  # and again after unquenching it each time
                await wire.send(Unquench(reg=1), register)
            await wire.until(lambda got: wire.quenched() == 101)
            assert checks[0] == 2  # answered from the last answer: no summary changed
            assert r1.quench.counters["registered_again"] == 50
            assert not any(type(m) is Error for m in wire.got)

            # A summary that changes is checked again, and the answers still follow it.
            r3.subscribe("SnowDepth > 1")
            await wire.until(lambda got: wire.interest() == {(r3.id, SUMMARY_SUB)})
            before = checks[0]
            await wire.send(Unquench(reg=1), register)
            await wire.until(lambda got: wire.quenched() == 102)
            await wire.until(lambda got: wire.interest() == {(r3.id, SUMMARY_SUB)})
            await wire.send(register)
            await wire.until(lambda got: wire.quenched() == 103)
            await wire.until(lambda got: wire.interest() == {(r3.id, SUMMARY_SUB)})
            assert checks[0] - before <= 2  # at most one more round, while nothing changes
        finally:
            wire.writer.close()


async def test_unquenching_and_registering_again_scans_no_subscription(
    router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks = [0]
    matches = router.quench._matches

    def counted(reg: Any, key: Any) -> bool | None:
        checks[0] += 1
        return matches(reg, key)

    monkeypatch.setattr(router.quench, "_matches", counted)
    for i in range(100):
        router.subscribe(f"SnowDepth > {i}")  # 50 of them let SnowDepth 50 through
    wire = await _QuenchWire.open(router.endpoint, "looping-publisher")
    try:
        register = Quench(reg=1, values=SNOW, type="snow")
        await wire.send(register)
        await wire.until(lambda got: wire.quenched() == 1 and len(wire.interest()) == 50)
        assert checks[0] == 100  # one scan of the subscriptions
        for _ in range(50):
            await wire.send(Unquench(reg=1), register)
        await wire.until(lambda got: wire.quenched() == 51 and len(wire.interest()) == 50)
        assert checks[0] == 100  # the same prototype, no subscription changed: no scan
        assert router.quench.counters["scans_saved"] == 50

        # A subscription that comes is checked against the registration (its match set
        # stays current, so an unquench keeps the newcomer too) ...
        router.subscribe("SnowDepth < 60")
        await wire.until(lambda got: len(wire.interest()) == 51)
        assert checks[0] == 101
        await wire.send(Unquench(reg=1), register)
        await wire.until(lambda got: wire.quenched() == 52 and len(wire.interest()) == 51)
        assert checks[0] == 101
        # ... and one that comes between an unquench and the next registration makes that
        # registration scan anew: it sees the newcomer.
        await wire.send(Unquench(reg=1))
        await wait_for(lambda: len(router.quench.table) == 0)
        router.subscribe("SnowDepth < 70")
        await wire.send(register)
        await wire.until(lambda got: wire.quenched() == 53 and len(wire.interest()) == 52)
        assert checks[0] == 101 + 102
        assert not any(type(m) is Error for m in wire.got)
    finally:
        wire.writer.close()


class _Walked(dict[Any, Any]):
    """A dict that counts the walks over it."""

    walks = 0

    def values(self) -> Any:
        _Walked.walks += 1
        return super().values()

    def items(self) -> Any:
        _Walked.walks += 1
        return super().items()

    def __iter__(self) -> Any:
        _Walked.walks += 1
        return super().__iter__()


async def test_a_publishers_registrations_are_counted_without_walking_everyones(
    router: Router,
) -> None:
    quench = router.quench
    quench.config = dataclasses.replace(quench.config, max_per_client=5)
    quench._sessions = _Walked()
    others = await _QuenchWire.open(router.endpoint, "other-publisher")
    wire = await _QuenchWire.open(router.endpoint, "busy-publisher")
    try:
        await others.send(*(Quench(reg=n, values=SNOW, type="snow") for n in range(5)))
        await others.until(lambda got: others.quenched() == 5)
        await wire.send(*(Quench(reg=n, values=SNOW, type="snow") for n in range(6)))
        await wire.until(lambda got: wire.quenched() == 5 and any(type(m) is Error for m in got))
        assert [m.code for m in wire.got if type(m) is Error] == ["limit"]  # its own five count
        await wire.send(Unquench(reg=0), Quench(reg=5, values=SNOW, type="snow"))
        await wire.until(lambda got: wire.quenched() == 6)
        assert len(quench.table) == 10
        wire.writer.close()
        await wait_for(lambda: len(quench.table) == 5)  # its registrations went with it
        assert {r.client for r in quench.table.registrations.values()} == {"other-publisher"}
        assert _Walked.walks == 0
    finally:
        wire.writer.close()
        others.writer.close()
