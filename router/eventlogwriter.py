"""The event log's writer: Parquet files, their rotation and the log's bounds. Everything
here runs on the log's one writer thread (see `aa.router.eventlog` for the layout and the
schema, which is `SCHEMA` below).

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
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Final

import pyarrow as pa
import pyarrow.parquet as pq

from aa.mesh import Event
from aa.mesh.event import META_CLIENT, META_ROUTER, META_TIME

from .logcodec import encode_json, encode_value

if TYPE_CHECKING:
    from .eventlog import EventLogConfig

__all__ = ["SCHEMA", "Writer", "safe_name"]

log = logging.getLogger("aa.router.eventlog")

#: The columns of every file (the Hive partitions add ``date`` and ``hour`` on reading).
SCHEMA: Final = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("type", pa.string()),
        pa.field("time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("router", pa.string()),
        pa.field("client", pa.string()),
        pa.field("logged_by", pa.string(), nullable=False),
        pa.field("values", pa.map_(pa.string(), pa.string())),
        pa.field("values_types", pa.map_(pa.string(), pa.string())),
        pa.field("meta_json", pa.string()),
    ]
)

_MAP: Final = pa.map_(pa.string(), pa.string())
_PART = re.compile(r"^\.?part-(?P<router>.+)-(?P<seq>\d+)\.parquet(?P<tmp>\.inprogress)?$")
_HOUR = 3600
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "router"


class Writer:
    """The writer thread's state. Every method runs on that one thread."""

    def __init__(self, root: Path, router: str, config: "EventLogConfig", clock: Callable[[], float]):
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

    def write(self, rows: list[tuple[Event, float]]) -> None:
        i = 0
        while i < len(rows):  # split at hour boundaries: one file per partition
            hour = int(rows[i][1] // _HOUR)
            j = i + 1
            while j < len(rows) and int(rows[j][1] // _HOUR) == hour:
                j += 1
            self._write_part(rows[i:j], hour)
            i = j

    def _write_part(self, rows: list[tuple[Event, float]], hour: int) -> None:
        try:
            table = _table(rows, self.router)
            if self.writer is not None and self.hour != hour:
                self.close()
            if self.writer is None:
                self._open(hour)
            assert self.writer is not None and self.tmp is not None
            self.writer.write_table(table, row_group_size=len(rows))
            self.rows += len(rows)
            if (
                self.tmp.stat().st_size >= self.config.max_file_bytes
                or self.clock() - self.opened >= self.config.max_file_age
            ):
                self.close()
        except Exception:
            self.errors += 1
            self.dropped += len(rows)
            log.error("event log: writing %d rows failed; they are dropped", len(rows), exc_info=True)
            self._discard()

    def _open(self, hour: int) -> None:
        start = datetime.fromtimestamp(hour * _HOUR, timezone.utc)
        folder = self.root / f"date={start:%Y-%m-%d}" / f"hour={start:%H}"
        folder.mkdir(parents=True, exist_ok=True)
        self.seq += 1
        name = f"part-{self.router}-{self.seq:06d}.parquet"
        self.final, self.tmp = folder / name, folder / f".{name}.inprogress"
        codec = self.config.compression
        self.writer = pq.ParquetWriter(self.tmp, SCHEMA, compression=None if codec == "none" else codec)
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
                hour_start = datetime.strptime(
                    f"{path.parent.parent.name[5:]} {path.parent.name[5:]}", "%Y-%m-%d %H"
                ).replace(tzinfo=timezone.utc).timestamp()
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


def _table(rows: list[tuple[Event, float]], router: str) -> pa.Table:
    # Hot: every dispatched event passes here once, on the writer thread (which shares the
    # GIL with the event loop), so the loop is plain and the encoders have fast paths.
    ids, types, times, routers, clients, values, vtypes, metas = ([] for _ in range(8))
    for ev, logged in rows:
        meta = ev.meta
        t = meta.get(META_TIME)
        if type(t) is datetime and t.tzinfo is not None:
            times.append((t - _EPOCH) // _US)
            # The time is exact in its column: meta_json leaves it out (see the schema).
            meta = dict(meta)
            del meta[META_TIME]
        else:
            times.append(int(logged * 1_000_000))
        ids.append(ev.id or "")
        types.append(ev.type)
        r, c = meta.get(META_ROUTER), meta.get(META_CLIENT)
        routers.append(r if type(r) is str else None)
        clients.append(c if type(c) is str else None)
        vals, tys = [], []
        for k, v in ev.values.items():
            tv = type(v)
            if tv is str:  # the common types inline, the rest through encode_value
                vals.append((k, v))
                tys.append((k, "str"))
            elif tv is int:
                vals.append((k, str(v)))
                tys.append((k, "int"))
            else:
                text, ty = encode_value(v)
                vals.append((k, text))
                tys.append((k, ty))
        values.append(vals)
        vtypes.append(tys)
        metas.append(encode_json(meta))
    return pa.Table.from_arrays(
        [
            pa.array(ids, pa.string()),
            pa.array(types, pa.string()),
            pa.array(times, pa.timestamp("us", tz="UTC")),
            pa.array(routers, pa.string()),
            pa.array(clients, pa.string()),
            pa.array([router] * len(rows), pa.string()),
            pa.array(values, _MAP),
            pa.array(vtypes, _MAP),
            pa.array(metas, pa.string()),
        ],
        schema=SCHEMA,
    )
