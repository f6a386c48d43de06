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
    values        map<string, string>     each value as text (see `aa.router.eventlog.codec`)
    values_types  map<string, string>     each value's type: int, float, str, bytes, ...
    meta_json     string                  the meta map as typed JSON (`codec`), without
                                          ``time`` when that is the ``time`` column

A Spark job reads, say, temperatures with
``spark.read.parquet(".../eventlog").where("values_types['Temperature'] = 'int'")
.select("time", F.col("values")["Temperature"].cast("long"))``.

Writing: `extend` (the events of one dispatched batch) and `append` (one event) take the
rows encoded with msgpack (`aa.router.caches.meshcache.encode_events`: one C call per batch, and
none at all when the router's storage hands over the mesh cache's encoding of the same
batch, or the bytes a peer sent events in with this router's hop: `extend`'s *hop*) and
buffer them on the event loop; every `row_group_rows` rows or `flush_interval`
seconds the buffer goes to the log's writer *process* (`aa.router.eventlog.process`), which
turns it into one Parquet row group (`aa.router.eventlog.table`, `aa.router.eventlog.writer`).
A file is written under a hidden name (``.part-….inprogress``, which Spark and pyarrow skip)
and renamed when closed, so readers never see a file without its footer. Files close when
they reach `max_file_bytes`, when they are `max_file_age` old, at the hour's end, and on
`flush()`. The whole log (this router's files) is bounded by `max_total_bytes` and
`max_total_age`: oldest files go first.

The log is for mining, not for durability: if the disk fails, the writer process dies, or
it falls more than `max_pending_rows` behind, rows are dropped — counted in `stats()` and
logged, never silently — and routing goes on.

Why a process fed msgpack
-------------------------
Every event a router dispatches is logged, so the log's cost is paid per event, at full
load too. A writer thread would share the router's GIL (which changes hands at every socket
call of the event loop) and hold the loop up at every row group; the process holds none of
it. The router only encodes the rows, which its storage does once per dispatched batch for
the mesh cache and the log alike; decoding them, the columns and Parquet run in the writer
process, on another core when there is one, at a lower priority when there is none
(`aa.router.eventlog.process.WRITER_NICE`). msgpack rather than pickle: it costs the same
per event whatever the batch (one client's events, one event, events relayed from peers),
and the mesh cache has it already. Aware datetimes in values come back in UTC (the same
instant), as they do everywhere in Aa. The costs: a second process (its memory, and a start
in the background), and on a machine whose cores are all busy its CPU is taken from someone.
The measurements behind this are in the manual (Performance, "The event log's writer").

Why the writer holds rows while they keep coming
------------------------------------------------
So the writer process takes no CPU from routing during a burst: while rows arrive faster
than one ``write`` per `EventLogConfig.defer_pause`, it keeps them as they came (receiving
the bytes is all it does) and writes them once the router pauses, up to
`EventLogConfig.defer_bytes` and `EventLogConfig.defer_seconds`. A lower priority alone does
not do that: the writer still runs in every gap the busy processes leave, and they come back
to caches it has filled. A load that never pauses still pays once the bytes are full.
The price: rows wait up to a minute in the writer's memory before they are in a file
(files become visible only when closed anyway: `max_file_age`), and a writer killed
meanwhile loses them — counted as dropped, like the rows in its open file.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aa.mesh import Event, UsageError
from aa.mesh.protocol import pack

from ..caches import encode_events
from .process import Chunk, Hop, WriterProcess, safe_name

__all__ = ["EventLog", "EventLogConfig", "EventLogStats", "EVENTLOG_DIR"]

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
    #: While rows keep coming, the writer process holds them (as the router encoded them)
    #: instead of writing them at once, up to this many bytes; it writes them once the
    #: router pauses (`defer_pause`), on `EventLog.flush`, and at stop. 64 MiB is about
    #: 450,000 rows of five values. 0: write rows as they come. Why: `process.py`.
    defer_bytes: int = 64 * 1024 * 1024
    #: ... and at most this long, in seconds: under a load that never pauses, rows are
    #: written this long after they were logged (or sooner, at `defer_bytes`).
    defer_seconds: float = 60.0
    #: Seconds without new rows that make a pause. Rows reach the writer every
    #: `row_group_rows` rows (or `flush_interval`), so with the defaults it holds rows above
    #: about 20,000 events/s and writes them as they come below.
    defer_pause: float = 0.5

    def __post_init__(self) -> None:
        for name in ("row_group_rows", "max_file_bytes", "max_total_bytes", "max_pending_rows"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise UsageError(f"EventLogConfig.{name} must be a positive int, not {v!r}")
        if type(self.defer_bytes) is not int or self.defer_bytes < 0:
            raise UsageError(
                f"EventLogConfig.defer_bytes must be an int >= 0, not {self.defer_bytes!r}"
            )
        for name in (
            "flush_interval",
            "max_file_age",
            "max_total_age",
            "defer_seconds",
            "defer_pause",
        ):
            v = getattr(self, name)
            if type(v) not in (int, float) or not v > 0:
                raise UsageError(f"EventLogConfig.{name} must be a positive number of seconds")
        if self.compression not in ("zstd", "snappy", "gzip", "lz4", "brotli", "none"):
            raise UsageError(
                f"EventLogConfig.compression {self.compression!r} is not a Parquet codec"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class EventLogStats:
    """Counters of the event log."""

    #: Rows written to files.
    rows: int
    #: Files closed (renamed into view).
    files: int
    #: Files deleted by the bounds.
    deleted: int
    #: Rows dropped: writer too far behind, a write failed, or the writer process died.
    dropped: int
    #: Writes that failed.
    errors: int
    #: Rows the writer process holds, to be written once the router pauses (`defer_bytes`).
    waiting: int = 0


class EventLog:
    """Appends dispatched events to this router's Parquet event log.

    >>> async def demo(data_dir):
    ...     async with EventLog(data_dir=data_dir, router_id="r1") as elog:
    ...         elog.append(Event(values={"t": 1}, id="e1"))
    ...         elog.extend([Event(values={"t": 2}, id="e2"), Event(values={"t": 3}, id="e3")])
    ...         await elog.flush()            # written, and the file closed: readable now

    *clock* is wall time in seconds (partitions, file ages, bounds); tests move it. It is
    read on the event loop and on the log's executor thread.
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
        self._w = WriterProcess(self.root, safe_name(router_id), self.config, clock)
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._chunks: list[Chunk] = []
        self._buffered = 0  # rows in _chunks
        self._inflight = 0  # rows handed to the writer, not yet written
        self._timer: asyncio.TimerHandle | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self._dropped = 0  # rows dropped on the loop side (writer too far behind)
        self._closed = False

    async def start(self) -> None:
        """Create the folder and start housekeeping. The writer process starts in the
        background (rows logged meanwhile wait for it): it picks up the numbering after
        earlier files and removes what a crash left. Raises `OSError` when the folder
        cannot be made."""
        if self._executor is not None or self._closed:
            raise UsageError("an EventLog is started once")
        self.root.mkdir(parents=True, exist_ok=True)
        self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="aa-eventlog")
        self._spawn(self._w.scan)
        self._ticker = self._loop.call_later(MAINTAIN_INTERVAL, self._tick)

    async def __aenter__(self) -> EventLog:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def append(self, event: Event, *, now: float | None = None) -> None:
        """Log *event* (logged at *now*, default the clock): `extend` with one event."""
        self.extend((event,), now=now)

    def extend(
        self,
        events: Sequence[Event],
        *,
        now: float | None = None,
        encoded: bytes | None = None,
        hop: Hop | None = None,
    ) -> None:
        """Log *events*, all logged at *now* (default: the clock, read once). Never blocks;
        drops and counts the rows beyond `max_pending_rows` waiting for the writer.
        Cheapest per row with many events at once: a router calls it once per dispatched
        batch. *encoded*: `aa.router.meshcache.encode_events(events)`, when the caller has
        it already (the router's storage shares the mesh cache's); or, with *hop*, the
        bytes of the flood group they came in (`aa.mesh.protocol.FloodGroup.blob`), whose
        ttl and path in each meta are replaced by *hop*'s ``(ttl, path)`` when written."""
        if self._executor is None or self._closed:
            raise UsageError("the event log is " + ("closed" if self._closed else "not started"))
        n = len(events)
        room = self.config.max_pending_rows - self._buffered - self._inflight
        if n > room:
            lost = n - max(room, 0)
            if self._dropped == 0 or (self._dropped + lost) // 10_000 > self._dropped // 10_000:
                log.warning(
                    "event log writer is behind: dropping rows (%d so far)", self._dropped + lost
                )
            self._dropped += lost
            events, n, encoded, hop = events[: max(room, 0)], max(room, 0), None, None
        if n == 0:
            return
        if encoded is not None:
            data = encoded
        else:
            data, n, hop = *self._encode(events), None
        if n == 0:
            return
        self._chunks.append((now if now is not None else self._clock(), n, data, hop))
        self._buffered += n
        if self._buffered >= self.config.row_group_rows:
            self._submit()
        elif self._timer is None:
            assert self._loop is not None
            self._timer = self._loop.call_later(self.config.flush_interval, self._submit)

    def _encode(self, events: Sequence[Event]) -> tuple[bytes, int]:
        """*events* encoded as the writer takes them, and how many: events outside the
        value model (never a checked one) are left out, and counted."""
        data = encode_events(events)
        if data is not None:
            return data, len(events)
        good = []
        for event in events:
            try:
                pack([event.id, event.type, event.values, event.meta])
            except Exception as exc:
                self._dropped += 1
                log.error("event log: event %s cannot be logged (%s)", event.id, exc)
            else:
                good.append(event)
        data = encode_events(good)
        return (data, len(good)) if data is not None else (b"", 0)

    def _submit(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        chunks, n = self._chunks, self._buffered
        self._chunks, self._buffered = [], 0
        if chunks:
            self._inflight += n
            fut = self._spawn(self._w.write, chunks)
            fut.add_done_callback(functools.partial(self._written, n))

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
                await self._run(self._w.stop)
                await asyncio.to_thread(self._executor.shutdown, wait=True)
        self._closed = True

    def stats(self) -> EventLogStats:
        w = self._w
        return EventLogStats(
            rows=w.rows,
            files=w.files,
            deleted=w.deleted,
            dropped=w.dropped + self._dropped,
            errors=w.errors,
            waiting=w.waiting,
        )
