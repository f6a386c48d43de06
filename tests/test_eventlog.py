"""The Parquet event log: layout, schema, lossless values, rotation and bounds, the table
builder's fast paths, and the writer process's life."""

from __future__ import annotations

import math
import os
import signal
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from enum import IntEnum
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from support import Clock, wait_for, wait_until

from aa.mesh import Event, UsageError
from aa.router import EventLog, EventLogConfig
from aa.router.caches import encode_events
from aa.router.eventlog import (
    SCHEMA,
    TYPE_NAMES,
    WriterProcess,
    build_table,
    decode_json,
    decode_value,
    encode_json,
    encode_value,
)
from aa.router.eventlog import process as eventlogprocess

T0 = datetime(2030, 1, 1, 10, 0, tzinfo=UTC)


def ev(i: int, **values: object) -> Event:
    meta = {"time": T0 + timedelta(seconds=i), "client": "c1", "router": "origin", "ttl": 4}
    return Event(values={"i": i, **values}, type="reading", meta=meta, id=f"e{i}")


def files(root: Path) -> list[Path]:
    return sorted(root.glob("eventlog/date=*/hour=*/*"))


def read(root: Path) -> ds.Dataset:
    return ds.dataset(root / "eventlog", format="parquet", partitioning="hive")


@pytest.fixture
def clock() -> Clock:
    return Clock(start=T0.timestamp())  # the log's clock is wall seconds


@pytest.fixture
async def elog(tmp_path: Path, clock: Clock) -> AsyncIterator[EventLog]:
    async with EventLog(data_dir=tmp_path, router_id="r1", clock=clock) as log:
        yield log


SAMPLE = {
    "int": 101,
    "big": 2**64 - 1,
    "float": 1.0,
    "nan": math.nan,
    "inf": -math.inf,
    "str": 'snø "quoted"',
    "bytes": b"\x00\xff",
    "none": None,
    "bool": False,
    "aware": datetime(2024, 5, 1, 12, 0, 0, 250_000, tzinfo=UTC),
    "naive": datetime(2024, 5, 1, 12, 0, 0),
    "list": [1, 2.0, b"x", None, [datetime(2024, 1, 1)]],
    "map": {"$bytes": "not a tag", "$$x": 1, "inner": {"f": math.inf}},
}


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_value_text_round_trips_with_types() -> None:
    for name, value in SAMPLE.items():
        text, type_name = encode_value(value)  # type: ignore[arg-type]
        assert type_name in TYPE_NAMES
        assert same(decode_value(text, type_name), value), name
    assert encode_value(101) == ("101", "int")
    assert encode_value(1.0) == ("1.0", "float")
    assert encode_value("hall") == ("hall", "str")
    assert encode_value(True) == ("true", "bool")
    assert encode_value(None) == (None, "null")
    assert same(decode_json(encode_json(SAMPLE)), SAMPLE)  # type: ignore[arg-type]
    assert '"$$bytes"' in encode_json({"$bytes": "x"})


async def test_files_read_back_with_hive_partitions_and_schema(
    tmp_path: Path, elog: EventLog, clock: Clock
) -> None:
    elog.append(ev(1, **SAMPLE))  # type: ignore[arg-type]
    for i in range(2, 101):
        elog.append(ev(i, t=20.5 + i))
    await elog.flush()
    (path,) = files(tmp_path)
    rel = path.relative_to(tmp_path).as_posix()
    assert rel == "eventlog/date=2030-01-01/hour=10/part-r1-000001.parquet"
    assert pq.read_schema(path).remove_metadata() == SCHEMA

    table = read(tmp_path).to_table()
    assert table.num_rows == 100
    assert set(table.column_names) == set(SCHEMA.names) | {"date", "hour"}
    rows = sorted(table.to_pylist(), key=lambda r: r["time"])
    first = rows[0]
    assert first["id"] == "e1" and first["type"] == "reading"
    assert first["time"] == T0 + timedelta(seconds=1)
    assert (first["router"], first["client"], first["logged_by"]) == ("origin", "c1", "r1")
    assert first["hour"] == 10 and str(first["date"]) == "2030-01-01"
    texts, types = dict(first["values"]), dict(first["values_types"])
    for name, value in SAMPLE.items():
        assert same(decode_value(texts[name], types[name]), value), name
    # meta without its time stamp: that is the exact `time` column
    assert decode_json(first["meta_json"]) == {"client": "c1", "router": "origin", "ttl": 4}
    assert dict(rows[5]["values_types"]) == {"i": "int", "t": "float"}


async def test_statistics_for_the_columns_readers_skip_by_dictionaries_but_for_unique_ones(
    tmp_path: Path, elog: EventLog
) -> None:
    # Readers skip row groups by time, type, router and client; ids and the values' text are
    # mostly unique, so a dictionary or min/max for them would cost the writer per row and
    # help nobody, and no engine skips row groups by a map's keys or the meta's JSON.
    for i in range(1000):
        elog.append(ev(i, t=20.5 + i, room=f"room {i % 3}"))
    await elog.flush()
    (path,) = files(tmp_path)
    group = pq.ParquetFile(path).metadata.row_group(0)
    chunks = {group.column(c).path_in_schema: group.column(c) for c in range(group.num_columns)}
    for column in ("time", "type", "router", "client", "logged_by"):
        assert chunks[column].is_stats_set, column
        assert "RLE_DICTIONARY" in chunks[column].encodings, column
    for column in ("values.key_value.key", "values_types.key_value.value", "meta_json"):
        assert not chunks[column].is_stats_set, column
        assert "RLE_DICTIONARY" in chunks[column].encodings, column
    for column in ("id", "values.key_value.value"):
        assert not chunks[column].is_stats_set, column
        assert "RLE_DICTIONARY" not in chunks[column].encodings, column
    assert read(tmp_path).count_rows() == 1000


async def test_hidden_until_closed_and_flush_makes_visible(
    tmp_path: Path, elog: EventLog, clock: Clock
) -> None:
    for i in range(10_000):  # one full row group: handed to the writer at once
        elog.append(ev(i))
    clock.advance(elog.config.defer_seconds)  # held no longer: written, file still open
    await elog.maintain()  # runs after the write on the one writer thread
    (open_file,) = files(tmp_path)
    assert open_file.name.startswith(".") and open_file.name.endswith(".inprogress")
    assert read(tmp_path).count_rows() == 0  # readers skip hidden files
    await elog.flush()
    assert read(tmp_path).count_rows() == 10_000
    assert elog.stats().rows == 10_000 and elog.stats().files == 1


async def test_rotation_by_hour_age_and_size(tmp_path: Path, clock: Clock) -> None:
    config = EventLogConfig(
        max_file_age=60.0, max_file_bytes=50_000, row_group_rows=100, defer_bytes=0
    )
    async with EventLog(config, data_dir=tmp_path, router_id="r1", clock=clock) as elog:
        for i in range(100):  # a full row group: written, its file left open
            elog.append(ev(i))
        await elog.maintain()
        assert read(tmp_path).count_rows() == 0
        clock.advance(61)  # the open file is now too old: housekeeping closes it
        await elog.maintain()
        assert read(tmp_path).count_rows() == 100
        clock.advance(3600)  # next hour: a new partition
        for i in range(100, 120):
            elog.append(ev(i))
        await elog.flush()
        for i in range(2000):  # enough rows to pass max_file_bytes several times
            elog.append(ev(i, pad=os.urandom(60).hex()))  # does not compress
        await elog.flush()
    names = [p.relative_to(tmp_path / "eventlog").as_posix() for p in files(tmp_path)]
    assert names[0] == "date=2030-01-01/hour=10/part-r1-000001.parquet"
    assert all(
        n.startswith(("date=2030-01-01/hour=10/", "date=2030-01-01/hour=11/")) for n in names
    )
    assert len([n for n in names if "hour=11" in n]) >= 3  # hour change, then size
    assert read(tmp_path).count_rows() == 2120
    for p in files(tmp_path):
        assert p.stat().st_size < 50_000 + 30_000  # at most one row group past the bound


async def test_total_size_and_age_bounds_delete_oldest(tmp_path: Path, clock: Clock) -> None:
    config = EventLogConfig(max_total_bytes=10**9, max_total_age=2 * 3600.0)
    async with EventLog(config, data_dir=tmp_path, router_id="r1", clock=clock) as elog:
        for h in range(4):  # one file per hour, 10:00 .. 13:00
            elog.append(ev(h))
            await elog.flush()
            clock.advance(3600)
        assert len(files(tmp_path)) == 4
        # now 14:00: hours that ended at or before 12:00 are past the 2 h age bound
        await elog.maintain()
        left = [p.parent.name for p in files(tmp_path)]
        assert left == ["hour=12", "hour=13"]
        assert not (tmp_path / "eventlog/date=2030-01-01/hour=10").exists()  # emptied: removed
    size = files(tmp_path)[0].stat().st_size
    config = EventLogConfig(max_total_bytes=size + 1)
    async with EventLog(config, data_dir=tmp_path, router_id="r1", clock=clock) as elog:
        await elog.maintain()
        assert [p.parent.name for p in files(tmp_path)] == ["hour=13"]  # oldest went first
        assert elog.stats().deleted == 1


async def test_restart_continues_numbering_and_removes_crash_leftovers(
    tmp_path: Path, clock: Clock
) -> None:
    async with EventLog(data_dir=tmp_path, router_id="r/1", clock=clock) as elog:
        elog.append(ev(1))
        await elog.flush()
    folder = files(tmp_path)[0].parent
    leftover = folder / ".part-r_1-000002.parquet.inprogress"
    leftover.write_bytes(b"PAR1 half a file")
    other = folder / "part-other-000007.parquet"  # another router's file: left alone
    pq.write_table(read(tmp_path).to_table().drop_columns(["date", "hour"]), other)
    async with EventLog(data_dir=tmp_path, router_id="r/1", clock=clock) as elog:
        elog.append(ev(2))
        await elog.flush()
    names = sorted(p.name for p in files(tmp_path))
    assert names == [
        "part-other-000007.parquet",
        "part-r_1-000001.parquet",
        "part-r_1-000003.parquet",
    ]


async def test_writer_too_far_behind_drops_and_counts(tmp_path: Path, clock: Clock) -> None:
    config = EventLogConfig(max_pending_rows=5, row_group_rows=1000)
    async with EventLog(config, data_dir=tmp_path, router_id="r1", clock=clock) as elog:
        for i in range(8):
            elog.append(ev(i))
        assert elog.stats().dropped == 3
        await elog.flush()
    assert read(tmp_path).count_rows() == 5


async def test_append_needs_a_started_log(tmp_path: Path) -> None:
    elog = EventLog(data_dir=tmp_path, router_id="r1")
    with pytest.raises(UsageError, match="not started"):
        elog.append(ev(1))
    await elog.start()
    await elog.aclose()
    with pytest.raises(UsageError, match="closed"):
        elog.append(ev(1))
    with pytest.raises(UsageError):
        EventLogConfig(row_group_rows=0)


async def test_event_without_time_stamp_keeps_all_meta(
    tmp_path: Path, elog: EventLog, clock: Clock
) -> None:
    naive = datetime(2030, 1, 1, 9, 0)
    elog.append(Event(values={"v": b"\x01"}, meta={"time": naive}, id="a"))
    elog.append(Event(values={}, id="b"), now=clock.t + 5)
    await elog.flush()
    rows = {r["id"]: r for r in read(tmp_path).to_table().to_pylist()}
    assert rows["a"]["time"] == T0  # logged at the clock's time
    assert decode_json(rows["a"]["meta_json"]) == {"time": naive}
    assert dict(rows["a"]["values_types"]) == {"v": "bytes"}
    assert rows["b"]["time"] == T0 + timedelta(seconds=5)
    assert rows["b"]["type"] is None and rows["b"]["router"] is None


# -- the table builder: its fast paths give exactly logcodec's text ---------------------------


def reference_rows(events: list[Event], logged: float) -> list[dict[str, object]]:
    """What each row must hold, one event at a time through `aa.router.eventlog.codec`."""
    rows = []
    for e in events:
        meta, t = dict(e.meta), e.meta.get("time")
        if type(t) is datetime and t.tzinfo is not None:
            del meta["time"]
            when = t.astimezone(UTC)
        else:
            when = datetime.fromtimestamp(logged, UTC)
        r, c = meta.get("router"), meta.get("client")
        pairs = [(k, *encode_value(v)) for k, v in e.values.items()]  # type: ignore[arg-type]
        rows.append(
            {
                "id": e.id or "",
                "type": e.type,
                "time": when,
                "router": r if type(r) is str else None,
                "client": c if type(c) is str else None,
                "logged_by": "me",
                "values": [(k, text) for k, text, _ in pairs],
                "values_types": [(k, ty) for k, _, ty in pairs],
                "meta_json": encode_json(meta),  # type: ignore[arg-type]
            }
        )
    return rows


class Level(IntEnum):
    HIGH = 3


class Tag(str):
    pass


def test_build_table_matches_logcodec_row_by_row() -> None:
    stamp = T0 + timedelta(microseconds=250)
    plus2 = datetime(2030, 1, 1, 12, 0, 0, 7, tzinfo=timezone(timedelta(hours=2)))
    batches = [
        [ev(i, f=i / 3, s=f"s{i}") for i in range(50)],  # the common case: str, int, float only
        [ev(1, **SAMPLE)],  # type: ignore[arg-type]
        [ev(2, x=math.inf), ev(3, y="inf", z=-0.0), ev(4, n=math.nan)],  # non-finite floats only
        [ev(5, b=True, level=Level.HIGH, tag=Tag("t"), none=None, big=2**63)],  # subclasses, None
        [Event.trusted({}, None, {}, None)],  # no id, no values, no meta
        [
            Event.trusted({"v": 1}, "t", {"time": stamp, "$k": "$v", "path": ["r1", "r2"]}, "a"),
            Event.trusted({"v": 2}, "t", {"time": plus2, "router": 7, "client": b"c"}, "b"),
            Event.trusted({"v": 3}, "t", {"time": None, "x": [b"\x00", datetime(2030, 1, 1)]}, "c"),
            Event.trusted({"v": 4}, "t", {"time": [1, 2], "f": math.nan}, "d"),
            Event.trusted({"v": 5}, "t", {"time": "noon", "router": "r9", "client": "c9"}, "e"),
        ],
        # Metas of one shape (keys and their order): encoded a column at a time.
        [
            Event.trusted(
                {"v": i},
                None,
                {
                    "time": stamp,
                    "client": "c",
                    "ttl": i % 3,
                    "path": ["r1", f"r{i % 2}"],
                    "on": i % 2 == 0,
                    "w": i / 4,
                    "s": f"${i}\u00e6",
                    "l": [1, 2.0, "x"],
                    "tag": Tag("t"),
                },
                f"s{i}",
            )
            for i in range(40)
        ],
        [
            Event.trusted({}, None, {"time": stamp, "m": {"$x": i}, "k": "v"}, f"m{i}")
            for i in range(3)
        ],
        [Event.trusted({}, None, {"time": stamp, "$k": i}, f"k{i}") for i in range(3)],
        [
            Event.trusted({}, None, {"time": stamp, "f": x, "b": b"\x01"}, f"f{i}")
            for i, x in enumerate([1.0, math.nan])
        ],
        [
            Event.trusted({}, None, {"time": stamp, "n": v, "x": w}, f"n{i}")
            for i, (v, w) in enumerate([(1, True), (True, 1)])
        ],
        [
            Event.trusted({}, None, {"time": stamp}, f"t{i}") for i in range(2)
        ],  # nothing but the time
    ]
    logged = T0.timestamp() + 0.5
    for events in batches:
        ids, types, values, metas = zip(*[(e.id, e.type, e.values, e.meta) for e in events])
        before = [dict(m) for m in metas]
        table = build_table(ids, types, values, metas, [logged] * len(events), "me")
        assert table.schema == SCHEMA
        assert table.to_pylist() == reference_rows(events, logged)
        assert list(metas) == before  # the events are left as they were


# -- the writer process ------------------------------------------------------------------------


def chunk(events: list[Event], logged: float) -> tuple[float, int, bytes, None]:
    data = encode_events(events)
    assert data is not None
    return logged, len(events), data, None


def test_writer_process_relays_its_log_and_counts_what_it_cannot_read(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    writer = WriterProcess(tmp_path / "eventlog", "r1", EventLogConfig(), clock)
    try:
        writer.write([(clock.t, 3, b"\xc1 not msgpack", None), chunk([ev(1), ev(2)], clock.t)])
        writer.close()  # writes what it held
        assert (writer.rows, writer.dropped, writer.errors, writer.waiting) == (2, 3, 1, 0)
        assert "3 rows cannot be decoded" in caplog.text  # logged by the router, for the writer
    finally:
        writer.stop()
    assert writer.pid is None and writer.files == 1
    assert read(tmp_path).count_rows() == 2


def test_writer_process_closes_its_file_when_the_router_dies(tmp_path: Path, clock: Clock) -> None:
    writer = WriterProcess(tmp_path / "eventlog", "r1", EventLogConfig(defer_pause=3600.0), clock)
    writer.write([chunk([ev(i) for i in range(100)], clock.t)])
    assert writer.waiting == 100 and writer.rows == 0  # held: rows keep coming, for all it knows
    proc = writer._proc
    assert proc is not None and writer._conn is not None
    writer._conn.close()  # what the router's death does to the writer's input
    assert proc.wait(60) == 0
    assert read(tmp_path).count_rows() == 100  # written, closed with its footer, moved into view


async def test_a_killed_writer_process_drops_its_rows_and_a_new_one_takes_over(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    async with EventLog(data_dir=tmp_path, router_id="r1", clock=clock) as elog:
        elog.extend([ev(i) for i in range(10)])
        await elog.flush()
        pid = elog._w.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        elog.extend([ev(i) for i in range(10, 15)])
        await elog.flush()  # the write finds the writer dead: its 5 rows are dropped
        assert elog.stats().dropped == 5 and elog.stats().errors == 1
        assert "lost the writer process" in caplog.text
        elog.append(ev(15))
        await elog.flush()  # too soon to start another one: dropped too
        assert elog.stats().dropped == 6
        clock.advance(eventlogprocess.RESTART_DELAY)
        elog.extend([ev(i) for i in range(16, 20)])
        await elog.flush()
        assert elog._w.pid not in (None, pid)
        assert elog.stats().rows == 14 and elog.stats().files == 2
    names = sorted(p.name for p in files(tmp_path))
    assert names == ["part-r1-000001.parquet", "part-r1-000002.parquet"]
    assert sorted(read(tmp_path).to_table()["id"].to_pylist()) == sorted(
        f"e{i}" for i in [*range(10), *range(16, 20)]
    )


async def test_extend_logs_a_batch_at_one_time_and_drops_beyond_the_bound(
    tmp_path: Path, clock: Clock
) -> None:
    config = EventLogConfig(max_pending_rows=5, row_group_rows=1000)
    async with EventLog(config, data_dir=tmp_path, router_id="r1", clock=clock) as elog:
        elog.extend([Event(values={"i": i}, id=f"x{i}") for i in range(3)], now=clock.t + 7)
        elog.extend([ev(i) for i in range(3, 8)])  # room for two
        assert elog.stats().dropped == 3
        await elog.flush()
    table = read(tmp_path).to_table()
    times = {r["id"]: r["time"] for r in table.to_pylist()}
    assert len(times) == 5 and times["x0"] == times["x2"] == T0 + timedelta(seconds=7)


async def test_rows_are_held_while_they_come_and_written_when_the_router_pauses(
    tmp_path: Path, clock: Clock
) -> None:
    config = EventLogConfig(row_group_rows=100, defer_pause=0.2)
    async with EventLog(config, data_dir=tmp_path, router_id="r1", clock=clock) as elog:
        for start in (0, 100, 200):  # three writes of a row group each
            elog.extend([ev(i) for i in range(start, start + 100)])
        await elog.maintain()
        before = elog.stats()

        async def written() -> bool:
            await elog.maintain()  # a command: brings the writer's counters
            return elog.stats().rows == 300

        await wait_until(written, timeout=30, every=0.5)  # no flush: the pause alone (0.2 s)
        assert elog.stats().waiting == 0 and elog.stats().dropped == 0
        assert before.rows + before.waiting == 300  # held at first (unless the machine paused)
        await elog.flush()
    assert sorted(read(tmp_path).to_table()["id"].to_pylist()) == sorted(
        f"e{i}" for i in range(300)
    )


async def test_held_rows_are_written_at_the_bounds_of_bytes_and_age(
    tmp_path: Path, clock: Clock
) -> None:
    ten_rows = len(encode_events([ev(i) for i in range(10, 20)]) or b"")  # as long as 20..29's
    config = EventLogConfig(
        row_group_rows=10, defer_pause=3600.0, defer_bytes=2 * ten_rows, defer_seconds=60.0
    )
    async with EventLog(config, data_dir=tmp_path, router_id="r1", clock=clock) as elog:
        elog.extend([ev(i) for i in range(10)])  # a write of 10 rows
        elog.extend([ev(i) for i in range(10, 20)])  # and another: within the bytes
        await elog.maintain()
        assert (elog.stats().rows, elog.stats().waiting) == (0, 20)
        elog.extend([ev(i) for i in range(20, 30)])  # a third: beyond them, the oldest is written
        await elog.maintain()
        assert (elog.stats().rows, elog.stats().waiting) == (10, 20)
        clock.advance(59)
        await elog.maintain()
        assert elog.stats().waiting == 20  # not yet a minute old
        clock.advance(1)
        await elog.maintain()
        assert (elog.stats().rows, elog.stats().waiting) == (30, 0)  # a minute: written
        await elog.flush()
    assert read(tmp_path).count_rows() == 30


async def test_the_rows_a_killed_writer_held_are_counted_as_dropped(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    config = EventLogConfig(defer_pause=3600.0, row_group_rows=7)
    async with EventLog(config, data_dir=tmp_path, router_id="r1", clock=clock) as elog:
        elog.extend([ev(i) for i in range(7)])
        await elog.maintain()
        assert elog.stats().waiting == 7
        pid = elog._w.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        elog.extend([ev(i) for i in range(7, 9)])
        await elog.flush()  # finds it dead: its 7 held rows and these 2 are lost, and counted
        assert (elog.stats().dropped, elog.stats().waiting, elog.stats().rows) == (9, 0, 0)
        assert "9 rows dropped" in caplog.text


def test_the_defer_settings_are_checked() -> None:
    with pytest.raises(UsageError, match="defer_bytes"):
        EventLogConfig(defer_bytes=-1)
    with pytest.raises(UsageError, match="defer_pause"):
        EventLogConfig(defer_pause=0)
    assert EventLogConfig(defer_bytes=0).defer_bytes == 0  # 0: written as they come


async def test_a_relaying_router_logs_the_events_from_the_bytes_they_came_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A router in the middle of a line logs the events it relays without encoding them
    again, yet its log holds them as it dispatched them: its hop's ttl and path in each
    meta, not the origin's inside those bytes."""
    import dataclasses

    from support.meshes import FAST, line, wait_shape

    from aa.router import Router, RouterConfig, sinks

    encoded: list[Event] = []
    encode = sinks.encode_events

    def counting(events: Sequence[Event]) -> bytes | None:
        encoded.extend(events)
        return encode(events)

    monkeypatch.setattr(sinks, "encode_events", counting)
    flood = dataclasses.replace(FAST, routing="flood")  # r1 relays everything
    routers = [
        Router(RouterConfig(port=0, name=f"r{i}", mesh=flood, data_dir=tmp_path / f"r{i}"))
        for i in range(3)
    ]
    for r in routers:
        await r.start()
    try:
        r0, r1, r2 = routers
        for a, b in line(3):
            routers[a].mesh.add_peer(routers[b].endpoint)
        await wait_shape(routers, line(3))
        seen: list[Event] = []
        r1.dispatcher.sinks.append(seen.append)
        for i in range(40):
            r0.publish({"i": i, "t": 20.5 + i}, type="reading", meta={"n": i} if i % 2 else None)
        await wait_for(lambda: r2.counters["dispatched"] >= 40, timeout=10)
        assert r1.event_log is not None
        await r1.event_log.flush()
    finally:
        for r in reversed(routers):
            await r.aclose()
    assert len(seen) == 40
    assert not [e for e in encoded if r1.id in e.meta.get("path", ())]  # none encoded at r1
    rows = {row["id"]: row for row in read(tmp_path / "r1").to_table().to_pylist()}
    assert rows.keys() == {e.id for e in seen}
    for e in seen:
        meta = decode_json(rows[e.id]["meta_json"])
        assert meta == {k: v for k, v in e.meta.items() if k != "time"}
        assert meta["path"] == [r0.id, r1.id] and meta["ttl"] == e.meta["ttl"]
        assert rows[e.id]["time"] == e.meta["time"]
