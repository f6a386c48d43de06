"""The event log's writer: Parquet files, their rotation and the log's bounds. Everything
here runs in the log's writer process, one command at a time (`aa.router.eventlog.process`;
see `aa.router.eventlog.recorder` for the layout and the schema, which is `SCHEMA`).

Rows arrive as chunks: ``(logged, count, data, hop)``, *data* the msgpack array of *count*
rows ``[id, type, values, meta]`` (`aa.router.caches.meshcache.encode_events`, or a flood
group's blob as a peer sent it), events the router logged at *logged* (wall time, seconds);
*hop*, when not None, the ``(ttl, path)`` each row's meta gets in place of the one in *data*
(as `aa.mesh.protocol.FloodGroup.decode` sets it). The compiled reader
(`aa.router.eventlog.fastpath`) turns them into an Arrow table straight from the bytes;
where it is missing or refuses some rows, they are decoded and `aa.router.eventlog.table`
builds the same table.

Rotation and bounds, the part where data can be lost by mistake:

- A file is written under a hidden name (``.part-….parquet.inprogress``) and renamed only
  once closed, with its footer: readers (Spark, pyarrow) skip hidden files, so they never
  see a half-written one. A hidden file found at start-up was left by a crash; it has no
  footer, cannot be read, and is removed with a warning.
- A file holds one hour partition: rows are split at hour boundaries, and a file still
  open when its hour ends is closed by housekeeping.
- Bounds delete whole files, oldest hour first, and only this router's files.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from aa.mesh import META_PATH, META_TTL
from aa.mesh.protocol import unpack

from .fastpath import table_from_chunks
from .table import SCHEMA, build_table

if TYPE_CHECKING:
    from .process import Chunk, Hop
    from .recorder import EventLogConfig

__all__ = ["SCHEMA", "Writer"]

log = logging.getLogger("aa.router.eventlog")

_PART = re.compile(r"^\.?part-(?P<router>.+)-(?P<seq>\d+)\.parquet(?P<tmp>\.inprogress)?$")
_HOUR = 3600

#: The columns written with a dictionary: all but the event ids and the values' text, which
#: are mostly unique, so that a dictionary only grows until Parquet gives up on it (the
#: files come out no larger without). Leaves of the map columns are named by their path.
_UNIQUE = {"id", "values.key_value.value"}
_DICTIONARY = [
    path
    for field in SCHEMA
    for path in (
        [f"{field.name}.key_value.key", f"{field.name}.key_value.value"]
        if pa.types.is_map(field.type)
        else [field.name]
    )
    if path not in _UNIQUE
]
#: The columns written with min/max statistics: those readers skip row groups by. The others'
#: (the ids, the meta's JSON, the values' names, texts and types) would cost the writer per
#: row and help nobody: their minimum and maximum span every row group, and engines do not
#: skip by the keys of a map (docs/performance.md, "The event log's writer").
_STATISTICS = ["time", "type", "router", "client", "logged_by"]


def _set_hop(rows: Any, hop: Hop) -> None:
    """Set *hop*'s ttl and path in the meta of each of *rows* (decoded), as a relaying
    router set them in the events it dispatched (`aa.mesh.protocol.FloodGroup.decode`)."""
    ttl, path = hop
    for row in rows if type(rows) is list else ():
        if type(row) is list and len(row) == 4:
            if row[3] is None:
                row[3] = {}
            if type(row[3]) is dict:
                row[3][META_TTL] = ttl
                row[3][META_PATH] = list(path)


class Writer:
    """The writer thread's state. Every method runs on that one thread."""

    def __init__(self, root: Path, router: str, config: EventLogConfig, clock: Callable[[], float]):
        self.root, self.router, self.config, self.clock = root, router, config, clock
        self.writer: pq.ParquetWriter | None = None
        self.tmp: Path | None = None
        self.final: Path | None = None
        self.hour = -1  # partition (hours since the epoch) of the open file
        self.opened = 0.0
        self.seq = 0
        self.rows = self.files = self.deleted = self.dropped = self.errors = 0

    def scan(self) -> None:
        """Continue numbering after this router's files; remove crash leftovers."""
        for path in self.root.glob("date=*/hour=*/*part-*"):
            m = _PART.match(path.name)
            if m is None or m["router"] != self.router:
                continue
            self.seq = max(self.seq, int(m["seq"]))
            if m["tmp"]:
                # A file a crashed router was writing has no footer: unreadable. Say so.
                log.warning("event log: removing %s, left unfinished by a crash", path)
                path.unlink(missing_ok=True)

    def write(self, chunks: list[Chunk]) -> None:
        """Write the rows of *chunks*, one row group per hour partition."""
        group: list[Chunk] = []
        hour = -1
        for chunk in chunks:  # split at hour boundaries: one file per partition
            h = int(chunk[0] // _HOUR)
            if group and h != hour:
                self._write_group(group, hour)
                group = []
            hour = h
            group.append(chunk)
        if group:
            self._write_group(group, hour)

    def _write_group(self, chunks: list[Chunk], hour: int) -> None:
        rows = sum(c[1] for c in chunks)
        try:
            table = table_from_chunks(chunks, self.router)
        except Exception:  # never expected (out of memory): counted as the reference would
            self._failed(rows)
            return
        if table is not None:
            self._write_table(table, hour)
            return
        part: list[Sequence[Any]] = []  # the reference path: decode, then build
        logged: list[float] = []
        for when, count, data, hop in chunks:
            try:
                decoded = unpack(data)
                if hop is not None:
                    _set_hop(decoded, hop)
            except Exception:  # never for what the router packed; counted, not fatal
                self.errors += 1
                self.dropped += count
                log.error(
                    "event log: %d rows cannot be decoded; they are dropped", count, exc_info=True
                )
                continue
            part.extend(decoded)
            logged.extend([when] * len(decoded))
        if not part:
            return
        try:
            ids, types, values, metas = zip(*part)
            table = build_table(ids, types, values, metas, logged, self.router)
        except Exception:
            self._failed(len(part))
            return
        self._write_table(table, hour)

    def _write_table(self, table: pa.Table, hour: int) -> None:
        try:
            if self.writer is not None and self.hour != hour:
                self.close()
            if self.writer is None:
                self._open(hour)
            assert self.writer is not None and self.tmp is not None
            self.writer.write_table(table, row_group_size=table.num_rows)
            self.rows += table.num_rows
            if (
                self.tmp.stat().st_size >= self.config.max_file_bytes
                or self.clock() - self.opened >= self.config.max_file_age
            ):
                self.close()
        except Exception:
            self._failed(table.num_rows)
            self._discard()

    def _failed(self, rows: int) -> None:
        self.errors += 1
        self.dropped += rows
        log.error("event log: writing %d rows failed; they are dropped", rows, exc_info=True)

    def _open(self, hour: int) -> None:
        start = datetime.fromtimestamp(hour * _HOUR, UTC)
        folder = self.root / f"date={start:%Y-%m-%d}" / f"hour={start:%H}"
        folder.mkdir(parents=True, exist_ok=True)
        self.seq += 1
        name = f"part-{self.router}-{self.seq:06d}.parquet"
        self.final, self.tmp = folder / name, folder / f".{name}.inprogress"
        codec = self.config.compression
        self.writer = pq.ParquetWriter(
            self.tmp,
            SCHEMA,
            compression=None if codec == "none" else codec,
            use_dictionary=_DICTIONARY,
            write_statistics=_STATISTICS,
        )
        self.hour, self.opened = hour, self.clock()

    def close(self) -> None:
        """Close the open file and move it into view."""
        if self.writer is None:
            return
        try:
            self.writer.close()
            assert self.tmp is not None and self.final is not None
            os.replace(self.tmp, self.final)
            self.files += 1
        except Exception:
            self.errors += 1
            log.error("event log: closing %s failed", self.tmp, exc_info=True)
            self._discard()
        self.writer = None

    def _discard(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:
                pass
            self.writer = None
        if self.tmp is not None:
            try:
                self.tmp.unlink(missing_ok=True)
            except OSError:
                pass

    def maintain(self) -> None:
        """Close a file past its age or hour; delete files past the log's bounds."""
        try:
            now = self.clock()
            if self.writer is not None and (
                now - self.opened >= self.config.max_file_age or int(now // _HOUR) != self.hour
            ):
                self.close()
            self._bound(now)
        except Exception:  # housekeeping must not take the writer down; try again next tick
            self.errors += 1
            log.error("event log: housekeeping failed", exc_info=True)

    def _bound(self, now: float) -> None:
        files = []
        for path in self.root.glob("date=*/hour=*/part-*.parquet"):
            m = _PART.match(path.name)
            if m is None or m["router"] != self.router:
                continue
            try:
                hour_start = (
                    datetime.strptime(
                        f"{path.parent.parent.name[5:]} {path.parent.name[5:]}", "%Y-%m-%d %H"
                    )
                    .replace(tzinfo=UTC)
                    .timestamp()
                )
                size = path.stat().st_size
            except (ValueError, OSError):
                continue
            files.append((hour_start, int(m["seq"]), size, path))
        files.sort()
        total = sum(f[2] for f in files)
        for hour_start, _, size, path in files:
            too_old = hour_start + _HOUR <= now - self.config.max_total_age
            if not too_old and total <= self.config.max_total_bytes:
                break
            try:
                path.unlink()
            except OSError:
                log.warning("event log: cannot delete %s", path, exc_info=True)
                continue
            total -= size
            self.deleted += 1
            for folder in (path.parent, path.parent.parent):  # drop emptied partitions
                try:
                    folder.rmdir()
                except OSError:
                    break
