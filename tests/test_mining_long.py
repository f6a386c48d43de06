"""Schema mining's long form (one row per event and attribute) gives the rows that zipping
the event's two maps gives, also for an attribute that only one of the maps has: the
profile it feeds, and so the schema artefact, are unchanged."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from aa.tools.mining.schema import _long
from aa.tools.mining.session import SparkConfig, open_session


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
