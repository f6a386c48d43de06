"""Playing the office world live: a clock from wall time to world time, and a feed that hands
out the world's events as world time passes (what the bundled publishers publish).

The world clock runs `speed` times as fast as the wall clock from an origin: now, when that is
within office hours (weekdays 08:00–16:00 UTC), else the last weekday's 10:00 UTC — so a
demonstration in the evening still shows people at work.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from .world import OfficeWorld

__all__ = ["WorldClock", "office_origin", "feed", "MAX_CATCH_UP"]

#: Most world time one feed step covers. A container that was suspended (a laptop's lid
#: closed for an hour) skips what it missed beyond this instead of publishing it in a burst.
MAX_CATCH_UP: Final = timedelta(minutes=10)


def office_origin(now: datetime) -> datetime:
    """*now* if it is within office hours, else the last weekday's 10:00 UTC before it.

    >>> office_origin(datetime(2030, 1, 12, 20, tzinfo=timezone.utc)).isoformat()   # a Saturday
    '2030-01-11T10:00:00+00:00'
    """
    now = now.astimezone(UTC)
    if now.weekday() < 5 and 8 <= now.hour < 16:
        return now
    day = now.replace(hour=10, minute=0, second=0, microsecond=0)
    if day > now:
        day -= timedelta(days=1)
    while day.weekday() >= 5:
        day -= timedelta(days=1)
    return day


class WorldClock:
    """World time = origin + (wall time − wall start) × speed."""

    def __init__(
        self,
        *,
        speed: float = 1.0,
        origin: datetime | None = None,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not speed > 0:
            raise ValueError("speed must be positive")
        self.speed = float(speed)
        self._wall = wall
        self._wall0 = wall()
        self.origin = origin if origin is not None else office_origin(self._wall0)

    def now(self) -> datetime:
        return self.origin + (self._wall() - self._wall0) * self.speed


async def feed(
    world: OfficeWorld,
    clock: WorldClock,
    kinds: Collection[str],
    *,
    tick: float = 1.0,
    backfill: timedelta = timedelta(0),
) -> AsyncIterator[list[tuple[datetime, str, dict[str, Any]]]]:
    """Every *tick* seconds, the events of *kinds* that happened in the world since the last
    step (the first step reaches *backfill* into the past, so a publisher has something to
    say at once)."""
    last = clock.now() - backfill
    while True:
        now = clock.now()
        if now - last > MAX_CATCH_UP + backfill:
            last = now - MAX_CATCH_UP
        yield list(world.events(last, now, kinds=kinds))
        last = now
        await asyncio.sleep(tick)
