"""Client event caches: matching, policies, keep-alive, fetch/ack, and shared patterns."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, timedelta

import pytest

from aa.mesh import Event, UnknownCache, UsageError
from aa.router import ExpiryPolicy
from aa.router.caches import ClientCaches

ANY = ExpiryPolicy()


def ev(i: int, **values: object) -> Event:
    return Event(values={"i": i, **values}, id=f"e{i}")


def everything(_e: Event) -> bool:
    return True


def ids(events: list[Event]) -> list[int]:
    return [e.values["i"] for e in events]  # type: ignore[misc]


def test_cache_takes_only_matching_events_after_registration() -> None:
    caches = ClientCaches()
    caches.offer(ev(0), now=0.0)  # before the cache exists: not in it
    assert caches.register("c1", lambda e: e.values["i"] % 2 == 0, ANY, timeout=60, now=0.0)
    for i in range(1, 7):
        caches.offer(ev(i), now=float(i))
    got = caches.fetch("c1", now=7.0)
    assert ids(got.events) == [2, 4, 6] and not got.more


def test_fetch_pages_with_a_cursor_and_ack_removes() -> None:
    caches = ClientCaches()
    caches.register("c1", everything, ANY, timeout=60, now=0.0)
    for i in range(10):
        caches.offer(ev(i), now=1.0)
    page1 = caches.fetch("c1", limit=4, now=2.0)
    assert ids(page1.events) == [0, 1, 2, 3] and page1.more
    page2 = caches.fetch("c1", after=page1.cursor, limit=4, now=2.0)
    assert ids(page2.events) == [4, 5, 6, 7]
    # fetching removes nothing; acknowledging does
    assert ids(caches.fetch("c1", now=2.0).events) == list(range(10))
    caches.ack("c1", page2.cursor)
    rest = caches.fetch("c1", now=2.0)
    assert ids(rest.events) == [8, 9] and not rest.more
    caches.ack("c1", rest.cursor)
    empty = caches.fetch("c1", now=2.0)
    assert empty.events == [] and empty.cursor == rest.cursor
    assert caches.info("c1").size == 0


def test_ack_by_event_id_works_across_routers() -> None:
    caches = ClientCaches()
    caches.register("c1", everything, ANY, timeout=60, now=0.0)
    for i in range(5):
        caches.offer(ev(i), now=1.0)
    caches.ack("c1", "e2")
    assert ids(caches.fetch("c1", now=1.0).events) == [3, 4]
    caches.ack("c1", "not-here")  # unknown id: nothing removed
    assert ids(caches.fetch("c1", now=1.0).events) == [3, 4]
    with pytest.raises(UsageError):
        caches.ack("c1", 1.5)  # type: ignore[arg-type]


def test_count_policy_keeps_newest_n() -> None:
    caches = ClientCaches()
    caches.register("c1", everything, ExpiryPolicy(max_count=3), timeout=60, now=0.0)
    for i in range(10):
        caches.offer(ev(i), now=1.0)
    assert ids(caches.fetch("c1", now=1.0).events) == [7, 8, 9]


def test_age_policy_by_moving_now() -> None:
    caches = ClientCaches()
    caches.register(
        "c1", everything, ExpiryPolicy(max_age=timedelta(seconds=10)), timeout=600, now=0.0
    )
    for i in range(5):
        caches.offer(ev(i), now=float(i * 5))  # taken at 0, 5, 10, 15, 20
    assert ids(caches.fetch("c1", now=20.0).events) == [2, 3, 4]  # 10 s old is still in
    assert ids(caches.fetch("c1", now=26.0).events) == [4]
    caches.expire(now=26.0)
    assert ids(caches.fetch("c1", now=26.0).events) == [4]
    assert caches.fetch("c1", now=31.0).events == []


def test_keepalive_and_expiry_of_caches() -> None:
    caches = ClientCaches()
    caches.register("c1", everything, ANY, timeout=30, now=0.0)
    caches.register("c2", everything, ANY, timeout=30, now=0.0)
    assert caches.keepalive("c1", now=25.0)
    assert not caches.keepalive("nobody", now=25.0)
    assert caches.expire(now=30.0) == []  # exactly at the timeout: still alive
    assert caches.expire(now=31.0) == ["c2"]
    assert "c1" in caches and "c2" not in caches
    with pytest.raises(UnknownCache, match="c2"):
        caches.fetch("c2", now=31.0)
    assert caches.expire(now=56.0) == ["c1"]
    assert len(caches) == 0


def test_set_policy_clear_remove() -> None:
    caches = ClientCaches()
    caches.register("c1", everything, ANY, timeout=60, now=0.0)
    for i in range(6):
        caches.offer(ev(i), now=1.0)
    caches.set_policy("c1", ExpiryPolicy(max_count=2))
    assert ids(caches.fetch("c1", now=1.0).events) == [4, 5]
    caches.clear("c1")
    assert caches.fetch("c1", now=1.0).events == []
    caches.offer(ev(6), now=2.0)
    assert ids(caches.fetch("c1", now=2.0).events) == [6]
    assert caches.remove("c1") and not caches.remove("c1")
    with pytest.raises(UnknownCache):
        caches.clear("c1")


def test_register_again_same_pattern_keeps_events_other_pattern_starts_afresh() -> None:
    caches = ClientCaches()
    caches.register("c1", everything, ANY, timeout=60, now=0.0, key="all")
    caches.offer(ev(1), now=1.0)
    assert not caches.register(
        "c1", everything, ExpiryPolicy(max_count=5), timeout=90, now=2.0, key="all"
    )
    assert ids(caches.fetch("c1", now=2.0).events) == [1]
    assert caches.info("c1").timeout == 90
    caches.register("c1", lambda e: True, ANY, timeout=60, now=3.0, key="other")
    assert caches.fetch("c1", now=3.0).events == []


def test_policies_of_members_sharing_a_pattern_hold_each() -> None:
    caches = ClientCaches()
    caches.register("few", everything, ExpiryPolicy(max_count=2), timeout=600, now=0.0, key="p")
    caches.register("many", everything, ExpiryPolicy(max_count=50), timeout=600, now=0.0, key="p")
    caches.register(
        "young",
        everything,
        ExpiryPolicy(max_age=timedelta(seconds=3)),
        timeout=600,
        now=0.0,
        key="p",
    )
    for i in range(10):
        caches.offer(ev(i), now=float(i))
    assert ids(caches.fetch("few", now=9.0).events) == [8, 9]
    assert ids(caches.fetch("many", now=9.0).events) == list(range(10))
    assert ids(caches.fetch("young", now=9.0).events) == [6, 7, 8, 9]
    caches.ack("many", "e4")
    assert ids(caches.fetch("many", now=9.0).events) == [5, 6, 7, 8, 9]
    assert ids(caches.fetch("few", now=9.0).events) == [8, 9]  # others' acks do not touch it


def test_each_distinct_pattern_is_evaluated_once_per_event() -> None:
    calls: dict[str, int] = {}

    def matcher(name: str) -> Callable[[Event], bool]:
        def m(e: Event) -> bool:
            calls[name] = calls.get(name, 0) + 1
            return e.values["i"] % 2 == 0 if name == "even" else True

        return m

    shared = {name: matcher(name) for name in ("even", "all")}
    caches = ClientCaches()
    for n in range(1000):
        name = "even" if n % 2 else "all"
        caches.register(f"c{n}", shared[name], ANY, timeout=60, now=0.0)  # key: the matcher
    for i in range(100):
        taken = caches.offer(ev(i), now=1.0)
        assert taken == (1000 if i % 2 == 0 else 500)
    assert calls == {"even": 100, "all": 100}
    assert ids(caches.fetch("c1", now=1.0).events) == list(range(0, 100, 2))
    assert len(caches.fetch("c2", now=1.0).events) == 100


def test_caches_are_bounded() -> None:
    caches = ClientCaches(max_caches=2, max_events_per_cache=5)
    caches.register("a", everything, ANY, timeout=60, now=0.0)
    caches.register("b", everything, ExpiryPolicy(max_count=100), timeout=60, now=0.0)
    with pytest.raises(UsageError, match="limit"):
        caches.register("c", everything, ANY, timeout=60, now=0.0)
    for i in range(20):
        caches.offer(ev(i), now=1.0)
    assert ids(caches.fetch("a", now=1.0).events) == [15, 16, 17, 18, 19]
    assert len(caches.fetch("b", now=1.0).events) == 5
    with pytest.raises(UsageError, match="timeout"):
        caches.register("a", everything, ANY, timeout=0, now=0.0)


def test_shared_log_is_trimmed() -> None:
    caches = ClientCaches()
    caches.register(
        "c1", everything, ExpiryPolicy(max_age=timedelta(seconds=10)), timeout=10**5, now=0.0
    )
    for i in range(5000):
        caches.offer(ev(i), now=float(i))
    (group,) = caches._groups.values()
    assert len(group.log) - group.head <= 11  # only what the age limit still needs
    assert len(group.log) < 2100  # the dead prefix is compacted as it goes
    caches.register("c2", everything, ANY, timeout=10**5, now=5000.0, key="acked")
    for i in range(5000, 5010):
        caches.offer(ev(i), now=5000.0)
    caches.ack("c2", caches.fetch("c2", now=5000.0).cursor)
    caches.expire(now=5000.0)
    (_, g2) = caches._groups.values()
    assert len(g2.log) - g2.head == 0  # everything acknowledged by every member


def test_a_matcher_that_raises_is_no_match() -> None:
    caches = ClientCaches()

    def broken(_e: Event) -> bool:
        raise RuntimeError("boom")

    caches.register("c1", broken, ANY, timeout=60, now=0.0)
    caches.register("c2", everything, ANY, timeout=60, now=0.0)
    assert caches.offer(ev(1), now=1.0) == 1
    assert caches.matcher_errors == 1


def at(i: int, t: float, eid: str | None = None) -> Event:
    """Event *i* stamped at *t* seconds (as a router stamps it), id e<i>."""
    from datetime import datetime

    return Event(values={"i": i}, id=eid or f"e{i}", meta={"time": datetime.fromtimestamp(t, UTC)})


def test_one_order_everywhere_a_late_event_goes_to_its_place_and_no_cursor_skips_it() -> None:
    """Two routers taking the same events in different orders hold them in one order (time
    stamp, then id), so count limits keep the same ones; a late event is not lost to a cursor."""
    here, there = ClientCaches(), ClientCaches()
    for c in (here, there):
        c.register("c1", everything, ExpiryPolicy(max_count=3), timeout=600, now=100.0)
    events = [at(i, 100.0 + i) for i in range(1, 6)]
    for e in events:
        here.offer(e, now=110.0)
    for e in reversed(events):
        there.offer(e, now=110.0)
    assert (
        ids(here.fetch("c1", now=110.0).events)
        == ids(there.fetch("c1", now=110.0).events)
        == [3, 4, 5]
    )
    page = here.fetch("c1", now=110.0, limit=2)
    late = at(9, 103.5)  # stamped between e3 and e4, arrives after the client fetched e3, e4
    assert here.insert("c1", late, now=110.0) and not here.insert("c1", late, now=110.0)  # once
    assert ids(here.fetch("c1", now=110.0, after=page.cursor).events) == [9, 4, 5]
    assert ids(here.fetch("c1", now=110.0).events) == [9, 4, 5]  # the newest 3 in that order
    assert not here.insert("c1", at(8, 101.5), now=110.0)  # older than the three kept: not taken


def test_floors_are_marks_an_ack_holds_on_a_router_that_lacks_the_event() -> None:
    here, there = ClientCaches(), ClientCaches()
    for c in (here, there):
        c.register("c1", everything, ANY, timeout=600, now=100.0)
    for i in range(1, 6):
        here.offer(at(i, 100.0 + i), now=110.0)
        if i != 3:
            there.offer(at(i, 100.0 + i), now=110.0)  # `there` never got e3
    here.ack("c1", "e3")
    floor = here.floor("c1")
    assert floor is not None
    there.ack_mark("c1", floor)
    assert ids(there.fetch("c1", now=110.0).events) == [4, 5]
    assert not there.insert(
        "c1", at(3, 103.0), now=110.0
    )  # acknowledged: a repair does not bring it back
    there.ack_mark("c1", (101.0, 2, "e1"))  # floors only rise
    assert there.floor("c1") == floor


def test_the_age_limit_is_the_events_own_time() -> None:
    caches = ClientCaches()
    caches.register(
        "c1", everything, ExpiryPolicy(max_age=timedelta(seconds=10)), timeout=600, now=100.0
    )
    assert not caches.insert("c1", at(1, 95.0), now=110.0)  # 15 s old when it arrives: not taken
    assert caches.insert("c1", at(2, 105.0), now=110.0)
    assert ids(caches.fetch("c1", now=114.0).events) == [2]
    assert caches.fetch("c1", now=116.0).events == []
