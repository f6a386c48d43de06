"""Quenching over a line of real routers (loopback sockets, one process): how long a publisher
at one end takes to hear of a subscriber at the other end appearing and going, and how many
control messages cross the links for it, under interest routing (answers from the summaries)
and under flooding (Å's flooded registrations and reports).

    python tests/bench/bench_quench.py                         # lines of 3 and 6, 20 cycles
    python tests/bench/bench_quench.py --routers 3 6 10 --cycles 50
    python tests/bench/bench_quench.py --gap 0                 # changes back to back

A cycle: the subscriber subscribes at the far end, the publisher's registration hears of it
(`wait_interested`), the subscriber unsubscribes, the registration hears of that
(`wait_uninterested`). Times are medians from the client's call returning to the notice;
messages are control messages received on links per cycle (every router counted), split
into quench controls and the rest (summaries, mostly). Protocol intervals are the tests'
short ones (`support.FAST`: summaries repeated every 0.2 s), so periodic repeats are part of
"other"; the figures to compare are the quench column and the times. Each change comes
`--gap` seconds after the previous notice (0.1 by default): a router floods the first change
of its subscriptions after a quiet spell at once, and the others of a burst at most once per
`SUMMARY_DEBOUNCE` (20 ms), which `--gap 0` shows.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import FAST, line, mesh, routing_by_interest, wait_for

from aa.client import AsyncClient
from aa.mesh import Control
from aa.router.quench import QUENCH_TOPIC


async def run(n: int, routing: str, cycles: int, gap: float) -> dict[str, Any]:
    config = dataclasses.replace(FAST, routing=routing)
    async with (
        mesh(n, line(n), config=config) as rs,
        AsyncClient(rs[0].endpoint) as pub,
        AsyncClient(rs[-1].endpoint) as sub_client,
    ):
        seen: Counter[str] = Counter()
        for r in rs:
            inner = r.mesh.relay.receive_control

            def counting(link: Any, msg: Control, inner: Any = inner) -> None:
                seen[msg.topic] += 1
                inner(link, msg)

            r.mesh.relay.receive_control = counting  # type: ignore[method-assign]
        await wait_for(lambda: all(len(r.mesh.interests.table.view) == n for r in rs), 30)
        if routing == "interest":
            await wait_for(lambda: routing_by_interest(rs), 30)
        q = await pub.quench({"SnowDepth": 50}, type="snow")
        seen.clear()
        up, down = [], []
        for _ in range(cycles):
            await asyncio.sleep(gap)
            sub = await sub_client.subscribe('type == "snow" and SnowDepth > 10')
            t0 = time.monotonic()
            await q.wait_interested(timeout=30)
            up.append(time.monotonic() - t0)
            await asyncio.sleep(gap)
            await sub.aclose()
            t0 = time.monotonic()
            await q.wait_uninterested(timeout=30)
            down.append(time.monotonic() - t0)
        quench = seen[QUENCH_TOPIC]
        return {
            "up_ms": 1000 * statistics.median(up),
            "down_ms": 1000 * statistics.median(down),
            "quench_per_cycle": quench / cycles,
            "other_per_cycle": (sum(seen.values()) - quench) / cycles,
        }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routers", type=int, nargs="+", default=[3, 6])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between changes")
    args = parser.parse_args()
    print(
        "| routers | routing | subscribe → told (ms) | unsubscribe → told (ms) "
        "| quench msgs/cycle | other msgs/cycle | load |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in args.routers:
        for routing in ("interest", "flood"):
            got = await run(n, routing, args.cycles, args.gap)
            load = os.getloadavg()[0]
            print(
                f"| {n} | {routing} | {got['up_ms']:.1f} | {got['down_ms']:.1f} "
                f"| {got['quench_per_cycle']:.1f} | {got['other_per_cycle']:.1f} | {load:.1f} |"
            )


if __name__ == "__main__":
    asyncio.run(main())
