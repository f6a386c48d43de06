"""Quenching (Å §4.4) across a mesh of routers in one process, under ``--routing flood``
(registrations, reports and keep-alives flooded, each subscription reported by id):
notifications when matching subscriptions come and go (subscribe, unsubscribe, session end,
pattern stopped, params updated, their router gone), routers that join later, declared
needs, fail-over, and the pure tables. Intervals are shortened; nothing sleeps. Under
interest routing remote answers come from the summaries: tests/test_quench_summaries.py."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from contextlib import AbstractAsyncContextManager

import pytest
from support import FAST, line, mesh, wait_for

from aa.client import AsyncClient, Client
from aa.mesh import Connection, Control, Event, PatternSpec, RemoteError
from aa.mesh.protocol import Quench, QuenchNotice, declared_needs, with_needs
from aa.router import QuenchConfig, Router, RouterConfig
from aa.router.links import ROUTER_INFO_TOPIC
from aa.router.quench import QuenchTable, Registration

#: The mesh of these tests: Å's flooded quenching.
FLOOD = dataclasses.replace(FAST, routing="flood")
#: Keep-alives every 0.2 s, lapse after 0.7 s: a router's disappearance shows within a second.
QUICK = QuenchConfig(keepalive=0.2, timeout=0.7)
#: Keep-alives too slow to matter in a test: only the join snapshot can inform a new router.
SLOW = QuenchConfig(keepalive=60.0, timeout=300.0)


def routers(
    n: int, edges: list[tuple[int, int]], quench: QuenchConfig = QUICK
) -> AbstractAsyncContextManager[list[Router]]:
    return mesh(n, edges, config=FLOOD, quench=quench)


class Changes:
    """A quench callback that records (sub_id, router_id, interested)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bool]] = []

    def __call__(self, sub_id: str, router_id: str, interested: bool) -> None:
        self.seen.append((sub_id, router_id, interested))

    def routers(self, interested: bool) -> list[str]:
        return [r for _, r, i in self.seen if i is interested]


SNOW = {"SnowDepthSensor": True, "SnowDepth": 50}


async def test_notices_across_a_line_of_three_routers() -> None:
    async with (
        routers(3, line(3)) as (r0, r1, r2),
        AsyncClient(r0.endpoint) as pub,
        AsyncClient(r2.endpoint) as sub_client,
    ):
        changes = Changes()
        q = await pub.quench(SNOW, changes)
        assert not q.interested
        await wait_for(lambda: all(len(r.quench.table) == 1 for r in (r0, r1, r2)))
        sub = await sub_client.subscribe("SnowDepthSensor == True")
        await q.wait_interested(timeout=5)
        assert changes.seen == [(f"{sub_client.client_id}#{sub.id}", r2.id, True)]
        # A subscription the prototype does not match changes nothing; one on r1 does.
        await sub_client.subscribe("Temperature > 3")
        local = r1.subscribe("SnowDepth > 10")
        await wait_for(lambda: len(q.interest) == 2)
        assert {r for r, _ in q.interest} == {r1.id, r2.id}
        await sub.aclose()
        local.close()
        await q.wait_uninterested(timeout=5)
        assert sorted(changes.routers(False)) == sorted([r1.id, r2.id])


async def test_session_end_pattern_stop_and_update_are_noticed() -> None:
    async with routers(2, line(2)) as (r0, r1), AsyncClient(r0.endpoint) as pub:
        changes = Changes()
        q = await pub.quench({"Price": 100.0, "StockSymbol": "ABB"}, changes, type="quote")
        await wait_for(lambda: len(r1.quench.table) == 1)
        # Session ends: every subscription of the client goes.
        c = AsyncClient(r1.endpoint)
        await c.connect()
        await c.subscribe("Price > 10")
        await q.wait_interested(timeout=5)
        await c.aclose()
        await q.wait_uninterested(timeout=5)
        # Params updated: the same subscription stops and starts matching.
        para = r1.subscribe("Price > limit", params={"limit": 50})
        await q.wait_interested(timeout=5)
        para.update(limit=500)
        await q.wait_uninterested(timeout=5)
        para.update(limit=5)
        await q.wait_interested(timeout=5)
        para.close()
        await q.wait_uninterested(timeout=5)
        # The sandbox stops a pattern: its subscriptions are gone for quenching too.
        script = r1.subscribe(
            PatternSpec(
                format="script",
                source=("if Price > 1000:\n    while True:\n        pass\nforward()"),
            )
        )
        await q.wait_interested(timeout=5)
        r1.publish({"Price": 2000.0})
        await q.wait_uninterested(timeout=5)
        assert script.failure is not None
        assert [i for _, _, i in changes.seen] == [
            True,
            False,
            True,
            False,
            True,
            False,
            True,
            False,
        ]


async def test_needs_declaration_overcomes_narrow_patterns() -> None:
    async with (
        routers(2, line(2)) as (r0, r1),
        AsyncClient(r0.endpoint) as pub,
        AsyncClient(r1.endpoint) as sub_client,
    ):
        q = await pub.quench(SNOW)
        await wait_for(lambda: len(r1.quench.table) == 1)
        narrow = await sub_client.subscribe("SnowDepth == 80")  # Å §4.4: never matches 50
        other = await sub_client.subscribe("Rain > 3", needs=["Rain"])
        await wait_for(lambda: len(r1.engine) == 2)
        assert not q.interested
        await sub_client.subscribe("SnowDepth == 80", needs=["SnowDepth"])
        await q.wait_interested(timeout=5)
        r1.subscribe("(: needs: SnowDepth SnowDepthSensor :) //SnowDepth = 80", kernel="xpath")
        await wait_for(lambda: len(q.interest) == 2)
        assert narrow and other


async def test_mentioned_only_ignores_catch_all_patterns() -> None:
    async with routers(1, []) as (r0,), AsyncClient(r0.endpoint) as pub:
        strict = await pub.quench({"Symbol": "ABB"}, mentioned_only=True)
        loose = await pub.quench({"Symbol": "ABB"})
        everything = r0.subscribe("True")
        await loose.wait_interested(timeout=5)
        assert not strict.interested
        r0.subscribe('Symbol == "ABB"')
        await strict.wait_interested(timeout=5)
        everything.close()


async def test_a_router_that_joins_later_learns_registrations_at_once() -> None:
    # Keep-alives are a minute apart: only the snapshot sent when a new router appears can
    # tell the newcomer about the registration within the test's time.
    async with routers(2, line(2), quench=SLOW) as (r0, r1), AsyncClient(r0.endpoint) as pub:
        changes = Changes()
        q = await pub.quench(SNOW, changes)
        await wait_for(lambda: len(r1.quench.table) == 1)
        late = Router(RouterConfig(port=0, name="late", mesh=FLOOD, quench=SLOW))
        async with late:
            late.subscribe("SnowDepth >= 0")  # there before it joins
            late.mesh.add_peer(r1.endpoint)
            await q.wait_interested(timeout=5)
            assert changes.seen[0][1] == late.id
            assert late.quench.registrations()[0]["values"] == SNOW


async def test_interest_of_a_router_that_vanishes_lapses() -> None:
    async with routers(2, line(2)) as (r0, r1), AsyncClient(r0.endpoint) as pub:
        changes = Changes()
        q = await pub.quench(SNOW, changes)
        gone = Router(RouterConfig(port=0, name="gone", mesh=FLOOD, quench=QUICK))
        await gone.start()
        try:
            gone.mesh.add_peer(r1.endpoint)
            gone.subscribe("SnowDepth > 1")
            await q.wait_interested(timeout=5)
        finally:
            await gone.aclose()  # says goodbye, but nobody tells quenching: it lapses
        await q.wait_uninterested(timeout=5)
        assert changes.seen[-1] == (changes.seen[0][0], gone.id, False)


async def test_registrations_go_with_the_publisher_and_with_unquench() -> None:
    async with routers(3, line(3)) as rs:
        pub = AsyncClient(rs[0].endpoint)
        await pub.connect()
        q1 = await pub.quench({"A": 1})
        await pub.quench({"B": 1})
        await wait_for(lambda: all(len(r.quench.table) == 2 for r in rs))
        await q1.aclose()
        await wait_for(lambda: all(len(r.quench.table) == 1 for r in rs))
        await pub.aclose()
        await wait_for(lambda: all(len(r.quench.table) == 0 for r in rs))


async def test_publisher_fail_over_keeps_interest_without_flapping() -> None:
    async with routers(3, [(0, 2), (1, 2)]) as (r0, r1, r2):
        r2.subscribe("SnowDepth > 1")
        pub = AsyncClient([r0.endpoint, r1.endpoint])
        pub.quench_stale_grace = 0.5
        await pub.connect()
        try:
            changes = Changes()
            q = await pub.quench(SNOW, changes)
            await q.wait_interested(timeout=5)
            await r0.aclose()  # the publisher's router goes: it fails over to r1
            await wait_for(
                lambda: pub.connected and pub.router is not None and pub.router[0] == r1.id
            )
            await wait_for(lambda: any(reg["owned"] for reg in r1.quench.registrations()))
            r2.subscribe("SnowDepthSensor")
            await wait_for(lambda: len(q.interest) == 2)
            assert changes.routers(False) == []  # the first one was confirmed, never reported gone
        finally:
            await pub.aclose()


async def test_stale_interest_is_reported_gone_after_fail_over() -> None:
    async with routers(3, [(0, 2), (1, 2)]) as (r0, r1, r2):
        sub = r2.subscribe("SnowDepth > 1")
        pub = AsyncClient([r0.endpoint, r1.endpoint])
        pub.quench_stale_grace = 0.3
        await pub.connect()
        try:
            q = await pub.quench(SNOW)
            await q.wait_interested(timeout=5)
            await r0.aclose()
            sub.close()  # while the publisher is between routers: nobody can tell it
            await q.wait_uninterested(timeout=5)
        finally:
            await pub.aclose()


def test_blocking_client_quench() -> None:
    async def main() -> None:
        async with Router(RouterConfig(port=0)) as r:
            seen: list[bool] = []

            def blocking() -> None:
                with Client(r.endpoint) as c:
                    q = c.quench({"X": 1}, lambda s, rid, i: seen.append(i))
                    with Client(r.endpoint) as other:
                        other.subscribe("X > 0")
                        q.wait_interested(timeout=5)
                    q.wait_uninterested(timeout=5)
                    q.close()

            await asyncio.to_thread(blocking)
            assert seen == [True, False]

    asyncio.run(main())


async def test_refused_registration_raises_remote_error() -> None:
    async with (
        routers(1, [], quench=QuenchConfig(keepalive=0.2, timeout=0.7, max_per_client=1)) as (r0,),
        AsyncClient(r0.endpoint) as pub,
    ):
        await pub.quench({"A": 1})
        with pytest.raises(RemoteError) as info:
            await pub.quench({"B": 1})
        assert info.value.code == "limit"


# -- pure parts ------------------------------------------------------------------------------


def test_needs_declarations() -> None:
    assert declared_needs(PatternSpec(source="SnowDepth == 80  # needs: SnowDepth")) == {
        "SnowDepth"
    }
    assert declared_needs(PatternSpec(source="# NEEDS: a, b c\n# needs: d\nTrue")) == {
        "a",
        "b",
        "c",
        "d",
    }
    assert declared_needs(PatternSpec(source='x == "# needs: y"')) == frozenset()
    assert declared_needs(
        PatternSpec(format="script", source="if x:\n    forward()  # needs: x")
    ) == {"x"}
    assert declared_needs(PatternSpec(kernel="xpath", source="(: needs: A :) //A = 1")) == {"A"}
    spec = with_needs(PatternSpec(kernel="xpath", source="//A = 1"), ["A", "B"])
    assert declared_needs(spec) == {"A", "B"}
    with pytest.raises(ValueError):
        with_needs(PatternSpec(source="x"), ["not a name"])


def test_messages_round_trip() -> None:
    a, b = Connection(), Connection()
    for msg in (
        Quench(reg=4, values={"A": [1, 2]}, type="t", mentioned_only=True),
        QuenchNotice(reg=4, changes=(("r1", "c#1", True), ("r2", "c#2", False))),
    ):
        b.receive_data(a.send(msg))
        assert b.next_message() == msg


def test_table_reports_diff_and_lapse() -> None:
    table = QuenchTable("me")
    reg = Registration(
        reg="c/1",
        client="c",
        number=1,
        owner="me",
        prototype=Event(values={"A": 1}),
        mentioned_only=False,
        timeout=10.0,
        expires=None,
    )
    table.add_owned(reg)
    assert table.report("c/1", "r2", frozenset({"s1", "s2"}), now=0.0) == [
        ("r2", "s1", True),
        ("r2", "s2", True),
    ]
    assert table.report("c/1", "r2", frozenset({"s2", "s3"}), now=5.0) == [
        ("r2", "s1", False),
        ("r2", "s3", True),
    ]
    assert table.report("c/1", "me", frozenset({"x"}), now=5.0) == [("me", "x", True)]
    assert table.expire_interest(now=14.0, timeout=10.0) == {}
    assert table.expire_interest(now=15.1, timeout=10.0) == {
        "c/1": [("r2", "s2", False), ("r2", "s3", False)]
    }
    # Our own interest never lapses; registrations from elsewhere do.
    remote = Registration(
        reg="d/1",
        client="d",
        number=1,
        owner="r9",
        prototype=Event(values={}),
        mentioned_only=False,
        timeout=3.0,
        expires=None,
    )
    entry, new = table.upsert(remote, now=0.0)
    assert new and entry.expires == 3.0
    assert table.upsert(_copy(remote), now=2.0)[1] is False  # a keep-alive: pushed back to 5.0
    assert table.expire(now=4.0) == []
    assert table.expire(now=5.1) == ["d/1"]


def _copy(reg: Registration) -> Registration:
    return Registration(
        reg=reg.reg,
        client=reg.client,
        number=reg.number,
        owner=reg.owner,
        prototype=reg.prototype,
        mentioned_only=reg.mentioned_only,
        timeout=reg.timeout,
        expires=None,
    )


async def test_a_router_is_remembered_as_long_as_its_stated_repeat_interval_says() -> None:
    """In a big mesh routers repeat their summaries less often (`MeshConfig.repeat_interval`)
    and say so: quenching keeps a router it heard of for three of *its* intervals, so a router
    repeating every 100 s is not taken for a newcomer (and sent every registration again)
    each time it is heard."""
    router = Router(RouterConfig(port=0, mesh=FLOOD))
    quench = router.quench

    def hear(interval: float, seq: int) -> None:
        body = {"id": "far", "interval": interval}
        quench._on_router_info(
            Control(id=f"info-{seq}", ttl=1, path=("far",), topic=ROUTER_INFO_TOPIC, body=body)
        )

    now = time.monotonic()
    hear(100.0, 1)
    quench.tick(now + 3 * FLOOD.info_interval + 1)  # past three of this router's intervals
    assert "far" in quench._routers_seen
    quench.tick(now + 301)  # past three of its own
    assert "far" not in quench._routers_seen
