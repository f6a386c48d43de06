"""Bundled add-in: the office phones' positions and scans (``position``: Node, Building, Floor,
X, Y; ``wifi-scan`` and ``bt-scan``), from the simulated office world."""

from __future__ import annotations

from aa.addins import AddIn, Context
from aa.addins.office.feed import WorldClock, feed
from aa.addins.office.world import OfficeWorld

SETTINGS = {"seed": 0, "speed": 1.0, "tick": 1.0, "people": 12}


class Phones(AddIn):
    async def start(self, ctx: Context) -> None:
        ctx.spawn(self.publish(ctx))

    async def publish(self, ctx: Context) -> None:
        s = ctx.settings
        world = OfficeWorld(seed=int(s["seed"]), people=int(s["people"]))
        clock = WorldClock(speed=float(s["speed"]))
        async for batch in feed(world, clock, {"position", "wifi-scan", "bt-scan"}, tick=float(s["tick"])):
            for when, kind, values in batch:
                if values["Node"].startswith("phone-"):
                    await ctx.client.publish(values, type=kind, meta={"sim_time": when})
