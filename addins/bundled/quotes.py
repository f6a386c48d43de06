"""Bundled add-in: market quotes (``quote`` events: StockSymbol, Price, Currency), published
only while a subscription somewhere in the mesh matches the quench prototype (Å §4.4) —
a quote feed is paid for by the request."""

from __future__ import annotations

from datetime import timedelta

from aa.addins import AddIn, Context
from aa.addins.office import QUOTE_INTERVAL, OfficeWorld, WorldClock, feed

SETTINGS = {"seed": 0, "speed": 1.0, "tick": 1.0}
#: What a quote looks like, for quenching.
PROTOTYPE = {"StockSymbol": "ABB", "Price": 45.0, "Currency": "CHF"}


class Quotes(AddIn):
    async def start(self, ctx: Context) -> None:
        self.interest = await ctx.client.quench(PROTOTYPE, type="quote")
        ctx.spawn(self.publish(ctx))

    async def publish(self, ctx: Context) -> None:
        s = ctx.settings
        world = OfficeWorld(seed=int(s["seed"]))
        clock = WorldClock(speed=float(s["speed"]))
        while True:
            await self.interest.wait_interested()
            ctx.log.info("someone wants quotes: publishing")
            # The latest quotes at once, then as they come; stop as soon as nobody listens.
            async for batch in feed(
                world,
                clock,
                {"quote"},
                tick=float(s["tick"]),
                backfill=timedelta(seconds=QUOTE_INTERVAL),
            ):
                if not self.interest.interested:
                    break
                for when, kind, values in batch:
                    await ctx.client.publish(values, type=kind, meta={"sim_time": when})
            ctx.log.info("nobody wants quotes any more: quiet")
