"""The router's storage (Å §4.5): the persistent store, the mesh cache and the event log, wired
into dispatch; acknowledgements of persisted publishes; history queries. One
`StorageService` per `Router` (`router.storage`); client caches are `router.caches`
(`aa.router.caching`), history replay on subscribe is `aa.router.history`.

Where events go
---------------
One sink on `Router.dispatch`, which runs once per event per router — for a local client's
event and for a peer's flood alike, so every router keeps its own copy of every persisted
event (replication is the flood itself):

- the store, when the event's meta asks for it (`aa.router.policy`): `put_nowait` only
  queues; the store's writer thread writes in batches, off the event loop;
- the mesh cache, unless the publisher opted out (``mesh_cache: False``);
- the event log (on whenever there is a data folder): collected here and handed over once
  per batch, like the mesh cache's; its own process writes them (`aa.router.eventlog`).

Acknowledging persisted publishes (the durability promise)
----------------------------------------------------------
A client's `Publish` frame holding an event that asks to be persisted is acknowledged only
once `EventStore.flush()` returned, i.e. once the event is committed; so an event whose
publish was acknowledged survives `kill -9` of the router. Acks are cumulative, so they must
leave in order: while a persisted frame of a session waits for its flush, the session's later
frames (persisted or not) queue behind it, and each is handed to the mesh's own ack rule
(`MeshService.ack_when_flooded`: after the floods are written) once everything before it is
durable. A session with nothing waiting takes the direct path: no queue, no task, no cost.
A frame whose event the store refused (`StoreFull`) is still acknowledged — the events were
delivered and flooded — after an `Error(code="not-persisted")` that names what was not kept.

Bad policies (a negative age, a zero count, an unknown unit, a count on an untyped event)
are refused before dispatch: the event is dropped and the publisher gets
`Error(code="invalid-policy")` with the reason; the rest of its frame goes on. A peer's
event with a bad policy (another version) is delivered but not stored.

Cost
----
Measured with `tests/bench/bench_store.py` (router CPU per event; bench_router's run):

- the non-persisted path adds a dictionary lookup per frame and two meta look-ups per event;
- the mesh cache (on by default) costs about 1 µs per event, some 15% of a relaying
  router's 7 µs: events are collected here and encoded per batch (`aa.router.meshcache`);
- the event log (on with a data folder) costs the router under 1 µs per event: it takes the
  mesh cache's encoding of each batch (`flush_cache`) and its own process does the rest;
  a writer thread, as it first had, took the router from 7.8 to 24 µs per event (see
  `aa.router.eventlog` for the figures and the designs measured).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Final, Sequence

from aa.mesh import Event, InvalidPolicy, PatternSpec, StoreError, UsageError
from aa.mesh import MAX_ID_LENGTH, META_HISTORICAL, META_TIME
from aa.mesh.protocol import Error, Message
from aa.mesh.protocol import MAX_ANSWER_EVENTS, Cached, GetCached

from .eventlog import EventLog
from .history import HistoryReplay
from .meshcache import MeshCache, encode_events
from .policy import META_MAX_AGE, META_MAX_COUNT, META_MESH_CACHE, META_PERSIST, persist_policy
from .store import MAX_STORED_TYPE_LENGTH, EventStore

if TYPE_CHECKING:
    from .router import Router
    from .session import ClientSession

__all__ = ["StorageService", "as_spec", "check_since", "send_paged", "mark_historical"]

log = logging.getLogger("aa.router.storage")

#: Seconds between two warnings about events the store refused (full, or gone).
REFUSED_LOG_INTERVAL: Final = 30.0
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=timezone.utc)


def as_spec(pattern: str | PatternSpec) -> PatternSpec:
    """*pattern* as a `PatternSpec` (a str is a python expression)."""
    if isinstance(pattern, PatternSpec):
        return pattern
    if isinstance(pattern, str):
        return PatternSpec(source=pattern)
    raise UsageError(f"a pattern is a PatternSpec or an expression (str), not {type(pattern).__name__}")


def check_since(since: object) -> datetime | None:
    """*since* if it is None or an aware datetime; `UsageError` otherwise (a naive time is
    ambiguous: whose clock?)."""
    if since is None:
        return None
    if type(since) is not datetime:
        raise UsageError(f"since must be a datetime with a time zone, or None; not {type(since).__name__}")
    if since.tzinfo is None:
        raise UsageError("since must be an aware datetime (with a time zone), e.g. datetime.now(timezone.utc)")
    return since


def mark_historical(event: Event) -> Event:
    """A copy of *event* marked as replayed rather than live (`META_HISTORICAL`)."""
    meta = dict(event.meta)
    meta[META_HISTORICAL] = True
    return Event.trusted(event.values, event.type, meta, event.id)


def _order(event: Event) -> tuple[datetime, str]:
    t = event.meta.get(META_TIME)
    return (t if type(t) is datetime and t.tzinfo is not None else _EPOCH, event.id or "")


def send_paged(
    session: "ClientSession", events: Sequence[Event], build: Callable[[list[Event], bool], Message]
) -> None:
    """Send *events* as `build(chunk, partial)` frames of at most `MAX_ANSWER_EVENTS`,
    halving a chunk that would outgrow the frame cap; the last frame has partial False."""
    chunks = [list(events[i : i + MAX_ANSWER_EVENTS]) for i in range(0, len(events), MAX_ANSWER_EVENTS)] or [[]]
    for n, chunk in enumerate(chunks):
        _send_split(session, chunk, build, n < len(chunks) - 1)


def _send_split(
    session: "ClientSession", chunk: list[Event], build: Callable[[list[Event], bool], Message], partial: bool
) -> None:
    try:
        session.send(build(chunk, partial))
    except UsageError:  # over the frame cap
        if len(chunk) <= 1:
            log.warning("an event too large to answer with was left out for %s", session.client_id)
            if not partial:
                session.send(build([], False))
            return
        half = len(chunk) // 2
        _send_split(session, chunk[:half], build, True)
        _send_split(session, chunk[half:], build, partial)


class StorageService:
    """The store, the mesh cache and the event log of one router. See the module docstring."""

    def __init__(self, router: "Router") -> None:
        self.router = router
        config = router.config
        #: The persistent store, once started (None: this router keeps none).
        self.store: EventStore | None = None
        cc = config.caches
        #: The mesh cache (None when `CacheConfig.mesh_cache_events` is 0).
        self.mesh_cache: MeshCache | None = (
            MeshCache(max_events=cc.mesh_cache_events, max_bytes=cc.mesh_cache_bytes) if cc.mesh_cache else None
        )
        #: The event log, once started (None: off).
        self.event_log: EventLog | None = None
        self.counters: Counter[str] = Counter()
        #: Events the store refused (full, gone); compared around a publish to tell its client.
        self.refused = 0
        self._last_refused_log = -REFUSED_LOG_INTERVAL
        # Per session: [seq, ready] of frames whose acks wait for a store flush, in order.
        self._acks: dict["ClientSession", deque[list[Any]]] = {}
        self._sink: Callable[[Event], None] | None = None
        self._cache_pending: list[Event] = []  # for the mesh cache, at the end of the batch
        self._log_pending: list[Event] = []  # for the event log, at the end of the batch
        self.replay = HistoryReplay(self)

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store and the event log (as configured), then attach to dispatch. Raises
        `StoreUnavailable` when the store cannot be opened."""
        config = self.router.config
        if config.store is not None and (config.store.url is not None or config.data_dir is not None):
            store = EventStore(config.store, data_dir=config.data_dir)
            try:
                await store.start()
            except (StoreError, UsageError):
                raise
            except Exception as exc:  # a URL SQLAlchemy cannot read, a driver not installed
                where = f"the store URL {config.store.url!r}" if config.store.url else f"the data folder {config.data_dir}"
                raise UsageError(f"cannot use {where} for the event store: {exc}") from exc
            self.store = store
        if config.event_log is not None and config.data_dir is not None:
            elog = EventLog(config.event_log, data_dir=config.data_dir, router_id=self.router.id)
            try:
                await elog.start()
            except BaseException:
                if self.store is not None:
                    await self.store.aclose()
                raise
            self.event_log = elog
        self._sink = self._make_sink()
        if self._sink is not None:
            self.router.sinks.append(self._sink)
        self.router.on_subscribe.append(self.replay.on_subscribe)

    async def aclose(self) -> None:
        """Stop replays, write what is queued, close the store and the log. Idempotent."""
        if self._sink is not None and self._sink in self.router.sinks:
            self.router.sinks.remove(self._sink)
        self.flush_cache()
        await self.replay.aclose()
        store, elog = self.store, self.event_log
        try:
            if store is not None:
                if self._acks:  # acks waiting for the store go out before the goodbyes
                    try:
                        async with asyncio.timeout(self.router.config.shutdown_grace):
                            await store.flush()  # wakes the waiting acks first (same seq order)
                    except (TimeoutError, StoreError):
                        pass
                self.store = None
                await store.aclose()
        finally:
            self.store = self.event_log = None
            self._acks.clear()
            if elog is not None:
                await elog.aclose()

    # -- dispatch ---------------------------------------------------------------------------

    def _make_sink(self) -> Callable[[Event], None] | None:
        """One function for the three sinks, specialised on which of them exist: it runs for
        every event this router dispatches. Mesh-cache and event-log events are collected and
        handed over once the batch being dispatched is done (`flush_cache`): one encoding
        call per batch instead of one per event, shared by the two (see
        `aa.router.meshcache`, `aa.router.eventlog`)."""
        store = self.store
        log_on = self.event_log is not None
        log_pending = self._log_pending
        persist = self._persist
        pending = self._cache_pending
        cache_on = self.mesh_cache is not None
        call_soon = asyncio.get_running_loop().call_soon
        flush_cache = self.flush_cache
        if store is None and not cache_on and not log_on:
            return None

        def sink(event: Event) -> None:
            meta = event.meta
            if store is not None and META_PERSIST in meta:
                persist(event)
            cached = cache_on and meta.get(META_MESH_CACHE) is not False
            if not pending and not log_pending and (cached or log_on):
                call_soon(flush_cache)
            if cached:
                pending.append(event)
            if log_on:
                log_pending.append(event)

        return sink

    def flush_cache(self) -> None:
        """Put the events collected for the mesh cache into it now, and hand the event log
        those collected for it. Both lists fill and empty together, the cache's holding the
        log's events but those opted out of it: when they are as long, they are the same
        events (the usual case), encoded once for both."""
        pending, log_pending = self._cache_pending, self._log_pending
        encoded = None
        if pending and self.mesh_cache is not None:
            encoded = encode_events(pending)
            self.mesh_cache.add_many(pending, encoded=encoded)
        if log_pending and self.event_log is not None:
            same = len(log_pending) == len(pending)
            self.event_log.extend(log_pending, encoded=encoded if same else None)
        pending.clear()
        log_pending.clear()

    def _persist(self, event: Event) -> None:
        store = self.store
        if store is None:
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
                log.error("the store refused event %s (%d refused so far): %s", event.id, self.refused, exc)

    # -- publishes from clients -------------------------------------------------------------

    def screen(self, session: "ClientSession", events: Sequence[Event]) -> tuple[Sequence[Event], bool]:
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
                    session.send(Error(code="invalid-policy", message=f"event {ev.id} refused: {exc}"))
                    continue
                if meta.get(META_PERSIST) is True:
                    persisted = True
        if bad:
            self.counters["invalid_policy"] += len(bad)
            drop = set(bad)
            events = [e for i, e in enumerate(events) if i not in drop]
        return events, persisted and self.store is not None

    def ack_publish(self, session: "ClientSession", seq: int, persisted: bool, refused_before: int) -> None:
        """Acknowledge *session*'s frame *seq* when it may be (see the module docstring)."""
        mesh = self.router.mesh
        if persisted and self.refused != refused_before:
            n = self.refused - refused_before
            session.send(Error(code="not-persisted", message=f"the store refused {n} event(s) of this publish "
                               f"(store full or unavailable): they were delivered but are not kept"))  # fmt: skip
        chain = self._acks.get(session)
        if chain is None:
            if not persisted:
                mesh.ack_when_flooded(session, seq)
                return
            chain = self._acks[session] = deque()
        entry = [seq, not persisted]
        chain.append(entry)
        if persisted:
            mesh.flush()  # the floods go now; only the ack waits
            assert self.store is not None
            fut = asyncio.ensure_future(self.store.flush())
            fut.add_done_callback(lambda f: self._flushed(session, entry, f))

    def _flushed(self, session: "ClientSession", entry: list[Any], fut: "asyncio.Future[None]") -> None:
        chain = self._acks.get(session)
        if chain is None:
            return  # closed meanwhile
        if fut.cancelled() or fut.exception() is not None:
            exc = None if fut.cancelled() else fut.exception()
            log.error("store flush failed; closing %s so it publishes again: %s", session.client_id, exc)
            del self._acks[session]
            session.fail("store-unavailable", f"the event store cannot write: {exc}")
            return
        entry[1] = True
        last = None
        while chain and chain[0][1]:
            last = chain.popleft()[0]
        if not chain:
            del self._acks[session]
        if last is not None:
            self.router.mesh.ack_when_flooded(session, last)

    def session_closed(self, session: "ClientSession") -> None:
        self._acks.pop(session, None)

    # -- queries ----------------------------------------------------------------------------

    async def history(
        self,
        pattern: str | PatternSpec,
        *,
        since: datetime | None = None,
        limit: int | None = None,
        include_cache: bool = True,
    ) -> list[Event]:
        """Stored (and, with *include_cache*, mesh-cached) events *pattern* matches, time at
        or after *since*, oldest first, each once, at most *limit*; marked historical."""
        since = check_since(since)
        if limit is not None and (type(limit) is not int or limit < 0):
            raise UsageError(f"limit must be a non-negative int or None, not {limit!r}")
        match = self.router.engine.matcher(as_spec(pattern))
        found: dict[str, Event] = {}
        if self.store is not None:
            for ev in await self.store.query(match, since=since, limit=limit):
                found[ev.id or ""] = ev
        if include_cache and self.mesh_cache is not None:
            self.flush_cache()
            for ev in self.mesh_cache.query(match, since=since, limit=limit):
                found.setdefault(ev.id or "", ev)
        events = sorted(found.values(), key=_order)
        if limit is not None:
            del events[limit:]
        return [mark_historical(e) for e in events]

    def cached(self, pattern: str | PatternSpec, *, since: datetime | None = None, limit: int | None = None) -> list[Event]:
        """Mesh-cached events *pattern* matches (time at or after *since*), oldest first, at
        most *limit*; marked historical. Raises `PatternError`, `UsageError`."""
        since = check_since(since)
        if self.mesh_cache is None:
            return []
        match = self.router.engine.matcher(as_spec(pattern))
        self.flush_cache()
        return [mark_historical(e) for e in self.mesh_cache.query(match, since=since, limit=limit)]

    # -- requests from clients --------------------------------------------------------------

    def handle_request(self, session: "ClientSession", msg: Message) -> None:
        """A storage request from a client (`aa.mesh.protocol.storage_messages`)."""
        if type(msg) is GetCached:
            req = msg.req  # type: ignore[attr-defined]
            try:
                events = self.cached(msg.pattern, since=msg.since, limit=msg.limit)  # type: ignore[attr-defined]
            except UsageError as exc:
                session.send(Error(code=getattr(exc, "code", "bad-request"), message=str(exc), ref=req))
                return
            except Exception as exc:  # PatternError (a RemoteError) carries its code
                session.send(Error(code=getattr(exc, "code", "error"), message=str(exc), ref=req))
                return
            send_paged(session, events, lambda chunk, partial: Cached(req=req, events=chunk, partial=partial))
        else:
            self.router.caches.handle_request(session, msg)

    def stats(self) -> dict[str, Any]:
        """Sizes and counters, for the monitor."""
        out: dict[str, Any] = {"counters": dict(self.counters)}
        if self.store is not None:
            s = self.store.stats()
            out["store"] = {"healthy": s.healthy, "pending": s.pending, "written": s.written,
                            "failures": s.failures, "expired": s.expired}  # fmt: skip
        if self.mesh_cache is not None:
            out["mesh_cache"] = {"events": len(self.mesh_cache), "bytes": self.mesh_cache.bytes}
        if self.event_log is not None:
            e = self.event_log.stats()
            out["event_log"] = {"rows": e.rows, "files": e.files, "dropped": e.dropped}
        return out


def check_persistable(event: Event) -> None:
    """Raise `InvalidPolicy` (or `UsageError`) unless the store policy *event*'s meta asks
    for is well formed and the event can be stored."""
    policy = persist_policy(event)
    if policy is not None:
        t = event.type
        if t is not None and (len(t) > MAX_STORED_TYPE_LENGTH or "\x00" in t):
            raise UsageError(f"a persisted event's type must be at most {MAX_STORED_TYPE_LENGTH} characters, no NUL")
        if event.id is not None and (len(event.id) > MAX_ID_LENGTH or "\x00" in event.id):
            raise UsageError("a persisted event's id may not hold NUL")
