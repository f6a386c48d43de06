"""Client caches through routers: register, go away, come back (to another router), fetch and
acknowledge; replication of registrations, acks, policies and keep-alives across a mesh."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from support import mesh, wait_for

from aa.client import Client
from aa.mesh import PatternSpec, RemoteError, UnknownCache
from aa.router import CacheConfig, ExpiryPolicy, Router
from aa.router.caches import cache_key


def key(client_id: str) -> str:
    """The router's key of an anonymous TCP client's cache (its user and its client id)."""
    return cache_key("anonymous", client_id)


SWEEP_FAST = CacheConfig(sweep_interval=0.02)


@pytest.fixture
async def two() -> AsyncIterator[tuple[Router, Router]]:
    """Two routers linked to each other, sweeping lapsed caches every 20 ms."""
    async with mesh(2, [(1, 0)], caches=SWEEP_FAST) as (a, b):
        yield a, b


async def test_register_go_away_fetch_ack_fetch_again(router: Router, open_client) -> None:
    phone = await open_client(router, "phone")
    info = await phone.cache_register("Alarm > 0", max_count=100, max_age="1h")
    assert info["max_count"] == 100 and info["max_age"] == 3600.0 and info["size"] == 0
    await phone.aclose()  # away
    for i in range(5):
        router.publish({"Alarm": i})  # 1..4 match
    phone = await open_client(router, "phone")  # back, same client id
    got = await phone.cache_fetch()
    assert [e.values["Alarm"] for e in got] == [1, 2, 3, 4]
    assert [e.values["Alarm"] for e in await phone.cache_fetch()] == [1, 2, 3, 4]  # fetch keeps
    await phone.cache_ack()
    assert await phone.cache_fetch() == []
    router.publish({"Alarm": 7})
    assert [e.values["Alarm"] for e in await phone.cache_fetch()] == [7]  # only the new one
    assert [e.values["Alarm"] for e in await phone.cache_fetch(limit=1)] == [7]


async def test_policy_clear_remove_and_unknown_cache(router: Router, open_client) -> None:
    c = await open_client(router, "c1")
    with pytest.raises(RemoteError) as err:
        await c.cache_fetch()
    assert err.value.code == "unknown-cache"
    await c.cache_register("True", max_count=10)
    for i in range(5):
        router.publish({"i": i})
    info = await c.cache_policy(max_count=2)
    assert info["max_count"] == 2 and info["size"] == 2
    assert [e.values["i"] for e in await c.cache_fetch()] == [3, 4]
    await c.cache_clear()
    assert await c.cache_fetch() == [] and key("c1") in router.caches
    assert await c.cache_remove() is True
    assert key("c1") not in router.caches
    with pytest.raises(UnknownCache):
        router.caches.info(key("c1"))


async def test_the_cache_is_replicated_and_found_through_another_router(two, open_client) -> None:
    a, b = two
    phone = await open_client(a, "phone")
    await phone.cache_register("Temperature > 30", max_count=50)
    await wait_for(lambda: key("phone") in b.caches)
    await phone.aclose()
    for t in (20, 35, 40):
        a.publish({"Temperature": t})  # floods to b: both caches take 35 and 40
    await wait_for(lambda: b.caches.info(key("phone")).size == 2)
    phone = await open_client(b, "phone")  # comes back through the other router
    got = await phone.cache_fetch()
    assert [e.values["Temperature"] for e in got] == [35, 40]
    await phone.cache_ack()
    await wait_for(lambda: a.caches.info(key("phone")).size == 0)  # the ack flooded, by event id
    b.publish({"Temperature": 50})
    await wait_for(lambda: a.caches.info(key("phone")).size == 1)
    assert [e.values["Temperature"] for e in a.caches.fetch(key("phone")).events] == [50]


async def test_policy_clear_and_remove_flood(two) -> None:
    a, b = two
    a.caches.register("app", PatternSpec(source="True"), ExpiryPolicy(max_count=10), 60.0)
    await wait_for(lambda: "app" in b.caches)
    for i in range(4):
        a.publish({"i": i})
    await wait_for(lambda: b.caches.info("app").size == 4)
    a.caches.set_policy("app", ExpiryPolicy(max_count=1, max_age=timedelta(hours=1)))
    await wait_for(lambda: b.caches.info("app").policy.max_count == 1)
    assert (
        b.caches.info("app").policy.max_age == timedelta(hours=1) and b.caches.info("app").size == 1
    )
    a.caches.clear("app")
    await wait_for(lambda: b.caches.info("app").size == 0)
    assert a.caches.remove("app") is True
    await wait_for(lambda: "app" not in b.caches)


async def test_router_api_cursors_and_acks_by_cursor_flood_by_id(two) -> None:
    a, b = two
    a.caches.register("http:1:p1", PatternSpec(source="i >= 0"), ExpiryPolicy(), 60.0)
    await wait_for(lambda: "http:1:p1" in b.caches)
    for i in range(6):
        a.publish({"i": i})
    await wait_for(lambda: b.caches.info("http:1:p1").size == 6)
    page = a.caches.fetch("http:1:p1", limit=4)
    assert [e.values["i"] for e in page.events] == [0, 1, 2, 3] and page.more
    nxt = a.caches.fetch("http:1:p1", after=page.cursor)
    assert [e.values["i"] for e in nxt.events] == [4, 5] and not nxt.more
    a.caches.ack("http:1:p1", page.cursor)  # a cursor here, an event id in the flood
    await wait_for(lambda: b.caches.info("http:1:p1").size == 2)
    assert [e.values["i"] for e in b.caches.fetch("http:1:p1").events] == [4, 5]
    assert a.caches.keepalive("http:1:p1") and not a.caches.keepalive("nobody")


async def test_lapsed_keepalive_removes_the_cache_everywhere(two, open_client) -> None:
    a, b = two
    live = await open_client(a, "live")
    gone = await open_client(a, "gone")
    await live.cache_register("True", timeout=0.6)  # keep-alives every 0.2 s
    await gone.cache_register("True", timeout=0.6)
    await wait_for(lambda: key("live") in b.caches and key("gone") in b.caches)
    await gone.aclose()  # no more keep-alives from it
    await wait_for(lambda: key("gone") not in a.caches and key("gone") not in b.caches)
    # Meanwhile the live client's keep-alives flooded and kept its cache on both routers.
    assert b.caches.counters["received_keepalive"] >= 2
    assert key("live") in a.caches and key("live") in b.caches


async def test_a_router_that_lost_the_cache_gets_it_again_from_the_client(
    router: Router, open_client
) -> None:
    c = await open_client(router, "c")
    await c.cache_register("x > 1", max_count=5, timeout=60)
    router.caches.remove(key("c"))  # as if it lapsed here, or the router restarted
    info = await c.cache_keepalive()
    assert key("c") in router.caches and info["max_count"] == 5 and info["pattern"] == "x > 1"


async def test_blocking_client_cache_calls(router: Router) -> None:
    def work() -> list[int]:
        with Client(router.endpoint, client_id="sync") as c:
            c.cache_register("n > 0", max_count=3)
            c.publish({"n": 1})
            c.publish({"n": 2})
            c.flush()
            got = [e.values["n"] for e in c.cache_fetch()]
            c.cache_ack()
            got.append(len(c.cache_fetch()))
            got.append(len(c.cached("n > 0")))
            return got

    assert await asyncio.to_thread(work) == [1, 2, 0, 2]


async def test_thousand_caches_share_few_evaluations(router: Router) -> None:
    specs = [PatternSpec(source=f"Sensor == 'lab-{k}'") for k in range(10)]
    for i in range(1000):
        router.caches.register(f"c{i}", specs[i % 10], ExpiryPolicy(max_count=5), 600.0)
    assert router.caches.pattern_count == 10  # one compiled matcher per distinct pattern
    router.publish({"Sensor": "lab-3"})
    assert router.caches.info("c3").size == 1 and router.caches.info("c4").size == 0
    for i in range(1000):
        router.caches.remove(f"c{i}")
    assert router.caches.pattern_count == 0 and not router.caches.attached


def test_equality_patterns_are_looked_up_not_evaluated() -> None:
    from aa.mesh import Event
    from aa.router.caches import CacheIndex, equality_of

    assert equality_of(PatternSpec(source='Device == "phone-7"')) == ("Device", "phone-7")
    assert equality_of(PatternSpec(source="3 == n")) == ("n", 3)
    for source in (
        "type == 'x'",
        "len == 3",
        "a == b",
        "a == [1]",
        "a != 1",
        "a == 1 == 1",
        "_x == 1",
    ):
        assert equality_of(PatternSpec(source=source)) is None, source
    index = CacheIndex()
    seen: list[Event] = []
    index.add("d7", PatternSpec(source='Device == "phone-7"'), lambda e: False)
    index.add("one", PatternSpec(source="n == 1"), lambda e: False)
    index.add("true", PatternSpec(source="n == True"), lambda e: False)
    index.add(
        "big", PatternSpec(source="n > 5"), lambda e: seen.append(e) or e.values.get("n", 0) > 5
    )
    assert index.match(Event(values={"Device": "phone-7"})) == ["d7"]
    assert sorted(index.match(Event(values={"n": 1.0}))) == ["one", "true"]  # as == says
    assert index.match(Event(values={"n": [1]})) == []  # unhashable: equal to no constant
    assert index.match(Event(values={"n": 9})) == ["big"] and len(seen) == 4
    index.remove("one")
    index.remove("true")
    assert index.match(Event(values={"n": 1})) == []
