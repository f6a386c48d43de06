"""The persistent store of one router (Å §4.5), wired into dispatch: which events it keeps,
the policies it refuses, history on subscribe, and history queries. One `StoreService` per
`Router` (`router.storage`).

Where events go
---------------
Every router keeps its own copy of every persisted event: the store is one of the sinks of
dispatch (`aa.router.sinks`), which runs once per event per router — for a local client's
event and for a peer's flood alike — so replication is the flood itself. `persist` only
queues (`EventStore.put_nowait`); the store's writer thread writes in batches, off the event
loop. A publish that asked for persistence is acknowledged once committed: that rule is
`aa.router.acks`, which awaits `flush`.

Bad policies (a negative age, a zero count, an unknown unit, a count on an untyped event)
are refused before dispatch (`screen`): the event is dropped and the publisher gets
``Error(code="invalid-policy")`` with the reason; the rest of its frame goes on. A peer's
event with a bad policy (another version) is delivered but not stored. An event that asks
to be persisted through a router that keeps no store is delivered and flooded, and its
publisher is told ``Error(code="not-persisted")``: a silent success would be a lie.

What it does not own: the mesh cache (`aa.router.caches`), whose events `history` merges
in when asked; the acknowledgement rule (`aa.router.acks`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from aa.mesh import MAX_ID_LENGTH, Event, InvalidPolicy, PatternSpec, StoreError, UsageError
from aa.mesh.protocol import Error

from ..seams import ClientPort, Dispatch
from .answers import as_spec, check_since, event_order, mark_historical
from .away import AwayCounts
from .eventstore import MAX_STORED_TYPE_LENGTH, EventStore, StoreConfig
from .expiry import META_MAX_AGE, META_MAX_COUNT, META_PERSIST, expired_copies, persist_policy
from .history import HistoryReplay
from .sync import StoreSync

if TYPE_CHECKING:
    from ..caches import MeshCache  # the caches room imports this one: no cycle at run time

__all__ = ["StoreService", "check_persistable"]

log = logging.getLogger("aa.router.store")

#: Seconds between two warnings about events the store refused (full, or gone).
REFUSED_LOG_INTERVAL: Final = 30.0

#: A pattern compiled for a query: the engine's `matcher`.
Matcher = Callable[[Event], bool]


class StoreService:
    """The persistent store of one router. See the module docstring."""

    def __init__(
        self,
        config: StoreConfig | None,
        *,
        data_dir: Any,
        mesh_cache: MeshCache | None,
        matcher: Callable[[PatternSpec], Matcher],
        matches_prototype: Callable[[Hashable, Event], bool],
        select: Callable[[Hashable, list[Event]], Awaitable[list[Event]]] | None = None,
        dispatch: Dispatch,
        counters: Counter[str],
        router_id: str = "router",
        router_name: Callable[[], str] | None = None,
        flush_cache: Callable[[], None] = lambda: None,
    ) -> None:
        self._config = config
        self._data_dir = data_dir
        self._mesh_cache = mesh_cache
        self._matcher = matcher
        self._flush_cache = flush_cache
        self._name: Callable[[], str] = router_name or (lambda: router_id)
        #: The time expiry is measured with (an aware datetime), by the store and by history
        #: alike; tests replace it to move time.
        self.clock: Callable[[], datetime] = _utcnow
        #: The persistent store, once started (None: this router keeps none).
        self.store: EventStore | None = None
        self.counters: Counter[str] = Counter()
        #: Events the store refused (full, gone); compared around a publish to tell its client.
        self.refused = 0
        self._last_refused_log = -REFUSED_LOG_INTERVAL
        self.replay = HistoryReplay(
            self,
            matches_prototype=matches_prototype,
            dispatch=dispatch,
            counters=counters,
            select=select,
        )
        #: Stored events a re-subscribe missed while away (`aa.router.store.away`).
        self.away = AwayCounts(
            self, matches_prototype=matches_prototype, select=select, counters=counters
        )
        #: Anti-entropy with the peer routers' stores (`aa.router.store.sync`).
        self.sync = StoreSync(
            self, router_id, interval=config.sync_interval if config is not None else 0.0
        )

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store (as configured). Raises `StoreUnavailable` when it cannot be opened,
        `UsageError` for a URL or folder it cannot use."""
        config, data_dir = self._config, self._data_dir
        if config is None or (config.url is None and data_dir is None):
            return
        store = EventStore(config, data_dir=data_dir, clock=lambda: self.clock())
        try:
            await store.start()
        except (StoreError, UsageError):
            raise
        except Exception as exc:  # a URL SQLAlchemy cannot read, a driver not installed
            where = f"the store URL {config.url!r}" if config.url else f"the data folder {data_dir}"
            raise UsageError(f"cannot use {where} for the event store: {exc}") from exc
        self.store = store
        await self.sync.start()

    async def aclose(self) -> None:
        """Stop replays and syncs, write what is queued, close the store. Idempotent."""
        await self.sync.aclose()
        await self.replay.aclose()
        await self.away.aclose()
        store, self.store = self.store, None
        if store is not None:
            await store.aclose()

    async def flush(self) -> None:
        """Return once every event queued so far is committed (`aa.router.acks` awaits it)."""
        if self.store is not None:
            await self.store.flush()

    def no_store_note(self) -> str | None:
        """Why a history asked of this router is always empty (it keeps no store), in one
        line for the person who asked; None when it keeps one."""
        if self.store is not None:
            return None
        return (
            f"router {self._name()} keeps no store, so it has no history: events sent with "
            "--persist are delivered but not kept; start it with --data-dir or --store-url"
        )

    def on_subscribe(self, key: Hashable, history: Mapping[str, Any] | None) -> None:
        """A subscription was registered: replay its history if it asked."""
        self.replay.on_subscribe(key, history)

    def count_away(self, key: Hashable, away: float, tell: Callable[[int, bool], None]) -> bool:
        """*key* subscribed again after *away* seconds without a router: count the stored
        events it matches from then on and `tell(count, more)` (`aa.router.store.away`).
        False when this router keeps no store (nothing will be told)."""
        return self.away.request(key, away, tell)

    # -- dispatch ---------------------------------------------------------------------------

    def persist(self, event: Event) -> None:
        """Queue *event* for the store if its meta asks for it (a sink of dispatch)."""
        store = self.store
        if store is None or META_PERSIST not in event.meta:
            return
        try:
            policy = persist_policy(event)
        except InvalidPolicy:
            self.counters["bad_policy"] += 1  # a peer's event (ours are screened): not kept
            return
        if policy is None:
            return
        try:
            store.put_nowait(event, policy)
        except (StoreError, UsageError) as exc:
            self.refused += 1
            self.counters["not_persisted"] += 1
            now = time.monotonic()
            if now - self._last_refused_log >= REFUSED_LOG_INTERVAL:
                self._last_refused_log = now
                log.error(
                    "the store refused event %s (%d refused so far): %s",
                    event.id,
                    self.refused,
                    exc,
                )

    def keep(self, event: Event, *, repaired: bool = True) -> bool:
        """Store *event* as its policy asks, without dispatching it (an event another
        router's store had and this one lacked): the checks a flooded event's store policy
        passes, and stored as *repaired*, so a live event of its id replaces it
        (`aa.router.store.sql`). False if it is not kept (no store, no policy, a bad
        policy or id, the store refused it)."""
        store = self.store
        if store is None:
            return False
        try:
            check_persistable(event)
            policy = persist_policy(event)
            if policy is None or event.id is None:
                return False
            store.put_nowait(event, policy, repaired=repaired)
        except (StoreError, UsageError):
            self.counters["sync_refused"] += 1
            return False
        return True

    def screen(self, session: ClientPort, events: Sequence[Event]) -> tuple[Sequence[Event], bool]:
        """Check the store policies a client's events ask for: drop (and tell the client
        about) those that are malformed. Returns the events to accept, and whether one of
        them asks to be persisted here (its frame's ack then waits for the store)."""
        persisted = False
        bad: list[int] | None = None
        for i, ev in enumerate(events):
            meta = ev.meta
            if meta and (META_PERSIST in meta or META_MAX_AGE in meta or META_MAX_COUNT in meta):
                try:
                    check_persistable(ev)
                except UsageError as exc:
                    bad = bad or []
                    bad.append(i)
                    session.send(
                        Error(code="invalid-policy", message=f"event {ev.id} refused: {exc}")
                    )
                    continue
                if meta.get(META_PERSIST) is True:
                    persisted = True
        if bad:
            self.counters["invalid_policy"] += len(bad)
            drop = set(bad)
            events = [e for i, e in enumerate(events) if i not in drop]
        if persisted and self.store is None:
            asked = [e.id for e in events if e.meta.get(META_PERSIST) is True]
            self.counters["no_store"] += len(asked)
            more = f" (and {len(asked) - 1} more)" if len(asked) > 1 else ""
            session.send(
                Error(
                    code="not-persisted",
                    message=f"router {self._name()} has no store: event {asked[0]}{more} was "
                    "delivered but not kept; start it with --data-dir or --store-url",
                )
            )
        return events, persisted and self.store is not None

    # -- queries ----------------------------------------------------------------------------

    async def history(
        self,
        pattern: str | PatternSpec,
        *,
        since: datetime | None = None,
        limit: int | None = None,
        include_cache: bool = True,
        receives: Callable[[str | None], bool] | None = None,
        now: datetime | None = None,
    ) -> list[Event]:
        """Stored (and, with *include_cache*, mesh-cached) events *pattern* matches, time at
        or after *since*, oldest first, each once, at most *limit*; marked historical. With
        *receives* (a test of event types: what the asking user may receive) the pattern is
        shown only events that pass it, so its code never sees the others.

        Expiry is the one of the replay on subscribe, at *now* (default: `clock`): an event
        the publisher asked to persist is governed by its own policy wherever a copy lies.
        With a store, the store is its only source (it applies the age and the count limits;
        the mesh cache's copy is left out); without one, the cache's copies are held to the
        same limits (`expired_copies`)."""
        since = check_since(since)
        now = check_since(now) or self.clock()
        if limit is not None and (type(limit) is not int or limit < 0):
            raise UsageError(f"limit must be a non-negative int or None, not {limit!r}")
        matcher = self._matcher(as_spec(pattern))
        remote = getattr(matcher, "select", None)  # pattern code: matched in a worker, awaited
        match: Callable[[Event], bool] = matcher
        if receives is not None:
            allowed = receives

            def match(ev: Event) -> bool:
                return allowed(ev.type) and matcher(ev)

            if remote is not None:
                select = remote

                async def remote(chunk: list[Event]) -> list[Event]:
                    selected: list[Event] = await select([ev for ev in chunk if allowed(ev.type)])
                    return selected

        found: dict[str, Event] = {}
        if self.store is not None and remote:
            async for chunk in self.store.iterate(None, since=since, now=now):
                found.update((ev.id or "", ev) for ev in await remote(chunk))
                if limit is not None and len(found) >= limit:
                    break
        elif self.store is not None:
            for ev in await self.store.query(match, since=since, limit=limit, now=now):
                found[ev.id or ""] = ev
        if include_cache and self._mesh_cache is not None:
            self._flush_cache()
            cache = self._mesh_cache
            gone: Callable[[Event], bool]
            if self.store is not None:

                def gone(ev: Event) -> bool:
                    return ev.meta.get(META_PERSIST) is True

            else:
                expired = expired_copies(cache.query(_persisted), now)

                def gone(ev: Event) -> bool:
                    return ev.id in expired

            def cached_match(ev: Event) -> bool:
                return not gone(ev) and (remote is not None or match(ev))

            cached = cache.query(cached_match, since=since, limit=None if remote else limit)
            for ev in await remote(cached) if remote else cached:
                found.setdefault(ev.id or "", ev)
        events = sorted(found.values(), key=event_order)
        if limit is not None:
            del events[limit:]
        return [mark_historical(e) for e in events]

    def stats(self) -> dict[str, Any]:
        """Sizes and counters, for the monitor."""
        out: dict[str, Any] = {"counters": dict(self.counters), "sync": dict(self.sync.counters)}
        if self.store is not None:
            s = self.store.stats()
            out["store"] = {
                "healthy": s.healthy,
                "pending": s.pending,
                "written": s.written,
                "failures": s.failures,
                "expired": s.expired,
            }
        return out


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _persisted(event: Event) -> bool:
    return event.meta.get(META_PERSIST) is True


def check_persistable(event: Event) -> None:
    """Raise `InvalidPolicy` (or `UsageError`) unless the store policy *event*'s meta asks
    for is well formed and the event can be stored."""
    policy = persist_policy(event)
    if policy is not None:
        t = event.type
        if t is not None and (len(t) > MAX_STORED_TYPE_LENGTH or "\x00" in t):
            raise UsageError(
                f"a persisted event's type must be at most {MAX_STORED_TYPE_LENGTH} characters, no "
                "NUL"
            )
        if event.id is not None and (len(event.id) > MAX_ID_LENGTH or "\x00" in event.id):
            raise UsageError("a persisted event's id may not hold NUL")
