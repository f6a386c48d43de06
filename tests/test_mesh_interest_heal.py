"""A partition heals under interest routing, with real routers on loopback: a line of four,
r0 - r1 | r2 - r3, cut by closing the link r1 - r2 (r1 stops dialling r2, then resets the
link) and healed by dialling again.

- Short partition: each side still holds the other's summaries when the link comes back,
  and r3 subscribed to a new type meanwhile. Without the hand-over on link up, r0 settles
  on its stale view a second after the heal and routes the new type's events nowhere until
  r3's periodic repeat (`info_interval`, long here) crosses: they are lost.
- Long partition: each side forgot the other; its view is incomplete until the far side's
  summaries come.

Either way r0 publishes on every turn of the loop from before the heal until every router
routes by the tree again and 200 events more; r2 publishes on the far side meanwhile. Every
event published once r0 knew of the healed link reaches r3 exactly once, and so does each
of r2's; no event reaches it twice.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from support import FAST, Collector, line, mesh, next_turn, routing_by_interest, wait_for

from aa.mesh import Interest, InterestFilter
from aa.router import Router

#: Summaries repeated every 30 s only: a heal must not wait for a repeat. Keep-alives stay
#: short, so the cut is seen at once.
SLOW_REPEAT = dataclasses.replace(FAST, routing="interest", info_interval=30.0)
#: Summaries repeated every 0.2 s: a router forgets one not heard for 0.6 s.
QUICK_FORGET = dataclasses.replace(FAST, routing="interest")
HOT = Interest.of([InterestFilter(type="hot")])
BOTH = Interest.of([InterestFilter(type="hot"), InterestFilter(type="fresh")])


def linked_in_view(router: Router, a: Router, b: Router) -> bool:
    view = router.mesh.interests.table.view
    return b.id in view.peers(a.id) and a.id in view.peers(b.id)


async def partition_heals(config: object, *, long: bool) -> None:
    async with mesh(4, line(4), config=config) as routers:  # type: ignore[arg-type]
        r0, r1, r2, r3 = routers
        got = Collector()
        r3.subscribe('type == "hot"', got)
        await wait_for(lambda: routing_by_interest(routers), 10)
        # The cut: r1 dialled r2 (line: each dials the next); it stops, and resets the link.
        assert r1.mesh.dialer.forget(r2.endpoint)
        r1.mesh.links[r2.id].abort()
        await wait_for(lambda: not linked_in_view(r0, r1, r2), 5)
        r3.subscribe('type == "fresh"', got)  # during the partition: r0's side cannot know
        await wait_for(lambda: r2.mesh.interests.table.view.interest(r3.id) == BOTH, 5)
        if long:
            await wait_for(lambda: r3.id not in r0.mesh.interests.table.view, 10)
        else:
            # Stale: r0 holds r3's summary from before the cut.
            assert r0.mesh.interests.table.view.interest(r3.id) == HOT
        healed = time.monotonic()
        r1.mesh.add_peer(r2.endpoint)
        before: list[str] = []  # published on r0 before it knew of the healed link
        after: list[str] = []
        far: list[str] = []  # published on r2, r3's side
        known_at = routing_at = None
        while routing_at is None or len(after) < 200:
            now = time.monotonic()
            assert now - healed < 20, "the mesh never routed by the tree again"
            if known_at is None and linked_in_view(r0, r1, r2):
                known_at = now
            if known_at is not None and routing_at is None and routing_by_interest(routers):
                routing_at = now
            kind = "fresh" if (len(before) + len(after)) % 2 else "hot"
            ev = r0.publish({"n": len(before) + len(after)}, type=kind)
            assert ev is not None and ev.id is not None
            (after if known_at is not None else before).append(ev.id)
            ev = r2.publish({"far": len(far)}, type="fresh")
            assert ev is not None and ev.id is not None
            far.append(ev.id)
            await next_turn()
        await wait_for(lambda: set(after) | set(far) <= set(got.ids), 10)
        assert len(got.ids) == len(set(got.ids))  # exactly once
        assert set(got.ids) <= set(before) | set(after) | set(far)
        assert r0.mesh.interests.table.view.interest(r3.id) == BOTH
        assert routing_at is not None
        print(
            f"\nheal ({'long' if long else 'short'}): r0 knew of the link after "
            f"{known_at - healed:.3f} s, every router routed by the tree after "  # type: ignore[operator]
            f"{routing_at - healed:.3f} s; {len(before)} events before, {len(after)} after"
        )


@pytest.mark.parametrize("long", [False, True], ids=["short", "long"])
async def test_every_event_after_the_heal_reaches_the_subscriber_once(long: bool) -> None:
    await partition_heals(QUICK_FORGET if long else SLOW_REPEAT, long=long)
