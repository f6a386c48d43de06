"""Parametric subscriptions: change a pattern's parameters without re-subscribing."""

from __future__ import annotations

import asyncio
from datetime import UTC

from aa.mesh import Event


async def test_update_changes_what_matches_without_resubscribing(router, client, make_client):
    sub = await client.subscribe("Temperature > threshold", params={"threshold": 100})
    pub = await make_client()
    await pub.publish({"Temperature": 50})
    await pub.publish({"Temperature": 150})
    async with asyncio.timeout(5):
        assert (await sub.get()).values == {"Temperature": 150}
    await sub.update(threshold=30)
    assert sub.params == {"threshold": 30}
    await pub.publish({"Temperature": 50})
    async with asyncio.timeout(5):
        assert (await sub.get()).values == {"Temperature": 50}
    assert len(router.engine) == 1


async def test_no_event_missed_or_doubled_across_updates_under_load(router, client, make_client):
    """Events carry the threshold they were published under; events published after the
    update is acknowledged must follow the new threshold, and every delivered event must
    match the threshold in force when the router dispatched it — never twice."""
    got: list[Event] = []
    sub = await client.subscribe("n % k == 0", got.append, params={"k": 2})
    pub = await make_client()
    for i in range(3000):
        pub.publish_nowait({"n": i, "phase": 0})
    await pub.flush(timeout=10)
    await sub.update(k=3)
    for i in range(3000):
        pub.publish_nowait({"n": i, "phase": 1})
    await pub.flush(timeout=10)
    marker = await client.subscribe("phase == 'end'")
    await pub.publish({"phase": "end", "n": -1})
    async with asyncio.timeout(5):
        await marker.get()
    phase0 = [e.values["n"] for e in got if e.values["phase"] == 0]
    phase1 = [e.values["n"] for e in got if e.values["phase"] == 1]
    assert phase0 == list(range(0, 3000, 2))
    assert phase1 == list(range(0, 3000, 3))
    assert len({e.id for e in got}) == len(got)


def test_an_update_of_the_param_a_trader_is_filed_under_moves_only_its_entry() -> None:
    """`Symbol == sym and Price == limit` is filed under its limit when that is the rarer
    key: an update of the limit re-files the same entry under the new value (issue 12: an
    update at least 100,000 a second), and the trader then hears the new limit only."""
    from datetime import datetime

    from aa.mesh import PatternSpec
    from aa.router.patterns import HostFacts, PatternEngine

    host = HostFacts(
        router_id="r",
        router_name="r",
        clock=lambda: datetime.now(UTC),
        peer_count=lambda: 0,
    )
    engine = PatternEngine(host=host, on_failure=lambda *a: None)
    source = PatternSpec(source="Symbol == sym and Price == limit")
    for i in range(50):  # many traders of one symbol: the limit is the rarer key
        engine.subscribe(i, source, {"sym": "S1", "limit": float(i)})
    entry = engine.bucket_of(7).placed[2]
    assert entry.keys == (7.0,)
    engine.update(7, {"limit": 99.5})
    assert engine.bucket_of(7).placed[2] is entry and entry.keys == (
        99.5,
    )  # moved, not planned again
    assert [k for k, _ in engine.match(Event(values={"Symbol": "S1", "Price": 99.5}))] == [7]
    assert [k for k, _ in engine.match(Event(values={"Symbol": "S1", "Price": 7.0}))] == []
    assert [k for k, _ in engine.match(Event(values={"Symbol": "S2", "Price": 99.5}))] == []
    engine.update(7, {"limit": float("nan")})  # NaN equals nothing: planned again, matches nothing
    assert [k for k, _ in engine.match(Event(values={"Symbol": "S1", "Price": float("nan")}))] == []
    engine.update(7, {"limit": 3})  # an int where a float was: planned again (1 == 1.0)
    assert sorted(k for k, _ in engine.match(Event(values={"Symbol": "S1", "Price": 3.0}))) == [
        3,
        7,
    ]
