"""The persistent event store (Å §4.5): events their publishers asked routers to keep,
replayed to subscribers when they register a pattern.

Every router stores every persisted event it dispatches (events flood, so each is
replicated at every router); a second copy of an id is ignored. The store runs over
SQLAlchemy 2.x: SQLite in the router's data folder by default, any SQLAlchemy URL
(``postgresql+psycopg://…``) otherwise. The schema and the durability reasoning are in
`aa.router.store.sql`.

The way an event goes::

    put_nowait(event, policy)     on the event loop: checks, computes times, enqueues
        │                         (a bounded queue: `StoreFull` when it is full)
        ▼
    worker thread                 takes up to `batch_size` events, writes them in ONE
        │                         transaction, applies count limits in it, then drops them
        │                         from the queue. On a lost connection or a full disk the
        │                         batch stays queued, the failure is logged and counted
        │                         (`healthy` False), and the write is retried with back-off.
        ▼
    await flush()                 returns once everything enqueued before the call is
                                  committed: the router acknowledges a persisted publish
                                  only then.

Expiry: a count limit is applied in the transaction that writes the event (keep the newest
N of the type); an age limit becomes `expires_us`, deleted every `expire_interval` and
filtered out of every query in between, so a query never returns an expired event.

`query` sees everything put before the call, written or still queued (queued events are
merged in), so a subscriber that registers a moment after an event was dispatched finds
it in the history rather than in neither the history nor the live stream.

The writer thread and its rules are in `aa.router.store.writer`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from aa.mesh import (
    MAX_ID_LENGTH,
    Event,
    InvalidPolicy,
    StoreError,
    StoreFull,
    StoreUnavailable,
    UsageError,
)

from .expiry import ExpiryPolicy, event_time
from .writer import Row, StoreStats, Writer, to_us

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = [
    "EventStore",
    "StoreConfig",
    "StoreStats",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "STORE_FILE",
    "MAX_STORED_TYPE_LENGTH",
]

log = logging.getLogger("aa.router.store")

#: File name of the default SQLite store, in the router's data folder.
STORE_FILE: Final = "events.db"
#: Events per transaction. Large enough that a commit (and its fsync) is paid by thousands
#: of events; small enough that one transaction stays well under a second.
DEFAULT_BATCH_SIZE: Final = 2_000
#: Longest a lone event waits for company before it is written, in seconds. `flush()` cuts
#: the wait short, so this bounds only the latency of events nobody waits for.
DEFAULT_FLUSH_INTERVAL: Final = 0.05
#: Events that may wait to be written (about 1 KiB each in memory). At 20,000 events/s this
#: is 10 s of a dead database; then `put_nowait` raises `StoreFull` rather than letting
#: memory grow without end or dropping events silently.
DEFAULT_MAX_PENDING: Final = 200_000
#: Seconds between two sweeps of age-expired events (queries filter them out in between).
DEFAULT_EXPIRE_INTERVAL: Final = 30.0
#: Back-off between retries of a failed write, in seconds: doubles from the first value
#: up to the second, so a dead server is not hammered and a brief blip costs little.
DEFAULT_RETRY_MIN: Final = 0.05
DEFAULT_RETRY_MAX: Final = 5.0
#: Seconds `aclose()` waits for queued events to be written before giving up loudly.
DEFAULT_CLOSE_TIMEOUT: Final = 30.0
#: Rows read per round trip when replaying: bounds memory, keeps each read short.
QUERY_CHUNK: Final = 5_000
#: Longest event type the store accepts, in characters. The type is indexed, and
#: PostgreSQL refuses index entries over ~2.7 KB; 256 characters is under that in any UTF-8.
MAX_STORED_TYPE_LENGTH: Final = 256
#: Seconds `aclose()` waits for the writer thread to end after its last write (a write
#: blocked on an unreachable server may hang in the driver; the thread is a daemon).
JOIN_TIMEOUT: Final = 10.0
_US = timedelta(microseconds=1)
T = TypeVar("T")


#: Seconds between anti-entropy exchanges with each peer: a store that missed events (a
#: restart, a partition) has them within this long even if no link went down and up.
DEFAULT_SYNC_INTERVAL: Final = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    """How the persistent store is kept.

    >>> StoreConfig(url="postgresql+psycopg://aa@127.0.0.1/aa").batch_size
    2000
    """

    #: SQLAlchemy URL; None for the SQLite file `STORE_FILE` in the router's data folder.
    url: str | None = None
    #: Most events written in one transaction.
    batch_size: int = DEFAULT_BATCH_SIZE
    #: Longest an event waits before its batch is written, in seconds.
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    #: Most events waiting to be written; beyond, `put_nowait` raises `StoreFull`.
    max_pending: int = DEFAULT_MAX_PENDING
    #: Seconds between sweeps of age-expired events.
    expire_interval: float = DEFAULT_EXPIRE_INTERVAL
    #: First wait before retrying a failed write, in seconds; it doubles on each failure.
    retry_min: float = DEFAULT_RETRY_MIN
    #: Longest wait between retries, in seconds.
    retry_max: float = DEFAULT_RETRY_MAX
    #: SQLite only: FULL survives power loss, NORMAL only a crashed process (see sql.py).
    sqlite_synchronous: Literal["FULL", "NORMAL"] = "FULL"
    #: Seconds between two anti-entropy exchanges with each peer router (also run when a
    #: link comes up; `aa.router.store.sync`); 0 for only when links come up.
    sync_interval: float = DEFAULT_SYNC_INTERVAL

    def __post_init__(self) -> None:
        if self.url is not None and (type(self.url) is not str or not self.url):
            raise UsageError("StoreConfig.url must be a SQLAlchemy URL, or None for SQLite")
        for name in ("batch_size", "max_pending"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise UsageError(f"StoreConfig.{name} must be a positive int, not {v!r}")
        if type(self.sync_interval) not in (int, float) or not self.sync_interval >= 0:
            raise UsageError(
                "StoreConfig.sync_interval must be a number of seconds ≥ 0, not "
                f"{self.sync_interval!r}"
            )
        for name in ("flush_interval", "expire_interval", "retry_min", "retry_max"):
            v = getattr(self, name)
            if type(v) not in (int, float) or not v > 0:
                raise UsageError(f"StoreConfig.{name} must be a positive number of seconds")
        if self.retry_max < self.retry_min:
            raise UsageError("StoreConfig.retry_max must be at least retry_min")
        if self.sqlite_synchronous not in ("FULL", "NORMAL"):
            raise UsageError("StoreConfig.sqlite_synchronous must be 'FULL' or 'NORMAL'")

    def resolve_url(self, data_dir: str | os.PathLike[str] | None) -> str | sa.URL:
        """The URL to open: `url`, or the SQLite file in *data_dir* (created if missing)."""
        if self.url is not None:
            return self.url
        if data_dir is None:
            raise UsageError("the event store needs StoreConfig.url or the router's data folder")
        folder = Path(data_dir)
        folder.mkdir(parents=True, exist_ok=True)
        import sqlalchemy as sa

        return sa.URL.create("sqlite", database=str(folder / STORE_FILE))


def _utcnow() -> datetime:
    return datetime.now(UTC)


class EventStore:
    """Events kept on disk for replay, written in batches off the event loop.

    >>> async def demo(tmp):
    ...     async with EventStore(StoreConfig(), data_dir=tmp) as store:
    ...         store.put_nowait(Event(values={"t": 1}, type="r", id="e1"), ExpiryPolicy())
    ...         await store.flush()                      # committed: ack the publish now
    ...         return await store.query(lambda e: e.values["t"] > 0)

    *clock* gives the current time (aware datetime) where no `now` is passed; tests pass
    `now` or a clock they move.
    """

    def __init__(
        self,
        config: StoreConfig | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.config = config if config is not None else StoreConfig()
        self._data_dir = data_dir
        self._clock = clock
        self._engine: sa.Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: Writer | None = None
        self._seq = 0  # seq of the last event put
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # (seq, tiebreak, fut)
        self._tiebreak = itertools.count()
        self._closed = False
        self._expired = 0  # by `expire()`; the writer counts its own sweeps

    # -- life ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the database, create the table if needed, start the writer.

        Raises `StoreUnavailable` when the database cannot be opened: a router with a
        wrong store URL should fail at start, not at the first persisted event.
        """
        if self._writer is not None or self._closed:
            raise UsageError("an EventStore is started once")
        self._loop = asyncio.get_running_loop()
        from .sql import make_engine, metadata  # SQLAlchemy: loaded by a router with a store

        url = self.config.resolve_url(self._data_dir)
        engine = make_engine(url, sqlite_synchronous=self.config.sqlite_synchronous)
        try:
            await asyncio.to_thread(metadata.create_all, engine)
        except Exception as exc:
            engine.dispose()
            shown = engine.url.render_as_string(hide_password=True)
            raise StoreUnavailable(f"cannot open the event store at {shown}: {exc}") from exc
        self._engine = engine
        self._writer = Writer(
            engine,
            self.config,
            self._clock,
            on_durable=lambda seq: self._call_on_loop(self._wake, seq),
            on_dead=lambda exc: self._call_on_loop(self._fail_waiters, exc),
        )
        self._writer.thread.start()

    async def aclose(self, *, timeout: float | None = DEFAULT_CLOSE_TIMEOUT) -> None:
        """Write everything queued, then close. Refuses new events at once.

        Raises `StoreUnavailable` when the queued events could not be written within
        *timeout* seconds (they are then lost, and the error says how many).
        """
        if self._closed:
            return
        self._closed = True
        w = self._writer
        if w is None:
            return
        try:
            async with asyncio.timeout(timeout):
                await self._wait_durable(self._seq)
        except TimeoutError:
            lost = len(w.queue)
            log.error("event store closed with %d events not written: %s", lost, w.last_error)
            w.abandon()
            raise StoreUnavailable(
                f"the event store closed with {lost} events not written (last error: "
                f"{w.last_error})"
            ) from None
        finally:
            w.close()
            await asyncio.to_thread(w.thread.join, JOIN_TIMEOUT)
            if w.thread.is_alive():
                log.error("event store writer did not stop within %.0fs", JOIN_TIMEOUT)
            w.engine.dispose()

    async def __aenter__(self) -> EventStore:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- writing ------------------------------------------------------------------------------

    def put_nowait(
        self,
        event: Event,
        policy: ExpiryPolicy | None = None,
        *,
        now: datetime | None = None,
        repaired: bool = False,
    ) -> int:
        """Queue *event* for writing under *policy*; returns its sequence number.

        *repaired*: the event came by anti-entropy and yields to a live copy of its id
        (`aa.router.store.sql`). The event's age counts from its ``time`` stamp, or from *now*
        (default: the clock) when it has none. Raises `StoreFull` when `max_pending` events already
        wait, `UsageError` for an event without id, an id or type the store cannot hold, a count
        limit on an untyped event (`InvalidPolicy`), or a store not started or closed.
        """
        w = self._writer
        if self._closed or w is None:
            raise UsageError("the event store is " + ("closed" if self._closed else "not started"))
        if w.dead is not None:
            raise StoreUnavailable("the event store's writer stopped") from w.dead
        id_, type_ = event.id, event.type
        # Refused here, not by the database later: a row the database refuses for good
        # could only be dropped after its publish was already waiting for the ack.
        if id_ is None or len(id_) > MAX_ID_LENGTH or "\x00" in id_:
            raise UsageError(
                f"a stored event needs an id of 1 to {MAX_ID_LENGTH} characters, no NUL"
            )
        if type_ is not None and (len(type_) > MAX_STORED_TYPE_LENGTH or "\x00" in type_):
            raise UsageError(
                f"a stored event's type must be at most {MAX_STORED_TYPE_LENGTH} characters, no NUL"
            )
        t = event_time(event)
        time_us = to_us(t if t is not None else (now if now is not None else self._clock()))
        expires_us = max_count = None
        if policy is not None:
            if policy.max_age is not None:
                expires_us = time_us + policy.max_age // _US
            max_count = policy.max_count
            if max_count is not None and type_ is None:
                raise InvalidPolicy("a count limit needs an event type: the count is kept per type")
        waiting = len(w.queue)
        if waiting >= self.config.max_pending:
            raise StoreFull(
                f"the event store has {waiting} events waiting to be written, its limit; "
                f"last error: {w.last_error or 'none (the database is slow)'}"
            )
        self._seq += 1
        w.put(Row(self._seq, event, id_, time_us, expires_us, max_count, repaired))
        return self._seq

    async def flush(self) -> None:
        """Return once every event put before this call is committed.

        Waits through database outages (the writer keeps retrying); bound the wait with
        `asyncio.timeout` if needed. Raises `StoreUnavailable` if the writer has stopped.
        """
        if self._writer is None:
            raise UsageError("the event store is not started")
        await self._wait_durable(self._seq)

    async def _wait_durable(self, target: int) -> None:
        w = self._writer
        assert w is not None and self._loop is not None
        if w.durable >= target:
            return
        if w.dead is not None:
            raise StoreUnavailable("the event store's writer stopped") from w.dead
        fut: asyncio.Future[None] = self._loop.create_future()
        heapq.heappush(self._waiters, (target, next(self._tiebreak), fut))
        w.want(target)
        await fut

    def _call_on_loop(self, fn: Callable[..., None], *args: object) -> None:  # any thread
        try:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _wake(self, durable: int) -> None:  # on the event loop
        waiters = self._waiters
        while waiters and waiters[0][0] <= durable:
            fut = heapq.heappop(waiters)[2]
            if not fut.done():
                fut.set_result(None)

    def _fail_waiters(self, exc: BaseException) -> None:  # on the event loop
        for _, _, fut in self._waiters:
            if not fut.done():
                err = StoreUnavailable("the event store's writer stopped")
                err.__cause__ = exc
                fut.set_exception(err)
        self._waiters.clear()

    # -- reading ------------------------------------------------------------------------------

    async def expire(self, now: datetime | None = None) -> int:
        """Delete the events whose age limit has passed at *now* (default: the clock) now,
        rather than at the next sweep; returns how many. Raises `StoreUnavailable`."""
        from .sql import delete_expired

        engine = self._need_engine()
        now_us = to_us(now if now is not None else self._clock())
        try:
            n = await asyncio.to_thread(delete_expired, engine, now_us)
        except Exception as exc:
            raise StoreUnavailable(f"cannot expire stored events: {exc}") from exc
        self._expired += n
        return n

    async def query(
        self,
        match: Callable[[Event], bool] | None = None,
        *,
        since: datetime | None = None,
        limit: int | None = None,
        now: datetime | None = None,
    ) -> list[Event]:
        """Stored events that *match* accepts, oldest first (by event time, then id): the
        first *limit* of them with a time at or after *since*, not expired at *now*.

        Sees every event put before the call, written or not. *match* runs on the event
        loop (patterns need not be thread-safe). Raises `StoreUnavailable`.
        """
        if limit is not None and (type(limit) is not int or limit < 0):
            raise UsageError(f"limit must be a non-negative int or None, not {limit!r}")
        out: list[Event] = []
        if limit == 0:
            return out
        chunk = QUERY_CHUNK if limit is None or match is not None else min(limit, QUERY_CHUNK)
        async for events in self.iterate(match, since=since, now=now, chunk=chunk):
            out.extend(events)
            if limit is not None and len(out) >= limit:
                del out[limit:]
                break
        return out

    async def iterate(
        self,
        match: Callable[[Event], bool] | None = None,
        *,
        since: datetime | None = None,
        now: datetime | None = None,
        chunk: int = QUERY_CHUNK,
    ) -> AsyncGenerator[list[Event], None]:
        """Like `query`, in lists of at most about *chunk* events: for replays too large to
        hold at once. Each chunk is read on a worker thread; the loop only matches."""
        from .sql import read_chunk

        engine = self._need_engine()
        if type(chunk) is not int or chunk < 1:
            raise UsageError(f"chunk must be a positive int, not {chunk!r}")
        now_us = to_us(now if now is not None else self._clock())
        since_us = None if since is None else to_us(since)
        assert self._writer is not None
        # Events still queued are merged in by key (a copy of an id queued twice, once).
        # One may be committed between this snapshot and the reads below and so come from
        # both sides: same key, kept once. Count limits apply when events are written, so
        # events of a type still queued may briefly outnumber its limit here.
        queued: dict[str, Row] = {}
        for r in self._writer.snapshot():
            if (r.expires_us is None or r.expires_us > now_us) and (
                since_us is None or r.time_us >= since_us
            ):
                queued.setdefault(r.id, r)
        pending = sorted(queued.values(), key=lambda r: r.key)
        pi, after = 0, None
        while True:
            try:
                rows = await asyncio.to_thread(
                    read_chunk, engine, after=after, since_us=since_us, now_us=now_us, limit=chunk
                )
            except Exception as exc:
                raise StoreUnavailable(f"cannot read the event store: {exc}") from exc
            last = len(rows) < chunk
            out: list[Event]
            if pi < len(pending):
                out = []
                for key, ev in rows:
                    while pi < len(pending) and pending[pi].key <= key:
                        if pending[pi].key != key:
                            out.append(pending[pi].event)
                        pi += 1
                    out.append(ev)
            else:
                out = [ev for _, ev in rows]
            if last:
                out.extend(r.event for r in pending[pi:])
            if match is not None:
                out = [e for e in out if match(e)]
            if out:
                yield out
            if last:
                return
            after = rows[-1][0]

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(engine, *args, **kwargs)` on a worker thread (a statement of `sql.py`).
        Raises `StoreUnavailable` when it fails."""
        engine = self._need_engine()
        try:
            return await asyncio.to_thread(fn, engine, *args, **kwargs)
        except Exception as exc:
            raise StoreUnavailable(f"cannot read the event store: {exc}") from exc

    def queued(self) -> list[Row]:
        """The events put and not yet written (a query must see them too)."""
        return [] if self._writer is None else self._writer.snapshot()

    def now_us(self) -> int:
        """The store's clock, in µs since the epoch (expiry is measured with it)."""
        return to_us(self._clock())

    # -- health -------------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False while writes fail (a lost connection, a full disk); True again once one works."""
        w = self._writer
        return w is None or (w.healthy and w.dead is None)

    def stats(self) -> StoreStats:
        """The counters now."""
        w = self._writer
        if w is None:
            return StoreStats(
                healthy=True,
                pending=0,
                written=0,
                batches=0,
                failures=0,
                rejected=0,
                expired=0,
                last_error=None,
            )
        return StoreStats(
            healthy=self.healthy,
            pending=len(w.queue),
            written=w.written,
            batches=w.batches,
            failures=w.failures,
            rejected=w.rejected,
            expired=w.expired + self._expired,
            last_error=w.last_error,
        )

    @property
    def bytes_on_disk(self) -> int | None:
        """Bytes of the SQLite database file and its write-ahead log (two `stat` calls);
        None for a database server, or before `start`."""
        engine = self._engine
        if engine is None or engine.url.get_backend_name() != "sqlite":
            return None
        name = engine.url.database
        if not name or name == ":memory:":
            return None
        total = 0
        for path in (name, name + "-wal"):
            try:
                total += os.stat(path).st_size
            except OSError:
                pass
        return total

    def _need_engine(self) -> sa.Engine:
        if self._engine is None or self._closed:
            raise UsageError("the event store is " + ("closed" if self._closed else "not started"))
        return self._engine
