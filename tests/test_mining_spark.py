"""The mining job with real Spark (local mode) on a small simulated office: the artefacts
it writes, their accuracy against the world's ground truth, and the adapters fed with them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from support import free_tcp_port
from support.spark import Prepared, log_bytes

from aa.addins.adapters import LocationAdapter, SchemaAdapter
from aa.mesh import Event
from aa.tools.mining import (
    MineConfig,
    SimulateConfig,
    SparkConfig,
    UnreadableInput,
    load_world,
    open_session,
    read_events,
    run_mining,
    simulate,
)
from aa.tools.mining.accuracy import accuracy_report, format_report

#: Each test starts or drives a JVM, whose start and mining take minutes on a busy 2-core
#: machine (the suite's default timeout is for a test that hangs, not for a JVM's start).
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

#: A Monday, office hours: people arrive from 07:30, leave by 17:30.
START = datetime(2030, 1, 7, 7, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def spark(office: Path) -> Iterator[Any]:
    """A session as `aa mine` opens one for the office's log (the held-out offices below are
    as small)."""
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'aa-mesh[mining]'")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: apt-get install default-jre-headless")
    # No class archive: it would be ~180 MB written at exit (the CLI test below writes one).
    session = open_session(
        SparkConfig(
            master="local[2]", shuffle_partitions=2, driver_memory="1g", class_archive_dir=""
        ),
        input_bytes=log_bytes(office),
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def office(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One simulated working day (a scan round every 2 minutes), logged by two routers with
    overlap, so the job must de-duplicate."""
    out = tmp_path_factory.mktemp("office")
    simulate(
        SimulateConfig(
            out=str(out), start=START, days=11 / 24, step_seconds=120, seed=1, overlap=0.4
        )
    )
    return out


@pytest.fixture(scope="module")
def mined(spark: Any, office: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    adapters = tmp_path_factory.mktemp("adapters")
    result = run_mining(
        spark, MineConfig(inputs=(str(office / "r1"), str(office / "r2")), adapters=str(adapters))
    )
    return result, adapters


def test_events_are_counted_once(mined: tuple[Any, Path], office: Path) -> None:
    result, _ = mined
    ids = [
        ds.dataset(office / r / "eventlog", format="parquet", partitioning="hive")
        .to_table(columns=["id"])
        .column("id")
        .to_pylist()
        for r in ("r1", "r2")
    ]
    assert result.events["read"] == len(ids[0]) + len(ids[1])
    assert result.events["unique"] == len(set(ids[0]) | set(ids[1])) < result.events["read"]
    assert set(result.artefacts) == {"schema", "location", "presence"}
    art = result.artefacts["schema"]
    assert art.document["events"]["unique"] == result.events["unique"] and art.version == 1


def test_accuracy_against_ground_truth(mined: tuple[Any, Path], office: Path) -> None:
    _, adapters = mined
    report = accuracy_report(adapters, office)
    print(format_report(report))
    schema, location, presence = report["schema"], report["location"], report["presence"]
    # Clean data: exactly the renamed attributes, and the two type mappings.
    assert (schema["precision"], schema["recall"]) == (1.0, 1.0), schema
    assert (schema["mappings"]["precision"], schema["mappings"]["recall"]) == (1.0, 1.0)
    # Radios on the right floor of the right building.
    assert location["precision"] >= 0.95 and location["recall"] >= 0.95, location
    assert location["error_m"]["median"] < 4.0
    # Who was in one room (limited by the radio model: no walls, desk mates 9 m apart).
    assert presence["precision"] >= 0.8 and presence["recall"] >= 0.8, presence


def test_schema_profile(mined: tuple[Any, Path]) -> None:
    result, _ = mined
    types = result.artefacts["schema"].data["types"]
    quote = types["quote"]["attributes"]
    assert (
        quote["Price"]["types"] == {"float": types["quote"]["events"]}
        and quote["Price"]["frequency"] == 1.0
    )
    assert 40 < quote["Price"]["min"] < quote["Price"]["max"] < 300
    assert [v for v, _ in quote["StockSymbol"]["top"]] == ["ABB", "EQNR", "NHY", "TEL"]
    assert types["position"]["attributes"]["Floor"]["types"].keys() == {"int"}
    assert types["wifi-scan"]["attributes"]["Radios"]["types"].keys() == {"list"}


def test_adapters_use_the_mined_artefacts(mined: tuple[Any, Path], office: Path) -> None:
    _, adapters = mined
    schema = SchemaAdapter(adapters)
    assert schema.reload() and not schema.reload()
    quote = Event(
        values={"StockSymbol": "ABB", "Price": 45.5, "Currency": "CHF"}, type="quote", id="q1"
    )
    assert schema.handle(quote) == [("ticker", {"Ccy": "CHF", "Last": 45.5, "Symbol": "ABB"})]

    # The location adapter on the phones' own scans: the floor it says vs where they were.
    location = LocationAdapter(adapters)
    assert location.reload()
    world, *_ = load_world(office)
    phones = {p.phone: p for p in world.people}
    right = total = 0
    t0 = START + timedelta(hours=3)
    for t, kind, values in world.events(
        t0, t0 + timedelta(minutes=30), step=timedelta(seconds=120)
    ):
        if kind != "wifi-scan" or values["Node"] not in phones:
            continue
        ((out_type, loc),) = location.handle(Event(values=values, type=kind))
        here, _ = world.where(phones[values["Node"]], t)
        total += 1
        right += (loc["Building"], loc["Floor"]) == (here.building, here.floor)
    assert out_type == "location" and total > 20 and right / total >= 0.9


def _aa() -> str:
    return str(Path(sys.executable).with_name("aa"))


#: The time a small log's `aa mine` must take on an idle 2-core machine, class archive
#: written (the install does it), Spark's start included, seconds. Scaled by how busy the
#: machine is (the 1-minute load per core) for a shared test machine.
SMALL_LOG_SECONDS = 30.0


def test_cli_mines_with_one_progress_line_and_spark_quiet(
    office: Path, tmp_path: Path, prepared_cache: Prepared
) -> None:
    """The command as a user runs it after `aa mine prepare` (the session's one, whose
    archive the other `aa mine` runs of the session map too), not a terminal here: plain
    progress lines."""
    prep = prepared_cache.run
    assert prep.returncode == 0 and "class archive written" in prep.stdout, (
        prep.stdout,
        prep.stderr,
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(prepared_cache.cache)}
    pyspark = pytest.importorskip("pyspark")
    # One folder per PySpark version: the archive in place, nothing half written, beside the
    # shared Spark it was written from.
    kept = prepared_cache.cache / "aa" / pyspark.__version__
    assert sorted(p.suffix or p.name for p in kept.iterdir()) == [".jsa", "spark"]
    load = os.getloadavg()[0]
    t = time.perf_counter()
    out = subprocess.run(
        [_aa(), "mine", "--master", "local[2]", "--adapters", str(tmp_path / "ad"), str(office)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    seconds = time.perf_counter() - t
    assert out.returncode == 0, out.stderr
    busy = max(1.0, (load + os.getloadavg()[0]) / 2 / (os.cpu_count() or 1))
    assert seconds < SMALL_LOG_SECONDS * busy, f"{seconds:.1f} s at load {load:.1f}"
    again = subprocess.run(
        [_aa(), "mine", "prepare"], capture_output=True, text=True, timeout=60, env=env
    )
    assert again.returncode == 0 and "class archive already there" in again.stdout, again.stdout
    assert re.search(r"^events: \d+ read, \d+ unique, in [\d.]+ s", out.stdout, re.M), out.stdout
    assert all(
        (tmp_path / "ad" / task / "current").is_file()
        for task in ("schema", "location", "presence")
    )
    lines = out.stderr.splitlines()
    assert lines and all(
        re.match(r"aa mine +\d+% (starting Spark|read|schema|location|presence|done)", ln)
        for ln in lines
    ), lines
    percents = [int(re.match(r"aa mine +(\d+)%", ln)[1]) for ln in lines]  # type: ignore[index]
    assert percents == sorted(percents)


def test_cli_spark_that_cannot_start_is_one_line(office: Path, tmp_path: Path) -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java")
    # A heap no machine has: the JVM refuses to start.
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run(
        [
            _aa(),
            "mine",
            "-q",
            "--driver-memory",
            "1000000g",
            "--adapters",
            str(tmp_path / "ad"),
            str(office),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(
        "aa mine: Spark could not start: "
    ), out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "ad").exists()


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("hdfs://127.0.0.1:{port}/aa/eventlog", "connection refused"),
        ("nosuch://host/aa/eventlog", "no FileSystem for scheme nosuch: Spark reads file://"),
        ("file:///{tmp}/gone/eventlog", "no such file or folder"),
        (
            "s3a://bucket/aa/eventlog",
            "no FileSystem for scheme s3a (org.apache.hadoop.fs.s3a.S3AFileSystem not found): "
            "add the hadoop-aws jars (see docs/mining.md)",
        ),
    ],
    ids=["closed-port", "unknown-scheme", "missing-path", "s3a-without-jars"],
)
def test_a_uri_spark_cannot_read_is_one_line_naming_it(
    spark: Any, tmp_path: Path, uri: str, reason: str
) -> None:
    """Spark's own exception (a Java stack trace, the input named its own way) becomes one
    line: the URI as given and why."""
    uri = uri.format(port=free_tcp_port(), tmp=str(tmp_path).lstrip("/"))
    with pytest.raises(UnreadableInput) as caught:
        read_events(spark, [str(tmp_path), uri])
    assert str(caught.value).startswith(f"{uri}: {reason}"), caught.value
    assert "\n" not in str(caught.value) and " at " not in str(caught.value)


#: Offices no tuning looked at (the presence defaults were tuned on others; see
#: tests/bench/bench_presence.py, whose rule draws them from the seed).
HELD_OUT_OFFICES = (301, 302, 303)
#: The least presence F1 on an office of 2–4 buildings, 2–4 routers, overlap 0.3–0.6: the
#: benchmark's fourteen held-out offices range from 0.93 to 0.98 (median 0.96).
PRESENCE_F1 = 0.9


@pytest.mark.parametrize("seed", HELD_OUT_OFFICES)
def test_presence_holds_on_offices_it_has_not_seen(
    spark: Any, seed: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import random

    rng = random.Random(f"presence-office-{seed}")
    office = tmp_path_factory.mktemp(f"office-{seed}")
    simulate(
        SimulateConfig(
            out=str(office),
            start=START,
            days=11 / 24,
            step_seconds=120,
            seed=seed,
            people=30,
            buildings=rng.randint(2, 4),
            routers=tuple(f"r{i + 1}" for i in range(rng.randint(2, 4))),
            overlap=round(rng.uniform(0.3, 0.6), 2),
        )
    )
    adapters = tmp_path_factory.mktemp(f"adapters-{seed}")
    run_mining(
        spark, MineConfig(inputs=(str(office),), adapters=str(adapters), tasks=("presence",))
    )
    presence = accuracy_report(adapters, office)["presence"]
    assert presence["f1"] >= PRESENCE_F1, presence
