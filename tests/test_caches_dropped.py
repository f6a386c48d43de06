"""A client cache that overflowed while its client was away says so on return: the events
it took and lost to its count or age limit before they were acknowledged are counted per
cache (without a cost per cache on each event), told to the client library when it
registers again or reconnects, and shown per pattern on an HTTP client's resource."""

from __future__ import annotations

from datetime import timedelta

from http_helpers import bearer, open_api, register

from aa.client import AsyncClient
from aa.mesh import Event
from aa.router import Router
from aa.router.caches import ClientCaches
from aa.router.store import ExpiryPolicy


def _offer(caches: ClientCaches, first: int, last: int) -> None:
    for i in range(first, last):
        caches.offer(Event(values={"i": i}, id=f"e{i}"), now=float(i))


def test_drops_count_per_cache_over_one_shared_log() -> None:
    caches = ClientCaches()
    every = lambda e: True  # noqa: E731
    caches.register("small", every, ExpiryPolicy(max_count=3), timeout=1e5, now=0.0, key="k")
    caches.register("large", every, ExpiryPolicy(max_count=10), timeout=1e5, now=0.0, key="k")
    _offer(caches, 1, 9)
    assert (caches.dropped("small", 9.0), caches.dropped("large", 9.0)) == (5, 0)
    got = caches.fetch("small", now=9.0)
    caches.ack("small", got.cursor)
    assert caches.dropped("small", 9.0) == 5  # acknowledging keeps what was lost
    _offer(caches, 9, 21)  # the shared log now passes entries "large" never acknowledged
    assert (caches.dropped("small", 21.0), caches.dropped("large", 21.0)) == (14, 10)
    got = caches.fetch("large", now=21.0)
    assert len(got.events) == 10
    caches.ack("large", got.cursor)
    _offer(caches, 21, 23)
    assert caches.dropped("large", 23.0) == 10  # acknowledged ones never count


def test_age_drops_count_before_and_after_the_sweep() -> None:
    caches = ClientCaches()
    recent = ExpiryPolicy(max_age=timedelta(seconds=3))
    caches.register("aged", lambda e: True, recent, timeout=1e5, now=0.0)
    _offer(caches, 1, 7)
    assert caches.dropped("aged", 7.0) == 3  # 1..3 are older than 3 s at 7
    caches.expire(20.0)
    assert caches.dropped("aged", 20.0) == 6 and caches.fetch("aged", now=20.0).events == []


async def test_a_client_back_to_an_overflowed_cache_is_told_its_drops(router: Router) -> None:
    async with AsyncClient(router.endpoint, client_id="phone") as phone:
        await phone.cache_register('type == "snow"', max_count=3, timeout=600)
    async with AsyncClient(router.endpoint) as publisher:
        for n in range(8):
            await publisher.publish({"n": n}, type="snow")
        await publisher.publish({"n": 99}, type="rain")
        await publisher.flush()
    told: list[int] = []
    async with AsyncClient(router.endpoint, client_id="phone") as phone:
        info = await phone.cache_register(
            'type == "snow"', max_count=3, timeout=600, on_dropped=told.append
        )
        assert told == [5] and info["dropped"] == 5
        assert [e.values["n"] for e in await phone.cache_fetch()] == [5, 6, 7]
        await phone.cache_ack()
        assert (await phone.cache_info())["dropped"] == 5 and told == [5]  # told once


async def test_an_http_client_resource_shows_each_patterns_drops() -> None:
    async with open_api() as (router, http):
        c = await register(http, "True", name="phone", policy={"max_count": 2})
        auth = bearer(c["token"])
        for i in range(5):
            router.publish({"i": i})
        info = (await http.get(f"/clients/{c['id']}", headers=auth)).json()
        assert info["queued"] == {"p1": 2} and info["dropped"] == {"p1": 3}
