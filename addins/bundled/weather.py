"""Bundled add-in: the office's weather (``weather`` events: City, TemperatureC, Humidity,
Condition), from the simulated office world, always published."""

from __future__ import annotations

from datetime import timedelta

from aa.addins import AddIn, Context
from aa.addins.office import WEATHER_INTERVAL, OfficeWorld, WorldClock, feed

SETTINGS = {"seed": 0, "speed": 1.0, "tick": 1.0}


class Weather(AddIn):
    async def start(self, ctx: Context) -> None:
        ctx.spawn(self.publish(ctx))

    async def publish(self, ctx: Context) -> None:
        s = ctx.settings
        world = OfficeWorld(seed=int(s["seed"]))
        clock = WorldClock(speed=float(s["speed"]))
        # Reach one reading back, so a subscriber sees the weather at once.
        async for batch in feed(world, clock, {"weather"}, tick=float(s["tick"]),
                                backfill=timedelta(seconds=WEATHER_INTERVAL)):
            for when, kind, values in batch:
                await ctx.client.publish(values, type=kind, meta={"sim_time": when})
