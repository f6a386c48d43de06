"""Spark reads the event log as it is: Hive partitions, the map columns, typed values."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from aa.mesh import Event
from aa.router import EventLog

pytestmark = pytest.mark.spark

T0 = datetime(2030, 1, 1, 10, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    pyspark = pytest.importorskip(
        "pyspark", reason="pyspark is not installed: pip install 'aa-mesh[mining]'"
    )
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: apt-get install default-jre-headless")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        pyspark.sql.SparkSession.builder.master("local[1]")
        .appName("aa-eventlog-test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    yield session
    session.stop()


async def test_spark_reads_the_log(tmp_path: Path, spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    clock = [T0.timestamp()]
    async with EventLog(data_dir=tmp_path, router_id="r1", clock=lambda: clock[0]) as elog:
        for i in range(10):
            meta = {"time": T0 + timedelta(seconds=i), "client": "c1"}
            elog.append(
                Event(
                    values={"Temperature": 20 + i, "Where": "hall", "raw": b"\x01"},
                    type="t",
                    meta=meta,
                    id=f"e{i}",
                )
            )
        clock[0] += 3600
        elog.append(
            Event(values={"Temperature": 21.5}, meta={"time": T0 + timedelta(hours=1)}, id="late")
        )
        await elog.flush()

    df = spark.read.parquet(str(tmp_path / "eventlog"))
    assert {"date", "hour", "values", "values_types", "time"} <= set(df.columns)
    ints = (
        df.where(F.col("values_types")["Temperature"] == "int")
        .select("id", F.col("values")["Temperature"].cast("long").alias("t"), "hour", "time")
        .orderBy("time")
        .collect()
    )
    assert [r.t for r in ints] == list(range(20, 30))
    assert {r.hour for r in ints} == {10}
    assert ints[0].time.replace(tzinfo=UTC) == T0  # naive UTC from Spark
    late = (
        df.where(F.col("hour") == 11)
        .select(F.col("values")["Temperature"].cast("double").alias("t"))
        .collect()
    )
    assert [r.t for r in late] == [21.5]
    raw = (
        df.where(F.col("id") == "e0")
        .select(F.unbase64(F.col("values")["raw"]).alias("b"))
        .collect()
    )
    assert bytes(raw[0].b) == b"\x01"
