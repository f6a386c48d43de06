"""When a new subscription starts to receive under interest routing, with real routers on
loopback: what `docs/mesh.md` promises ("an event published on another router reaches the new
subscriber if it was published after the new summary reached that router"), in a line of
five routers with the subscriber at the far end from the publisher."""

from __future__ import annotations

import dataclasses
import time

from support import FAST, Collector, line, mesh, next_turn, wait_for

from aa.mesh import Interest, InterestFilter
from aa.router import Router

INTEREST = dataclasses.replace(FAST, routing="interest")
HOT = Interest.of([InterestFilter(type="hot")])


def settled(routers: list[Router]) -> bool:
    now = time.monotonic()
    return all(
        r.mesh.interests.table.settled(now)
        and r.mesh.interests.table.view.complete
        and len(r.mesh.interests.table.view) == len(routers)
        for r in routers
    )


def knows(router: Router, rid: str) -> bool:
    """Whether *router*'s view holds *rid*'s interest in hot events."""
    interest = router.mesh.interests.table.view.interest(rid)
    return interest is not None and interest.covers(HOT)


async def test_a_new_subscription_gets_every_event_published_after_its_summary_came() -> None:
    async with mesh(5, line(5), config=INTEREST) as routers:
        near, far = routers[0], routers[-1]
        await wait_for(lambda: settled(routers), 10)
        assert not knows(near, far.id)
        got = Collector()
        far.subscribe('type == "hot"', got)
        returned = time.monotonic()
        own = far.publish({"own": True}, type="hot")  # on the subscriber's own router
        before: list[str] = []  # published on `near` before its view held the interest
        after: list[str] = []
        known_at = settled_at = None
        # Publish on every turn of the loop through the window, the flood that follows the
        # change (the near router is unsettled), and until it routes by the tree again.
        while settled_at is None or len(after) < 200:
            now = time.monotonic()
            if known_at is None and knows(near, far.id):
                known_at = now
            if (
                known_at is not None
                and settled_at is None
                and near.mesh.interests.table.settled(now)
            ):
                settled_at = now
            ev = near.publish({"n": len(before) + len(after)}, type="hot")
            assert ev is not None and ev.id is not None
            (after if known_at is not None else before).append(ev.id)
            assert now - returned < 10, "the new summary never settled on the near router"
            await next_turn()
        await wait_for(lambda: set(after) <= set(got.ids), 10)
        assert own is not None and own.id in got.ids
        assert len(got.ids) == len(set(got.ids))  # exactly once
        assert known_at is not None and known_at - returned < 2.0
