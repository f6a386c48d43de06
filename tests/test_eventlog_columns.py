"""The event log's compiled reader (`aa.router.eventlog._columns`) writes exactly the table
the reference path (`unpack`, then `build_table`) writes of the same rows, and hands every
row it does not write exactly, or cannot read, to that path."""

from __future__ import annotations

import math
import os
import random
import struct
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aa.mesh import Event
from aa.mesh.protocol import FloodGroup, unpack
from aa.router import EventLogConfig
from aa.router.caches import encode_events
from aa.router.eventlog import Writer, build_table, fastpath

pytestmark = pytest.mark.skipif(
    not fastpath.COMPILED,
    reason="this install has no compiled event log reader (no Cython or C compiler)",
)

T0 = datetime(2030, 1, 1, 10, 0, tzinfo=UTC)
LOGGED = T0.timestamp() + 0.5


Chunk = tuple[float, int, bytes, Any]


def chunk(events: list[Event], logged: float = LOGGED) -> Chunk:
    data = encode_events(events)
    assert data is not None
    return logged, len(events), data, None


def reference(chunks: list[Chunk]) -> pa.Table:
    rows: list[Any] = []
    logged: list[float] = []
    for when, _, data, hop in chunks:
        decoded = unpack(data)
        if hop is not None:  # as a relaying router dispatched them
            for row in decoded:
                row[3] = row[3] if row[3] is not None else {}
                row[3].update({"ttl": hop[0], "path": list(hop[1])})
        rows += decoded
        logged += [when] * len(decoded)
    ids, types, values, metas = zip(*rows)
    return build_table(ids, types, values, metas, logged, "me")


def meta(i: int, /, **more: object) -> dict[str, Any]:
    return {
        "time": T0 + timedelta(microseconds=7 * i),
        "client": "c-5f3a",
        "address": "127.0.0.1:54321",
        "router": "r-0123",
        "ttl": 8,
        "path": ["r-0123"],
        **more,
    }


#: Rows the compiled reader writes itself.
FAST = [
    [  # the router's usual event
        Event.trusted(
            {"Temperature": 20 + i, "Sensor": "lab-1", "Humidity": 0.5, "Seq": i, "Sent": i / 7},
            "reading",
            meta(i),
            f"r-0123-{i:x}",
        )
        for i in range(300)
    ],
    [
        Event.trusted(
            {
                "big": 2**64 - 1,
                "small": -(2**63),
                "neg": -5,
                "f": -0.0,
                "tiny": 1e-300,
                "huge": 1.5e300,
                "nan": math.nan,
                "inf": math.inf,
                "minf": -math.inf,
                "none": None,
                "yes": True,
                "no": False,
                "text": 'snø "quoted" \\ \n\t\x01\x1f\u2028 ✓',
                "$key": "$value",
                "list": [1, 2.5, "x", None, True, [[]], {}],
                "map": {"a": {"b": [1, "\x00"]}, "": -1},
            },
            None,
            meta(1, on=True, w=0.25, s='\x7f"\\', nested={"k": [1, None, False]}, empty={}),
            None,
        )
    ],
    [Event.trusted({}, None, {}, None)],  # no id, no type, no values, no meta
    [  # no time: the logged time, and meta_json as it is
        Event.trusted({"v": 1}, "t", {"client": "c", "router": "r"}, "a"),
        Event.trusted({"v": 2}, "t", {"router": 7, "client": ["c"], "x": 1}, "b"),
        Event.trusted({"v": 3}, "t", {"time": T0, "router": "r"}, "c"),
    ],
    [  # a stamp per event, at the ends of what a datetime holds
        Event.trusted({"v": i}, "t", {"time": t}, f"t{i}")
        for i, t in enumerate(
            [
                datetime(1, 1, 1, tzinfo=UTC),
                datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
                datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
                datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=2))),
                datetime(2106, 2, 7, 6, 28, 16, tzinfo=UTC),  # past 32 bits of seconds
            ]
        )
    ],
]

#: Rows it hands to the reference path: what typed JSON tags, or what is no plain value.
REFUSED = [
    [Event.trusted({"b": b"\x00"}, "t", meta(0), "a")],
    [Event.trusted({"d": T0}, "t", meta(0), "a")],
    [Event.trusted({"d": datetime(2030, 1, 1)}, "t", meta(0), "a")],
    [Event.trusted({"l": [b"x"]}, "t", meta(0), "a")],
    [Event.trusted({"l": [math.nan]}, "t", meta(0), "a")],
    [Event.trusted({"m": {"$x": 1}}, "t", meta(0), "a")],
    [Event.trusted({"v": 1}, "t", meta(0, **{"$k": 1}), "a")],
    [Event.trusted({"v": 1}, "t", meta(0, f=math.inf), "a")],
    [Event.trusted({"v": 1}, "t", {"time": "noon"}, "a")],
    [Event.trusted({"v": 1}, "t", {"time": datetime(2030, 1, 1)}, "a")],
    [Event.trusted({"v": 1}, "t", {"time": None}, "a")],
]


@pytest.mark.parametrize("events", FAST, ids=range(len(FAST)))
def test_compiled_reader_writes_the_reference_table(events: list[Event]) -> None:
    chunks = [chunk(events[i : i + 100]) for i in range(0, len(events), 100)]
    table = fastpath.table_from_chunks(chunks, "me")
    assert table is not None
    expected = reference(chunks)
    assert table.equals(expected), (table.to_pylist()[:2], expected.to_pylist()[:2])


@pytest.mark.parametrize("events", REFUSED, ids=range(len(REFUSED)))
def test_compiled_reader_refuses_what_it_would_not_write_exactly(events: list[Event]) -> None:
    good = chunk(FAST[0][:10])
    assert fastpath.table_from_chunks([good, chunk(events)], "me") is None


def relayed(events: list[Event]) -> tuple[Chunk, Chunk]:
    """The chunk a relaying router logs for *events* come from a peer in one flood group
    (the group's bytes and its hop), and the chunk of the same events as it dispatched
    them, encoded again."""
    group = FloodGroup.encode(events, ttl=8, path=["r-0123"])
    hop = (7, ("r-0123", "r-4567"))
    dispatched = group.decode(ttl=hop[0], path=list(hop[1]))
    return (LOGGED, len(events), group.blob, hop), chunk(dispatched)


RELAYED = [
    FAST[0][:50],  # the usual event: a ttl and a path in each meta, in the middle
    [
        Event.trusted({"v": 1}, "t", {"client": "c"}, "a"),  # neither: both after the rest
        Event.trusted({"v": 2}, "t", {"path": ["x"], "z": 1}, "b"),  # a path: ttl after
        Event.trusted({"v": 3}, "t", {"ttl": 1, "time": T0}, "c"),  # a ttl: path after
        Event.trusted({"v": 4}, "t", {}, "d"),
        Event.trusted({"v": 5}, "t", {"ttl": [1, {"deep": [2]}], "path": {"a": "b"}}, "e"),
    ],
]


@pytest.mark.parametrize("events", RELAYED, ids=range(len(RELAYED)))
def test_a_relayed_group_is_logged_from_its_bytes_as_it_was_dispatched(
    events: list[Event],
) -> None:
    as_received, as_dispatched = relayed(events)
    table = fastpath.table_from_chunks([as_received], "me")
    assert table is not None
    assert table.equals(reference([as_dispatched]))
    assert table.equals(reference([as_received]))


def test_a_relayed_group_the_compiled_reader_refuses_is_logged_the_reference_way(
    tmp_path: Path,
) -> None:
    events = [Event.trusted({"b": b"x"}, "t", meta(0), "a"), *FAST[0][:3]]
    as_received, as_dispatched = relayed(events)
    assert fastpath.table_from_chunks([as_received], "me") is None
    writer = Writer(tmp_path, "me", EventLogConfig(), lambda: LOGGED)
    writer.write([as_received])
    writer.close()
    table = ds.dataset(tmp_path, format="parquet", partitioning="hive").to_table()
    rows = table.drop_columns(["date", "hour"]).to_pylist()
    assert rows == reference([as_dispatched]).to_pylist()


def packb(rows: object, *, use_bin_type: bool = True) -> bytes:
    data = msgpack.packb(rows, datetime=True, use_bin_type=use_bin_type)
    assert isinstance(data, bytes)
    return data


def test_compiled_reader_refuses_bytes_it_cannot_read() -> None:
    data = chunk(FAST[0][:3])[2]
    row = unpack(data)[0]

    def timed(extension: bytes) -> bytes:  # the row, its meta's time stamp as given
        return packb([[*row[:3], {"time": 0}]])[:-1] + extension

    deep: list[Any] = [1]
    for _ in range(40):
        deep = [deep]
    bad = [
        b"",
        b"\xc1",
        data[:-1],  # cut short
        data + b"\x00",  # something after the rows
        data[:1] + b"\xdd\xff\xff\xff\xff",  # an array claiming 4 G items
        packb([[*row[:3]]]),  # a row of three
        packb([[1, *row[1:]]]),  # an int for an id
        packb([[row[0], 5, *row[2:]]]),  # an int for a type
        packb([[*row[:2], {1: 2}, row[3]]]),  # a non-str key
        packb([[*row[:2], [], row[3]]]),  # values that are no map
        packb([[*row[:3], []]]),  # a meta that is no map
        packb([[row[0].encode() + b"\xff", *row[1:]]], use_bin_type=False),  # not UTF-8
        timed(b"\xc7\x05\xff" + b"\x00" * 5),  # no Timestamp is 5 bytes
        timed(b"\xc7\x0c\xff" + b"\xff" * 4 + b"\x00" * 8),  # 4 G nanoseconds
        timed(b"\xd6\x05\x00\x00\x00\x00"),  # an extension of another type
        packb([[*row[:3], {"time": msgpack.Timestamp(2**40, 0)}]]),  # past year 9999
        packb([[*row[:2], {"deep": deep}, row[3]]]),  # lists in lists, too deep
    ]
    for data in bad:
        assert fastpath.table_from_chunks([(LOGGED, 1, data, None)], "me") is None, data


def test_a_chunk_of_the_wrong_shape_is_an_error_not_a_crash() -> None:
    _, count, data, _ = chunk(FAST[0][:3])
    for bad in [(LOGGED, count, data), (LOGGED, count), (LOGGED, count, "text", None)]:
        with pytest.raises((ValueError, TypeError)):
            fastpath.table_from_chunks([bad], "me")


def test_writer_writes_refused_rows_the_reference_way(tmp_path: Path) -> None:
    writer = Writer(tmp_path, "me", EventLogConfig(), lambda: LOGGED)
    events = FAST[0][:5] + REFUSED[0] + FAST[0][5:10]
    writer.write([chunk(events[:5]), chunk(events[5:6]), chunk(events[6:])])
    writer.write([(LOGGED, 2, b"\xc1 not msgpack", None), chunk(FAST[0][10:12])])
    writer.close()
    assert (writer.rows, writer.dropped, writer.errors, writer.files) == (13, 2, 1, 1)
    table = ds.dataset(tmp_path, format="parquet", partitioning="hive").to_table()
    assert table.column("id").to_pylist() == [e.id for e in events + FAST[0][10:12]]
    assert table.column("values_types").to_pylist()[5] == [("b", "bytes")]


def float_samples(n: int, seed: int) -> list[float]:
    """Finite floats of every kind the compiled reader writes by its own arithmetic or hands
    to Python's: readings, clock times, any bit pattern, neighbours of short decimals, the
    ends of the range written without an exponent, and near 2**53."""
    rnd = random.Random(seed)
    out: list[float] = []
    while len(out) < n:
        kind = rnd.randrange(7)
        if kind == 0:
            x = struct.unpack("<d", rnd.getrandbits(64).to_bytes(8, "little"))[0]
        elif kind == 1:
            x = 1.7e9 + rnd.random() * 1e8
        elif kind == 2:
            x = round(rnd.uniform(-1e6, 1e6), rnd.randint(0, 8))
        elif kind == 3:
            x = rnd.uniform(0.5, 10) * 10.0 ** rnd.choice([-6, -5, -4, -3, 14, 15, 16, 17])
        elif kind == 4:
            x = round(rnd.uniform(0, 1e4), rnd.randint(0, 6))
            x = math.nextafter(x, math.inf if rnd.random() < 0.5 else -math.inf)
        elif kind == 5:
            x = float(rnd.randint(2**52, 2**54)) + rnd.choice([0.0, 0.5, 0.25])
        else:
            x = rnd.choice([0.1, 0.2, 0.3, 1 / 3, 2 / 3, 0.5, 1e-4, 1e16, 9007199254740993.0])
            x *= rnd.choice([1, -1])
        if math.isfinite(x):
            out.append(x)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_compiled_reader_writes_each_float_as_repr_does(seed: int) -> None:
    floats = float_samples(20_000, seed)
    data = packb(
        [["e", None, {"v": floats, **{f"f{i}": x for i, x in enumerate(floats[:500])}}, {}]]
    )
    table = fastpath.table_from_chunks([(LOGGED, 1, data, None)], "me")
    assert table is not None
    texts = dict(table.column("values")[0].as_py())
    assert texts["v"] == "[" + ",".join(map(repr, floats)) + "]"
    assert [texts[f"f{i}"] for i in range(500)] == [repr(x) for x in floats[:500]]


@settings(max_examples=300, deadline=None)
@given(floats=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1))
def test_compiled_reader_writes_any_float_as_repr_does(floats: list[float]) -> None:
    table = fastpath.table_from_chunks(
        [(LOGGED, 1, packb([["e", None, {"v": floats}, {}]]), None)], "me"
    )
    assert table is not None
    assert dict(table.column("values")[0].as_py())["v"] == "[" + ",".join(map(repr, floats)) + "]"


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
)
plain = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.dictionaries(st.text(), plain, max_size=6), min_size=1, max_size=5),
    extra=st.dictionaries(st.text(), plain, max_size=3),
)
def test_compiled_reader_is_the_reference_or_refuses(
    values: list[dict[str, Any]], extra: dict[str, Any]
) -> None:
    events = [
        Event.trusted(v, "t", meta(i, **extra) if i % 2 else {**extra}, f"e{i}")
        for i, v in enumerate(values)
    ]
    chunks = [chunk(events)]
    table = fastpath.table_from_chunks(chunks, "me")
    if table is not None:
        assert table.equals(reference(chunks))


def test_the_pure_switch_takes_the_reference_path() -> None:
    show = "from aa.router.eventlog import fastpath; print(fastpath.COMPILED)"
    env = {**os.environ, "AA_PURE_PYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-c", show], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["False"], out.stderr


def test_a_key_twice_in_a_peer_s_bytes_is_logged_as_the_router_read_it() -> None:
    # A flood group's blob is logged as the peer sent it, and a hostile peer may write a key
    # twice in a map: the router read the last value only (a dict), and the log must say
    # the same, not both (a map column with a key twice fails Spark's reading of it).
    hop = (7, ("r-0123", "r-4567"))
    row = [b"\xa1a", b"\xa1t"]

    def blob(values: bytes, meta: bytes) -> bytes:
        return b"\x91\x94" + row[0] + row[1] + values + meta

    twice = [
        blob(b"\x82\xa1x\x01\xa1x\x02", b"\x80"),  # in the values
        blob(b"\x81\xa1x\x81\xa1m\x82\xa1k\x01\xa1k\x02", b"\x80"),  # in a map in them
        blob(b"\x81\xa1x\x01", b"\x82\xa1u\x01\xa1u\x02"),  # in the meta
        blob(b"\x81\xa1x\x01", b"\x81\xa1u\x82\xa1k\x01\xa1k\x02"),  # in a map in the meta
        blob(b"\x81\xa1x\x01", b"\x82\xa4user\xa1a\xa4user\xa1b"),  # a meta column's key
    ]
    for data in twice:
        for h in (None, hop):
            chunks: list[Chunk] = [(LOGGED, 1, data, h)]
            table = fastpath.table_from_chunks(chunks, "me")
            assert table is None or table.equals(reference(chunks)), (data, h)
    many = {f"k{i}": i for i in range(40)}  # past the keys compared one by one
    data = packb([["a", "t", many, {}]])
    data = data[:-1] + b"\xa3k39\x05\x80"  # one more key, a repeat
    data = data.replace(b"\x94\xa1a\xa1t\xde\x00\x28", b"\x94\xa1a\xa1t\xde\x00\x29")
    assert fastpath.table_from_chunks([(LOGGED, 1, data, None)], "me") is None
    fine = packb([["a", "t", many, {"u": 1}]])
    assert fastpath.table_from_chunks([(LOGGED, 1, fine, None)], "me") is not None


def test_a_hop_s_deeply_nested_ttl_is_refused_not_a_crash() -> None:
    # The blob's own ttl and path are skipped, not written: the skip is bounded in depth
    # like the rest (a subprocess: past the C stack, the interpreter would die).
    code = (
        "from aa.router.eventlog import fastpath\n"
        "deep = b'\\x91' * 1_000_000 + b'\\x01'\n"
        "data = b'\\x91\\x94\\xa1a\\xa1t\\x80\\x81\\xa3ttl' + deep\n"
        "print(fastpath.table_from_chunks([(1.0, 1, data, (7, ('r',)))], 'me'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.strip() == "None"
