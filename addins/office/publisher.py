"""What the simulated office's publishers share: run the world model against a clock and
publish the events of some kinds from some nodes."""

from __future__ import annotations

from typing import ClassVar

from aa.addins import AddIn, Context

from .feed import WorldClock, feed
from .world import OfficeWorld

__all__ = ["WorldPublisher"]


class WorldPublisher(AddIn):
    """Publishes the world's events of `kinds` whose `Node` starts with `node_prefix`.

    Settings: `seed`, `speed` (simulated seconds per real second), `tick` (seconds between
    batches), `people`.
    """

    kinds: ClassVar[frozenset[str]]
    node_prefix: ClassVar[str]

    async def start(self, ctx: Context) -> None:
        ctx.spawn(self.publish(ctx))

    async def publish(self, ctx: Context) -> None:
        s = ctx.settings
        world = OfficeWorld(seed=int(s["seed"]), people=int(s["people"]))
        clock = WorldClock(speed=float(s["speed"]))
        async for batch in feed(world, clock, set(self.kinds), tick=float(s["tick"])):
            for when, kind, values in batch:
                if values["Node"].startswith(self.node_prefix):
                    await ctx.client.publish(values, type=kind, meta={"sim_time": when})
