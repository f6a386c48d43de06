"""Four real routers in a line, each with a local publisher and a local subscriber that wants
only its own router's events: under interest routing no router receives another's events
(counted by the routers' own `events_in`, not timed), so each router's cost per event stays
that of a router alone; under flooding every router receives every event."""

from __future__ import annotations

import dataclasses

import pytest
from support import FAST, Collector, line, mesh, routing_by_interest, wait_for

#: Summaries and keep-alives slow enough that a loaded machine, busy with a burst of
#: publishes, neither forgets a router nor drops a link (either makes routers flood for a
#: while, which is safe but is not what is counted here).
STEADY = dataclasses.replace(FAST, info_interval=1.0, keepalive=1.0)
EACH = 500


@pytest.mark.parametrize("mode", ["interest", "flood"])
async def test_local_events_stay_on_their_router(mode: str) -> None:
    config = dataclasses.replace(STEADY, routing=mode)
    async with mesh(4, line(4), config=config) as routers:
        subs = []
        for i, r in enumerate(routers):
            got = Collector()
            r.subscribe(f'type == "line-{i}"', got)
            subs.append(got)
        await wait_for(lambda: routing_by_interest(routers), 10)
        before = [r.mesh.counters["events_in"] for r in routers]
        published: list[list[str]] = [[] for _ in routers]
        for k in range(EACH):
            for i, r in enumerate(routers):
                ev = r.publish({"k": k}, type=f"line-{i}")
                assert ev is not None and ev.id is not None
                published[i].append(ev.id)
        await wait_for(lambda: all(len(s.ids) >= EACH for s in subs), 20)
        # A last event from each end, for the far end: every event that travelled at all
        # (under flooding) came before it on the same links.
        last = routers[0].publish({"last": True}, type="line-3")
        assert last is not None
        await wait_for(lambda: last.id in subs[3].ids, 10)
        received = [r.mesh.counters["events_in"] - b for r, b in zip(routers, before)]
        for i, s in enumerate(subs):
            want = published[i] + ([last.id] if i == 3 else [])
            assert sorted(s.ids) == sorted(want)  # exactly once, and only its own
        if mode == "interest":
            # The last event crosses the line: one copy into each of r1, r2, r3.
            assert received == [0, 1, 1, 1], received
            dispatched = [r.counters["dispatched"] for r in routers]
            assert dispatched == [EACH + 1] * 4, dispatched  # its own, and the last one
        else:  # every router gets the others' events (the last copies may still be coming)

            def all_in() -> bool:
                return all(
                    r.mesh.counters["events_in"] - b >= 3 * EACH for r, b in zip(routers, before)
                )

            await wait_for(all_in, 20)
