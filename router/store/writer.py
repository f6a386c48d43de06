"""The persistent store's writer: a bounded queue and the one thread that drains it into the
database in batches (see `aa.router.store.eventstore` for the whole picture).

Rules the writer keeps (the durability promise rests on them):

- An event leaves the queue only after the transaction holding it has committed. A failed
  transaction leaves the whole batch queued; it is retried, never dropped.
- `durable` (the seq of the last committed event) only grows, and is set before anyone is
  told: a reader that sees `durable >= n` knows events 1..n are committed.
- Failures that retrying can cure (lost connection, full disk, locked database) are
  retried with doubling back-off; the first of a run is logged as an error, then at most
  every `FAILURE_LOG_INTERVAL` seconds, and `healthy` is False until a write succeeds.
- Any other failure means some row is bad: the batch is written row by row so that the
  good rows go in and each bad one is logged and counted in `rejected`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

from aa.mesh import StoreError, StoreFull, StoreUnavailable  # the tree's; re-exported here

if TYPE_CHECKING:
    import sqlalchemy as sa

    from aa.mesh import Event

    from .eventstore import StoreConfig

__all__ = ["StoreError", "StoreFull", "StoreUnavailable", "StoreStats", "Row", "Writer", "to_us"]

log = logging.getLogger("aa.router.store")

#: While writes keep failing, a failure is logged at most this often, in seconds.
FAILURE_LOG_INTERVAL: Final = 30.0


@dataclass(frozen=True, slots=True)
class Row:
    """One event waiting to be written, with the times the store computed for it."""

    seq: int
    event: Event
    #: The event's id (`put` refuses an event without one).
    id: str
    time_us: int
    expires_us: int | None
    #: Keep only the newest N events of the event's type (None: no count limit).
    max_count: int | None
    #: Came by anti-entropy, not dispatched here: yields to a live event of the same id.
    repaired: bool = False

    @property
    def key(self) -> tuple[int, str]:
        """Replay order: time, then id (ids break ties the same way on every router)."""
        return (self.time_us, self.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreStats:
    """A snapshot of the store's counters, for health checks and monitoring."""

    #: False from a failed write until the next successful one.
    healthy: bool
    #: Events waiting to be written.
    pending: int
    #: Events committed (copies of ids already stored included: they are ignored).
    written: int
    #: Transactions committed.
    batches: int
    #: Write attempts that failed and were retried.
    failures: int
    #: Events the database refused for good (not transient); logged, never silent.
    rejected: int
    #: Events deleted by the age sweep.
    expired: int
    #: The last failure, as text; None when there was none.
    last_error: str | None


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)


def to_us(t: datetime) -> int:
    """Microseconds since the epoch; a naive *t* is taken as UTC."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return (t - _EPOCH) // _US


class Writer:
    """The queue and the thread. `put`, `want` and `snapshot` are called from the event
    loop; everything else runs on the thread. *on_durable(seq)* and *on_dead(exc)* are
    called on the thread: they must hand over to the loop themselves."""

    def __init__(
        self,
        engine: sa.Engine,
        config: StoreConfig,
        clock: Callable[[], datetime],
        on_durable: Callable[[int], None],
        on_dead: Callable[[BaseException], None],
    ) -> None:
        self.engine, self.config, self.clock = engine, config, clock
        self.on_durable, self.on_dead = on_durable, on_dead
        self.cond = threading.Condition()
        self.queue: deque[Row] = deque()  # guarded by cond
        self.first_at = 0.0  # monotonic time the queue last became non-empty
        self.urgent = 0  # events up to this seq are wanted now (a flush waits)
        self.durable = 0  # seq of the last committed event
        self.closing = False  # write what is left, then stop
        self.abandoned = False  # stop now, even with events left
        self.dead: BaseException | None = None
        self.healthy = True
        self.written = self.batches = self.failures = self.rejected = self.expired = 0
        self.last_error: str | None = None
        self._last_failure_log = -FAILURE_LOG_INTERVAL
        self.thread = threading.Thread(target=self._run, name="aa-store-writer", daemon=True)

    # -- from the event loop ------------------------------------------------------------------

    def put(self, row: Row) -> None:
        """Queue *row* (the caller checked the bound)."""
        with self.cond:
            self.queue.append(row)
            n = len(self.queue)
            if n == 1:
                self.first_at = time.monotonic()
                self.cond.notify()
            elif n == self.config.batch_size:
                self.cond.notify()

    def want(self, seq: int) -> None:
        """Someone waits for events up to *seq*: write them without waiting for company."""
        with self.cond:
            if seq > self.urgent:
                self.urgent = seq
                self.cond.notify()

    def snapshot(self) -> list[Row]:
        """The rows waiting now."""
        with self.cond:
            return list(self.queue)

    def close(self) -> None:
        """Write what is queued, then stop."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()

    def abandon(self) -> None:
        """Stop now; what is queued is not written."""
        with self.cond:
            self.abandoned = True
            self.cond.notify_all()

    # -- on the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._work()
        except BaseException as exc:  # a bug: say so, and fail whoever waits
            log.critical("event store writer stopped", exc_info=True)
            self.dead = exc
            self.on_dead(exc)

    def _work(self) -> None:
        cfg = self.config
        next_sweep = time.monotonic() + cfg.expire_interval
        while True:
            with self.cond:
                while True:
                    if self.abandoned:
                        return
                    queue, now = self.queue, time.monotonic()
                    timeout: float | None = None
                    if queue:
                        due = self.first_at + cfg.flush_interval
                        if (
                            self.closing
                            or len(queue) >= cfg.batch_size
                            or queue[0].seq <= self.urgent
                            or now >= due
                        ):
                            break
                        timeout = due - now
                    elif self.closing:
                        return
                    if now >= next_sweep:
                        break
                    to_sweep = next_sweep - now
                    self.cond.wait(to_sweep if timeout is None else min(timeout, to_sweep))
                batch = list(itertools.islice(queue, cfg.batch_size))
            if time.monotonic() >= next_sweep:
                self._sweep()
                next_sweep = time.monotonic() + cfg.expire_interval
            if batch:
                self._write(batch)

    def _write(self, batch: list[Row]) -> None:
        from .sql import is_transient, write_batch, write_rows_one_by_one  # loaded by start()

        delay = self.config.retry_min
        while True:
            try:
                try:
                    write_batch(self.engine, batch)
                    rejected: list[tuple[Row, Exception]] = []
                except Exception as exc:
                    if is_transient(exc):
                        raise
                    log.warning(
                        "event store batch refused (%s); writing its events one by one", exc
                    )
                    rejected = write_rows_one_by_one(self.engine, batch)
                break
            except Exception as exc:
                self._note_failure(exc, delay)
                with self.cond:
                    if not self.abandoned:
                        self.cond.wait(delay)
                    if self.abandoned:
                        return
                delay = min(delay * 2, self.config.retry_max)
        for row, why in rejected[:10]:  # a bound on the log, not on the count
            log.error("event store refused event %s for good: %s", row.event.id, why)
        with self.cond:
            for _ in batch:
                self.queue.popleft()
        if not self.healthy:
            log.warning("event store writes work again (after %d failures)", self.failures)
        self.healthy = True
        self.written += len(batch) - len(rejected)
        self.rejected += len(rejected)
        self.batches += 1
        self.durable = batch[-1].seq  # before telling: readers check it unlocked
        self.on_durable(self.durable)

    def _note_failure(self, exc: Exception, delay: float) -> None:
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        now = time.monotonic()
        if self.healthy or now - self._last_failure_log >= FAILURE_LOG_INTERVAL:
            self._last_failure_log = now
            log.error(
                "event store write failed (%d events waiting, none dropped); retrying in %.2fs: %s",
                len(self.queue),
                delay,
                self.last_error,
            )
        self.healthy = False

    def _sweep(self) -> None:
        from .sql import delete_expired

        try:
            self.expired += delete_expired(self.engine, to_us(self.clock()))
        except Exception as exc:  # a write failure will say more; try again next sweep
            log.debug("event store expiry sweep failed: %s", exc)
