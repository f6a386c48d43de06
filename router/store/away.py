"""Missed while away: a client that lost its router subscribes again saying how long it was
away (`Subscribe.away`); the router counts the stored events each such subscription's
pattern matches in that time, among those its user may receive, and tells it
(`MissedAway`). Live events that were not persisted are gone; this counts only what a
subscription with history would get.

What is counted, for a re-subscribe at router time *now* that was away *a* seconds: the
stored events with a time stamp in ``[now - a, now]``, not expired, that the user's receive
permissions let through and the pattern matches (the replay's pure evaluation, a script
on a copy of its state: `PatternEngine.matches_prototype`, or `select` for worker patterns).
Nothing else is shown: a user never learns of events of types it may not receive.

Bounds (a client may claim to have been away since 1970, and subscribe many times):

- one scan per connection at a time: the re-subscribes of one connection, which come in
  one burst, wait for their turn together and share one read of the store, each counting
  over its own window; those that come during a scan share the next one;
- a scan reads at most `MAX_SCANNED` stored events, oldest of the window first, on the
  store's (time, id) index, `SCAN_CHUNK` a round trip, and evaluates patterns at most
  `MAX_MATCHED` times (fewer events for a connection with many subscriptions); past that
  each subscription is told "at least" (`more`). Its cost is thus bounded whatever the
  claim, and below what a subscribe with history since forever (which any subscriber may
  ask) already costs. `MAX_MATCHED` is the budget of a connection's scans one after the
  other; what comes once it is spent is told "unknown". The loop is given back every
  `MATCH_SLICE` evaluations;
- `MAX_SCANS` scans run at once in all; the others wait, holding only their requests;
- a request whose subscription ended while it waited is dropped unread, and at most
  `MAX_WAITING` wait per connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from aa.mesh import Event, StoreError, UsageError

from .expiry import event_time

if TYPE_CHECKING:
    from .service import StoreService

__all__ = ["AwayCounts", "MAX_SCANNED"]

log = logging.getLogger("aa.router.store")

#: Most stored events one scan reads (for all the re-subscribes of one connection): a few
#: tens of milliseconds of a worker thread and of matching; past it counts are "at least".
MAX_SCANNED: Final = 10_000
#: Pattern evaluations one scan may make (stored events × re-subscribes): a connection with
#: hundreds of subscriptions gets a shorter scan each, not hundreds of times the work.
MAX_MATCHED: Final = 200_000
#: Stored events read per round trip of a scan.
SCAN_CHUNK: Final = 2_500
#: Stored events matched against one subscription in one turn of the event loop.
MATCH_SLICE: Final = 250
#: Scans running at once in all (each holds at most one chunk).
MAX_SCANS: Final = 2
#: Requests one connection may have waiting for its scan: one per subscription is the
#: honest case; subscribing and unsubscribing in a loop must not grow the list without end.
MAX_WAITING: Final = 1_000

#: Told to a subscription: (count, more).
Tell = Callable[[int, bool], None]


@dataclass(slots=True)
class _Request:
    key: Any  # a subscriber: `active`, `receives`
    since: datetime
    tell: Tell
    count: int = 0


class AwayCounts:
    """Counts, per re-subscribe, the stored events missed while away (module docstring)."""

    def __init__(
        self,
        storage: StoreService,
        *,
        matches_prototype: Callable[[Hashable, Event], bool],
        select: Callable[[Hashable, list[Event]], Awaitable[list[Event]]] | None,
        counters: Counter[str],
    ) -> None:
        self.storage = storage
        self._matches = matches_prototype
        self._select = select
        self._counters = counters
        self._turns = asyncio.Semaphore(MAX_SCANS)
        #: Requests waiting for their connection's scan, by connection (or subscriber).
        self._waiting: dict[Any, list[_Request]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._serving: set[Any] = set()  # connections whose scans run or wait

    def request(self, key: Any, away: float, tell: Tell) -> bool:
        """Count for subscriber *key*, away *away* seconds, then `tell(count, more)` (not
        told when its subscription ended meanwhile). False when this router keeps no store
        (it cannot know, and says nothing), or when too many requests of its connection wait."""
        if self.storage.store is None:
            return False
        since = self.storage.clock() - timedelta(seconds=away)
        owner = getattr(key, "session", key)
        queued = self._waiting.setdefault(owner, [])
        if len(queued) >= MAX_WAITING:
            queued[:] = [r for r in queued if r.key.active]
            if len(queued) >= MAX_WAITING:
                self._counters["away_refused"] += 1
                return False
        queued.append(_Request(key, since, tell))
        if owner not in self._serving:
            self._serving.add(owner)
            task = asyncio.get_running_loop().create_task(self._serve(owner))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return True

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, owner: Any) -> None:
        """The scans of one connection, one after the other: the requests waiting when a
        scan starts share it; those that came during it share the next, out of what is
        left of `MAX_MATCHED` (then they are told "unknown": nothing counted, more)."""
        budget = MAX_MATCHED
        try:
            while budget > 0:
                async with self._turns:
                    requests = [r for r in self._waiting.pop(owner, []) if r.key.active]
                    if not requests:
                        return
                    try:
                        more, used = await self._scan(requests, budget)
                    except (StoreError, UsageError) as exc:
                        log.info("missed-while-away count not made: %s", exc)
                        return
                budget -= used
                for r in requests:
                    if r.key.active:
                        r.tell(r.count, more)
            for r in self._waiting.pop(owner, []):
                if r.key.active:
                    r.tell(0, True)
        finally:
            self._waiting.pop(owner, None)
            self._serving.discard(owner)

    async def _scan(self, requests: list[_Request], budget: int) -> tuple[bool, int]:
        """Count into each request: whether the scan stopped short (more stored), and the
        pattern evaluations it may have cost."""
        store = self.storage.store
        if store is None:
            raise UsageError("the store closed")
        now = self.storage.clock()
        since = min(r.since for r in requests)
        most = max(1, min(MAX_SCANNED, budget // len(requests)))
        scanned = 0
        async for chunk in store.iterate(None, since=since, now=now, chunk=SCAN_CHUNK):
            stop = scanned + len(chunk) >= most
            chunk = chunk[: most - scanned]
            scanned += len(chunk)
            times = [event_time(e) for e in chunk]
            if times and times[0] is not None and times[0] > now:
                break  # stored after the re-subscribe: delivered live, not missed
            for r in requests:
                if r.key.active:
                    r.count += await self._matching(r, chunk, times, now)
            if stop:
                self._counters["away_scans_capped"] += 1
                return True, scanned * len(requests)
        return False, scanned * len(requests)

    async def _matching(
        self, r: _Request, chunk: list[Event], times: list[datetime | None], now: datetime
    ) -> int:
        """How many of *chunk* fall in *r*'s window, pass its receive filter and match."""
        receives = getattr(r.key, "receives", None)
        mine = [
            e
            for e, t in zip(chunk, times, strict=True)
            if (t is None or r.since <= t <= now) and (receives is None or receives(e.type))
        ]
        n = 0
        try:
            for start in range(0, len(mine), MATCH_SLICE):
                part = mine[start : start + MATCH_SLICE]
                if self._select is not None:
                    n += len(await self._select(r.key, part))
                else:
                    n += sum(1 for e in part if self._matches(r.key, e))
                await asyncio.sleep(0)  # the loop is given back between slices
        except UsageError:
            return 0  # unsubscribed meanwhile: not told anyway
        return n
