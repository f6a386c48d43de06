"""Queries of the mining rewritten to cost less give the rows of the plainer form they
replace, also in the corner cases the simulated offices never reach, so the artefacts are
unchanged: schema's long form (one row per event and attribute, also for an attribute only
one of the two maps has), location's pairing of each scan with the nearest position in
time (ties, two positions at one instant, none within the gap, bucket edges), and
presence's distance of two fingerprints (the same double, to the last bit, as the lambdas
gave, for maps of any size)."""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aa.tools.mining.location import LocationConfig, _observations, _radio_rows
from aa.tools.mining.presence import UNROLLED_RADIOS, _rms, _rms_zipped
from aa.tools.mining.schema import _long
from aa.tools.mining.session import SparkConfig, open_session

#: A JVM of the Spark group's (tests/conftest.py `GROUPS`), whose worker already runs one.
pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'aa-mesh[mining]'")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java: apt-get install default-jre-headless")
    session = open_session(
        SparkConfig(
            master="local[1]", shuffle_partitions=1, driver_memory="1g", class_archive_dir=""
        ),
        input_bytes=1,
    )
    yield session
    session.stop()


def test_long_form_has_every_key_of_either_map(spark: Any) -> None:
    from pyspark.sql import functions as F

    t = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
    events = spark.createDataFrame(
        [
            ("quote", t, {"Price": "1.5", "Ccy": "EUR"}, {"Price": "float", "Ccy": "str"}),
            ("odd", t, {"A": "1", "B": None}, {"A": "int", "C": "str"}),
            ("empty", t, {}, {}),
            ("none", t, None, {"A": "int"}),
        ],
        "type string, time timestamp, values map<string,string>, values_types map<string,string>",
    )
    zipped = F.map_zip_with(
        "values", "values_types", lambda k, v, ty: F.struct(v.alias("text"), ty.alias("vtype"))
    )
    reference = events.select("type", "time", F.explode(zipped).alias("attr", "vt")).select(
        "type", "time", "attr", F.col("vt.text").alias("text"), F.col("vt.vtype").alias("vtype")
    )

    def rows(df: Any) -> list[tuple[Any, ...]]:
        return sorted((tuple(r) for r in df.collect()), key=repr)

    got = rows(_long(events))
    assert got == rows(reference)
    assert ("odd", t.replace(tzinfo=None), "C", None, "str") in [
        (a, b.replace(tzinfo=None), c, d, e) for a, b, c, d, e in got
    ]


def _nearest_by_aggregate(events: Any, cfg: LocationConfig) -> Any:
    """The pairing as a join of every candidate within the gap and a min per scan."""
    from pyspark.sql import functions as F

    from aa.tools.mining.location import scans

    gap = cfg.max_gap_seconds
    v = F.col("values")
    pos = (
        events.where(F.col("type").isin(*cfg.position_types))
        .select(
            v["Node"].alias("node"),
            F.unix_micros("time").alias("tp"),
            v["Building"].alias("building"),
            v["Floor"].cast("long").alias("floor"),
            v["X"].cast("double").alias("x"),
            v["Y"].cast("double").alias("y"),
        )
        .where(
            F.col("node").isNotNull() & F.col("building").isNotNull() & F.col("floor").isNotNull()
        )
    )
    pos = pos.withColumn("d", F.explode(F.sequence(F.lit(-1), F.lit(1)))).withColumn(
        "bucket", F.floor(F.col("tp") / (gap * 1_000_000)) + F.col("d")
    )
    sc = (
        scans(events, cfg.scan_types, "Node", "Radios")
        .select("id", "type", "node", "radios", F.unix_micros("time").alias("ts"))
        .withColumn("bucket", F.floor(F.col("ts") / (gap * 1_000_000)))
    )
    paired = (
        sc.join(pos, ["node", "bucket"])
        .withColumn("dt", F.abs(F.col("ts") - F.col("tp")))
        .where(F.col("dt") <= gap * 1_000_000)
        .groupBy("id")
        .agg(
            F.first("type").alias("kind"),
            F.first("radios").alias("radios"),
            F.min(F.struct("dt", "tp", "building", "floor", "x", "y")).alias("at"),
        )
    )
    return _radio_rows(paired)  # the same rows out of the pairs, as the job makes them


def test_each_scan_meets_its_nearest_position_as_a_min_over_candidates_gives(spark: Any) -> None:
    t0 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
    rows: list[tuple[Any, ...]] = []

    def at(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    def position(n: int, node: str, s: float, b: str, floor: str, x: str | None) -> None:
        vals = {"Node": node, "Building": b, "Floor": floor, "X": x, "Y": "1.0"}
        rows.append((f"p{n}", "position", at(s), vals))

    def scan(n: int, node: str, s: float) -> None:
        radios = f'[{{"Id":"r{n % 3}","Name":"office","Rssi":-{50 + n}}}]'
        rows.append((f"s{n}", "wifi-scan", at(s), {"Node": node, "Radios": radios}))

    # Node a: positions at 0, 10 (twice: the least wins), 30, 200; b: one at 59.5.
    position(1, "a", 0, "B1", "1", "1.0")
    position(2, "a", 10, "B1", "2", "5.0")
    position(3, "a", 10, "B1", "2", "4.0")
    position(4, "a", 30, "B2", "0", None)
    position(5, "a", 200, "B1", "1", "9.0")
    position(6, "b", 59.5, "B1", "3", "2.0")
    for n, s in enumerate([-61, -60, 0, 5, 5.000001, 20, 20.5, 25, 90, 91, 115, 140, 141, 260]):
        scan(n, "a", s)
    for n, s in enumerate([0, 0.5, 119.5, 119.6, 59.5], start=20):
        scan(n, "b", s)
    scan(30, "c", 0)  # no positions
    events = spark.createDataFrame(
        rows, "id string, type string, time timestamp, values map<string,string>"
    )
    cfg = LocationConfig()
    for parts in (1, 3):
        spark.conf.set("spark.sql.shuffle.partitions", str(parts))
        got = sorted((tuple(r) for r in _observations(events, cfg).collect()), key=repr)
        want = sorted((tuple(r) for r in _nearest_by_aggregate(events, cfg).collect()), key=repr)
        assert got == want
        assert len(got) == 15


def test_fingerprint_distance_is_the_lambdas_double_to_the_last_bit(spark: Any) -> None:
    from pyspark.sql import functions as F

    rnd = random.Random(7)
    radios = [f"02:a0:00:{i:02x}" for i in range(2 * UNROLLED_RADIOS + 4)]

    def fingerprint(n: int) -> dict[str, float]:
        # Means of whole 10⁻⁴ dB units, as presence makes them: most are not exact in binary,
        # so a sum in another order would differ in its last bits.
        return {
            r: rnd.randint(-950_000, -300_000) / rnd.choice([1, 3, 7]) * 1e-4
            for r in rnd.sample(radios, n)
        }

    sizes = [0, 1, 2, UNROLLED_RADIOS - 1, UNROLLED_RADIOS, UNROLLED_RADIOS + 1, len(radios)]
    rows = [
        (fingerprint(i), fingerprint(j)) for i in sizes for j in sizes for _ in range(3) if i or j
    ]
    rows += [({"x": -60.5, "y": -70.25}, {"y": -70.25, "x": -60.5}), ({"x": 1.0}, {"x": 1.0})]
    pairs = spark.createDataFrame(rows, "a map<string,double>, b map<string,double>")
    floor = F.lit(-95.0)
    got = pairs.select(
        _rms("a", "b", floor).alias("native"), _rms_zipped("a", "b", floor).alias("zipped")
    ).collect()
    assert len(got) == len(rows)
    assert [r["native"] for r in got] == [r["zipped"] for r in got]
    assert got[-2]["native"] == got[-1]["native"] == 0.0
