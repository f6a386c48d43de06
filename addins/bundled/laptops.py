"""Bundled add-in: the office laptops' Wi-Fi and Bluetooth scans (``wifi-scan``, ``bt-scan``:
Node, Radios [{Id, Name, Rssi}]), from the simulated office world."""

from __future__ import annotations

from aa.addins import AddIn, Context
from aa.addins.office.feed import WorldClock, feed
from aa.addins.office.world import OfficeWorld

SETTINGS = {"seed": 0, "speed": 1.0, "tick": 1.0, "people": 12}


class Laptops(AddIn):
    async def start(self, ctx: Context) -> None:
        ctx.spawn(self.publish(ctx))

    async def publish(self, ctx: Context) -> None:
        s = ctx.settings
        world = OfficeWorld(seed=int(s["seed"]), people=int(s["people"]))
        clock = WorldClock(speed=float(s["speed"]))
        async for batch in feed(world, clock, {"wifi-scan", "bt-scan"}, tick=float(s["tick"])):
            for when, kind, values in batch:
                if values["Node"].startswith("laptop-"):
                    await ctx.client.publish(values, type=kind, meta={"sim_time": when})
