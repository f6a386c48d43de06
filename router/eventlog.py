"""The event log for mining: every event a router dispatches, in Parquet files that Spark
(and pyarrow, pandas, DuckDB) read natively.

Layout (Hive partitioning: Spark and ``pyarrow.dataset(..., partitioning="hive")`` turn the
folder names into ``date`` and ``hour`` columns)::

    <data>/eventlog/date=YYYY-MM-DD/hour=HH/part-<router>-<seq>.parquet

The partition is the UTC hour in which this router logged the event (not the event's own
``time``, which a late event could put in an hour whose files are long closed); the two
differ by the mesh's latency only, so a job filtering on ``time`` near an hour's edge also
reads the neighbouring partition. Every router logs every event it dispatches, i.e. every
event of the mesh: a mesh-wide job reads one router's log, or de-duplicates by ``id``.

Schema of each file (`SCHEMA`)::

    id            string                  event id
    type          string (null)           event type
    time          timestamp[us, UTC]      the event's ``time`` stamp (else when logged)
    router        string (null)           router the publisher was connected to (meta)
    client        string (null)           publishing client's id (meta)
    logged_by     string                  the router that wrote this file
    values        map<string, string>     each value as text (see `aa.router.logcodec`)
    values_types  map<string, string>     each value's type: int, float, str, bytes, ...
    meta_json     string                  the meta map as typed JSON (logcodec), without
                                          ``time`` when that is the ``time`` column

A Spark job reads, say, temperatures with
``spark.read.parquet(".../eventlog").where("values_types['Temperature'] = 'int'")
.select("time", F.col("values")["Temperature"].cast("long"))``.

Writing (`aa.router.eventlogwriter`): `append` only buffers (on the event loop); rows go
to a single writer thread as one Parquet row group at a time (every `row_group_rows` rows or `flush_interval` seconds).
A file is written under a hidden name (``.part-….inprogress``, which Spark and pyarrow skip)
and renamed when closed, so readers never see a file without its footer. Files close when
they reach `max_file_bytes`, when they are `max_file_age` old, at the hour's end, and on
`flush()`. The whole log (this router's files) is bounded by `max_total_bytes` and
`max_total_age`: oldest files go first.

The log is for mining, not for durability: if the disk fails, or the writer falls more than
`max_pending_rows` behind, rows are dropped — counted in `stats()` and logged, never
silently — and routing goes on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Final

from aa.mesh import Event, UsageError

from .eventlogwriter import SCHEMA, Writer, safe_name

__all__ = ["EventLog", "EventLogConfig", "EventLogStats", "SCHEMA", "EVENTLOG_DIR"]

log = logging.getLogger("aa.router.eventlog")

#: Folder of the event log inside the router's data folder.
EVENTLOG_DIR: Final = "eventlog"

#: Seconds between two housekeeping passes (close old files, enforce the bounds).
MAINTAIN_INTERVAL: Final = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class EventLogConfig:
    """How the event log is written and bounded."""

    #: Rows per Parquet row group (the unit of writing and of reading back). 10,000 rows
    #: of typical events is about 1 MiB: big enough to compress well.
    row_group_rows: int = 10_000
    #: Longest buffered rows wait before they are written, in seconds.
    flush_interval: float = 5.0
    #: A file is closed (and becomes visible) once this big, in bytes.
    max_file_bytes: int = 128 * 1024 * 1024
    #: ... or once this old, in seconds: bounds how stale a mining job's view is.
    max_file_age: float = 600.0
    #: The log's files are deleted, oldest first, beyond this total size, in bytes.
    max_total_bytes: int = 10 * 1024**3
    #: ... and once their hour is older than this, in seconds (30 days).
    max_total_age: float = 30 * 24 * 3600.0
    #: Rows that may wait for the writer; beyond, new rows are dropped (and counted).
    max_pending_rows: int = 200_000
    #: Parquet compression codec.
    compression: str = "zstd"

    def __post_init__(self) -> None:
        for name in ("row_group_rows", "max_file_bytes", "max_total_bytes", "max_pending_rows"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise UsageError(f"EventLogConfig.{name} must be a positive int, not {v!r}")
        for name in ("flush_interval", "max_file_age", "max_total_age"):
            v = getattr(self, name)
            if type(v) not in (int, float) or not v > 0:
                raise UsageError(f"EventLogConfig.{name} must be a positive number of seconds")
        if self.compression not in ("zstd", "snappy", "gzip", "lz4", "brotli", "none"):
            raise UsageError(f"EventLogConfig.compression {self.compression!r} is not a Parquet codec")


@dataclass(frozen=True, slots=True, kw_only=True)
class EventLogStats:
    """Counters of the event log."""

    #: Rows written to files.
    rows: int
    #: Files closed (renamed into view).
    files: int
    #: Files deleted by the bounds.
    deleted: int
    #: Rows dropped: writer too far behind, or a write failed.
    dropped: int
    #: Writes that failed.
    errors: int


class EventLog:
    """Appends dispatched events to this router's Parquet event log.

    >>> async def demo(data_dir):
    ...     async with EventLog(data_dir=data_dir, router_id="r1") as elog:
    ...         elog.append(Event(values={"t": 1}, id="e1"))
    ...         await elog.flush()            # written, and the file closed: readable now

    *clock* is wall time in seconds (partitions, file ages, bounds); tests move it.
    """

    def __init__(
        self,
        config: EventLogConfig | None = None,
        *,
        data_dir: str | os.PathLike[str],
        router_id: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config if config is not None else EventLogConfig()
        self.root = Path(data_dir) / EVENTLOG_DIR
        self._clock = clock
        self._w = Writer(self.root, safe_name(router_id), self.config, clock)
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._buffer: list[tuple[Event, float]] = []
        self._inflight = 0  # rows handed to the writer, not yet written
        self._timer: asyncio.TimerHandle | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self._dropped = 0  # rows dropped on the loop side (writer too far behind)
        self._closed = False

    async def start(self) -> None:
        """Create the folder, pick up numbering after earlier files, start housekeeping."""
        if self._executor is not None or self._closed:
            raise UsageError("an EventLog is started once")
        self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="aa-eventlog")
        self.root.mkdir(parents=True, exist_ok=True)
        await self._run(self._w.scan)
        self._ticker = self._loop.call_later(MAINTAIN_INTERVAL, self._tick)

    async def __aenter__(self) -> "EventLog":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def append(self, event: Event, *, now: float | None = None) -> None:
        """Log *event* (logged at *now*, default the clock). Never blocks; drops and counts
        the row if the writer is more than `max_pending_rows` behind."""
        if self._executor is None or self._closed:
            raise UsageError("the event log is " + ("closed" if self._closed else "not started"))
        buf = self._buffer
        if len(buf) + self._inflight >= self.config.max_pending_rows:
            if self._dropped % 10_000 == 0:
                log.warning("event log writer is behind: dropping rows (%d so far)", self._dropped + 1)
            self._dropped += 1
            return
        buf.append((event, now if now is not None else self._clock()))
        if len(buf) >= self.config.row_group_rows:
            self._submit()
        elif len(buf) == 1:
            assert self._loop is not None
            self._timer = self._loop.call_later(self.config.flush_interval, self._submit)

    def _submit(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        rows, self._buffer = self._buffer, []
        if rows:
            self._inflight += len(rows)
            fut = self._spawn(self._w.write, rows)
            fut.add_done_callback(functools.partial(self._written, len(rows)))

    def _written(self, n: int, _fut: object) -> None:
        self._inflight -= n

    def _spawn(self, fn: Callable[..., None], *args: object) -> asyncio.Future[None]:
        assert self._loop is not None and self._executor is not None
        return self._loop.run_in_executor(self._executor, fn, *args)

    async def _run(self, fn: Callable[..., None], *args: object) -> None:
        await self._spawn(fn, *args)

    def _tick(self) -> None:
        assert self._loop is not None
        self._spawn(self._w.maintain)
        self._ticker = self._loop.call_later(MAINTAIN_INTERVAL, self._tick)

    async def flush(self) -> None:
        """Write every appended event and close the current file: once this returns,
        everything appended so far is readable. (Each flush ends a file: call it when a
        reader needs the latest rows, not per event.)"""
        if self._executor is None:
            raise UsageError("the event log is not started")
        self._submit()
        await self._run(self._w.close)

    async def maintain(self) -> None:
        """Run housekeeping now (normally every `MAINTAIN_INTERVAL` s): close a file past
        its age or hour, delete files past the bounds."""
        if self._executor is None:
            raise UsageError("the event log is not started")
        await self._run(self._w.maintain)

    async def aclose(self) -> None:
        """Write what is buffered, close the file, stop the writer."""
        if self._closed:
            return
        if self._executor is not None:
            try:
                await self.flush()
            finally:
                self._closed = True
                if self._ticker is not None:
                    self._ticker.cancel()
                await asyncio.to_thread(self._executor.shutdown, wait=True)
        self._closed = True

    def stats(self) -> EventLogStats:
        w = self._w
        return EventLogStats(
            rows=w.rows, files=w.files, deleted=w.deleted, dropped=w.dropped + self._dropped, errors=w.errors
        )
