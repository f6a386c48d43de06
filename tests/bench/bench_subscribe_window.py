"""How long a new subscription waits before events from the far side reach it, with real
routers on loopback (in one process, interest routing, the tests' short intervals).

    python tests/bench/bench_subscribe_window.py                 # a line of 5, 20 rounds
    python tests/bench/bench_subscribe_window.py --routers 4 --rounds 10

Each round, once every router is settled (routing by the tree), the far router subscribes
to a new type; the near router publishes one event of that type on every turn of the loop.
The window is the time from `subscribe()` returning to the near router's view holding the
new interest (the debounce, then one flood over the line); events published in it may be
lost for the new subscription, every later one must arrive
(`tests/test_mesh_interest_subscribe.py` holds that).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import FAST, Collector, line, mesh, next_turn, wait_for

from aa.mesh import Interest, InterestFilter
from aa.router import Router


def settled(routers: list[Router]) -> bool:
    """Every router routes by the tree (not flooding after a change)."""
    now = time.monotonic()
    return all(
        r.mesh.interests.table.settled(now)
        and r.mesh.interests.table.view.complete
        and len(r.mesh.interests.table.view) == len(routers)
        for r in routers
    )


def knows(router: Router, rid: str, wanted: Interest) -> bool:
    interest = router.mesh.interests.table.view.interest(rid)
    return interest is not None and interest.covers(wanted)


async def measure(routers: int, rounds: int) -> dict[str, float]:
    config = dataclasses.replace(FAST, routing="interest")
    windows: list[float] = []
    published = lost = 0
    async with mesh(routers, line(routers), config=config) as rs:
        near, far = rs[0], rs[-1]
        for k in range(rounds):
            kind = f"new{k}"
            wanted = Interest.of([InterestFilter(type=kind)])
            await wait_for(lambda rs=rs: settled(rs), 10)  # else the near router floods
            got = Collector()
            far.subscribe(f'type == "{kind}"', got)
            returned = time.monotonic()
            window: list[str] = []
            after: list[str] = []
            while len(after) < 20:
                known = knows(near, far.id, wanted)
                ev = near.publish({"k": k}, type=kind)
                assert ev is not None and ev.id is not None
                (after if known else window).append(ev.id)
                if known and len(after) == 1:
                    windows.append(time.monotonic() - returned)
                await next_turn()
            await wait_for(lambda after=after, got=got: set(after) <= set(got.ids), 10)
            published += len(window)
            lost += len(set(window) - set(got.ids))
    return {
        "median": statistics.median(windows),
        "max": max(windows),
        "published": published,
        "lost": lost,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--routers", type=int, default=5)
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args()
    r = asyncio.run(measure(args.routers, args.rounds))
    print("| routers (a line) | hops | window, median (ms) | max (ms) | events in it | lost |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {args.routers} | {args.routers - 1} | {1000 * r['median']:.1f} | "
        f"{1000 * r['max']:.1f} | {r['published']} | {r['lost']} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
