"""Bundled add-in: an adapter (Å §2) that republishes ``quote`` events {StockSymbol, Price,
Currency} as ``ticker`` events {Symbol, Last, Ccy}, for subscribers written against the other
schema. It listens for quotes only while someone is interested in tickers (quenching), so
that a ticker subscriber wakes the adapter, which in turn wakes the quote publisher."""

from __future__ import annotations

from aa.addins import AddIn, Context
from aa.mesh import Event

SETTINGS: dict[str, object] = {}
#: What a ticker event looks like, for quenching.
PROTOTYPE = {"Symbol": "ABB", "Last": 45.0, "Ccy": "CHF"}
#: Quote attribute → ticker attribute.
MAPPING = {"StockSymbol": "Symbol", "Price": "Last", "Currency": "Ccy"}


class TickerAdapter(AddIn):
    async def start(self, ctx: Context) -> None:
        self.ctx = ctx
        self.interest = await ctx.client.quench(PROTOTYPE, type="ticker")
        ctx.spawn(self.adapt(ctx))

    async def adapt(self, ctx: Context) -> None:
        while True:
            await self.interest.wait_interested()
            sub = await ctx.client.subscribe(
                'type == "quote" and StockSymbol and Price', self.republish
            )
            ctx.log.info("someone wants tickers: adapting quotes")
            await self.interest.wait_uninterested()
            await sub.aclose()

    def republish(self, event: Event) -> None:
        values = {new: event.values[old] for old, new in MAPPING.items() if old in event.values}
        self.ctx.client.publish_nowait(values, type="ticker", meta={"adapted_from": event.id})
