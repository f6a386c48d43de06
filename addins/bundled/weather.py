"""Bundled add-in: the office's weather station (``weather`` events: City, TemperatureC,
Humidity, Condition), from the simulated office world, always published.

The world takes a reading per city every ten minutes (`WEATHER_INTERVAL`); the station
publishes the current conditions — each city's latest reading — every ``every`` seconds, as
a real station's display does, so that a newcomer's ``aa subscribe 'type == "weather"'``
prints events at once rather than after up to ten minutes. ``meta["sim_time"]`` is the time
of the reading.
"""

from __future__ import annotations

from aa.addins import AddIn, Context
from aa.addins.office import OfficeWorld, WorldClock

SETTINGS = {"seed": 0, "speed": 1.0, "every": 2.0}


class Weather(AddIn):
    async def start(self, ctx: Context) -> None:
        s = ctx.settings
        world = OfficeWorld(seed=int(s["seed"]))
        clock = WorldClock(speed=float(s["speed"]))

        async def publish() -> None:
            for when, values in world.weather_now(clock.now()):
                await ctx.client.publish(values, type="weather", meta={"sim_time": when})

        ctx.every(float(s["every"]), publish)
