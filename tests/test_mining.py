"""The mining job's parts that need no Spark: artefact files, progress lines, Otsu's
threshold, type mappings, scoring, the simulated logs, the command line."""

from __future__ import annotations

import io
import json
import os
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from aa.mesh import UsageError
from aa.tools.cli import build_parser, main
from aa.tools.mining import (
    ArtefactError,
    MineConfig,
    Progress,
    SimulateConfig,
    SparkConfig,
    check_master,
    list_versions,
    measure_inputs,
    plan,
    read_artefact,
    read_pointer,
    resolve_inputs,
    session_settings,
    simulate,
    write_artefact,
)
from aa.tools.mining.accuracy import format_report, score_location, score_presence, score_schema
from aa.tools.mining.artefacts import KEEP_VERSIONS
from aa.tools.mining.presence import group_rooms, otsu_threshold
from aa.tools.mining.schema import type_mappings

MONDAY = datetime(2030, 1, 7, tzinfo=UTC)


def test_artefacts_are_versioned_with_a_current_pointer(tmp_path: Path) -> None:
    a1 = write_artefact(
        tmp_path, "schema", {"x": 1}, inputs=["/in"], events={"unique": 3}, config={"k": 2}
    )
    a2 = write_artefact(tmp_path, "schema", {"x": 2}, inputs=["/in"], events={"unique": 4})
    assert (a1.version, a2.version) == (1, 2)
    assert read_pointer(tmp_path / "schema") == "v2.json"
    cur = read_artefact(tmp_path / "schema")
    assert cur.version == 2 and cur.data == {"x": 2}
    doc = cur.document
    assert (
        doc["format"] == 1
        and doc["task"] == "schema"
        and doc["inputs"] == ["/in"]
        and doc["events"] == {"unique": 4}
    )
    assert datetime.fromisoformat(doc["created"]).tzinfo is not None
    assert read_artefact(tmp_path / "schema", "v1.json").data == {
        "x": 1
    }  # kept: roll back by pointer
    assert not list((tmp_path / "schema").glob(".*"))  # no temporary files left


def test_old_versions_are_pruned(tmp_path: Path) -> None:
    for i in range(KEEP_VERSIONS + 3):
        write_artefact(tmp_path, "location", {"i": i}, inputs=[], events={})
    assert list_versions(tmp_path / "location") == list(range(4, KEEP_VERSIONS + 4))


def test_missing_or_foreign_artefacts_raise(tmp_path: Path) -> None:
    with pytest.raises(ArtefactError):
        read_artefact(tmp_path / "schema")
    (tmp_path / "schema").mkdir()
    (tmp_path / "schema" / "v1.json").write_text('{"format": 99}')
    (tmp_path / "schema" / "current").write_text("v1.json")
    with pytest.raises(ArtefactError):
        read_artefact(tmp_path / "schema")


class FakeTracker:
    def __init__(self) -> None:
        self.stages: dict[int, SimpleNamespace] = {}
        self.jobs: dict[int, SimpleNamespace] = {}

    def getActiveJobsIds(self) -> list[int]:
        return list(self.jobs)

    def getJobInfo(self, job: int) -> SimpleNamespace:
        return self.jobs[job]

    def getStageInfo(self, stage: int) -> SimpleNamespace | None:
        return self.stages.get(stage)


def _stage(sid: int, tasks: int, done: int = 0, active: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        stageId=sid, numTasks=tasks, numCompletedTasks=done, numActiveTasks=active
    )


def test_progress_is_one_line_with_an_overall_percentage() -> None:
    now = [0.0]
    tracker, out = FakeTracker(), io.StringIO()
    progress = Progress(
        plan(["schema", "presence"]), out=out, tty=False, every=10.0, clock=lambda: now[0]
    )
    assert progress.poll(0.0) == "aa mine   0% starting Spark (0 s)"
    assert progress.poll(5.0) is None  # not a terminal: a line per step, or every 10 s
    now[0] = 8.0
    progress.tracker = tracker
    progress.begin("read", 1)
    assert progress.poll(8.0) == "aa mine  24% read (8 s)"  # start (20 of 85) done
    tracker.jobs[3] = SimpleNamespace(jobId=3, stageIds=[7, 8])
    tracker.stages[7] = _stage(7, 2, done=2)
    tracker.stages[8] = _stage(8, 2, active=2)
    assert progress.poll(20.0) == "aa mine  32% read: stage 2/2, tasks 0/2 (20 s)"  # half its tasks
    progress.part_done()
    del tracker.jobs[3]
    progress.begin("schema", 4)
    progress.part_done()
    progress.part_done()
    assert progress.poll(21.0) == "aa mine  56% schema (21 s)"  # read done, half of schema
    progress.begin("presence", 3)
    tracker.jobs[9] = SimpleNamespace(jobId=9, stageIds=[20])
    tracker.stages[20] = _stage(20, 4, done=1, active=1)
    assert progress.poll(22.0) == "aa mine  73% presence: stage 1/1, tasks 1/4 (22 s)"
    tracker.stages[20] = _stage(20, 0)  # a tracker that lost count: the line never goes back
    assert progress.poll(40.0) == "aa mine  73% presence (40 s)"
    assert out.getvalue().count("\n") == 6


def test_progress_of_tasks_side_by_side() -> None:
    progress = Progress(
        plan(["schema", "location"]), out=io.StringIO(), tty=False, clock=lambda: 0.0
    )
    progress.begin("read")
    progress.finish("read")
    progress.begin("schema", 4, alongside=True)
    progress.begin("location", 2, alongside=True)
    progress.part_done("location")
    assert progress.poll(1.0) == "aa mine  57% schema+location (1 s)"  # (20 + 15 + 15 / 2) of 75
    # Spark's stages of both: no one stage's task count on the line, which would jump.
    tracker = FakeTracker()
    tracker.jobs[1] = SimpleNamespace(jobId=1, stageIds=[1])
    tracker.stages[1] = _stage(1, 10, done=9, active=1)
    tracker.jobs[2] = SimpleNamespace(jobId=2, stageIds=[2])
    tracker.stages[2] = _stage(2, 200, active=2)
    progress.tracker = tracker
    line = progress.render(1.5)
    assert line.startswith("aa mine  5") and line.endswith("% schema+location (2 s)"), line
    progress.tracker = None
    progress.finish("location")
    progress.part_done("schema")
    assert progress.poll(2.0) == "aa mine  75% schema (2 s)"  # (50 + 25 / 4) of 75


def test_progress_rewrites_its_line_on_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(plan(["location"]), out=out, tty=True, clock=lambda: 0.0)
    progress.poll(1.0)
    progress.poll(2.0)
    progress.message("26/11/23 19:00:00 ERROR Executor: gone")  # cleared, then written
    progress.poll(3.0)
    progress.close()  # the status line is cleared: the command's results follow
    text = out.getvalue()
    assert "\n" not in text.split("ERROR")[0]  # status lines only rewritten in place
    assert (
        text.count("\r") == 5
        and "\r\x1b[K26/11/23 19:00:00 ERROR Executor: gone\n\raa mine" in text
    )
    assert text.endswith("(3 s)\x1b[K\r\x1b[K")


def test_session_is_sized_from_the_input() -> None:
    mib = 2**20
    small = session_settings(SparkConfig(master="local[2]"), 2 * mib)
    assert (
        small["spark.sql.shuffle.partitions"] == "2"
        and small["spark.sql.codegen.wholeStage"] == "false"
    )
    assert "TieredStopAtLevel=1" in small["spark.driver.defaultJavaOptions"]
    assert small["spark.ui.enabled"] == "false" and small["spark.driver.bindAddress"] == "127.0.0.1"
    big = session_settings(SparkConfig(master="local[2]"), 350 * mib)  # ~10 M logged events
    assert big["spark.sql.shuffle.partitions"] == "44" and "spark.sql.codegen.wholeStage" not in big
    assert "spark.driver.defaultJavaOptions" not in big
    assert (
        session_settings(SparkConfig(master="local[2]"), 10**12)["spark.sql.shuffle.partitions"]
        == "64"
    )
    assert (
        session_settings(SparkConfig(master="local[2]"), None)["spark.sql.shuffle.partitions"]
        == "64"
    )
    cluster = session_settings(SparkConfig(master="spark://127.0.0.1:7077"), 2 * mib)
    assert "spark.sql.shuffle.partitions" not in cluster and "spark.ui.enabled" not in cluster
    mine = session_settings(
        SparkConfig(
            master="local[2]",
            shuffle_partitions=5,
            extra=(("spark.sql.codegen.wholeStage", "true"),),
        ),
        2 * mib,
    )
    assert (mine["spark.sql.shuffle.partitions"], mine["spark.sql.codegen.wholeStage"]) == (
        "5",
        "true",
    )
    for bad in ("lokal[2]", "local[x]", "local[0]", "", "spark:/host"):
        with pytest.raises(UsageError, match="master"):
            SparkConfig(master=bad)
    with pytest.raises(UsageError, match="driver-memory"):
        SparkConfig(driver_memory="lots")


def test_class_archive_is_written_once_then_used(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    from aa.tools.mining import class_archive_options

    first = class_archive_options(tmp_path, "/usr/bin/java", now=1000.0)
    part = Path(first.split("-XX:ArchiveClassesAtExit=")[1].split()[0])
    assert part.parent == tmp_path and part.name.endswith(".part") and "-Xlog:disable" in first
    part.write_bytes(b"being written by a JVM at its exit")
    os.utime(part, (1000.0, 1000.0))
    assert (
        class_archive_options(tmp_path, "/usr/bin/java", now=1010.0) == ""
    )  # not settled: neither use nor write
    used = class_archive_options(tmp_path, "/usr/bin/java", now=1100.0)
    final = Path(used.split("-XX:SharedArchiveFile=")[1].split()[0])
    assert final.is_file() and not part.exists() and final.suffix == ".jsa"
    assert class_archive_options(tmp_path, "/usr/bin/java", now=2000.0) == used
    other = class_archive_options(
        tmp_path, "/opt/other-java/bin/java", now=2000.0
    )  # another Java: its own
    assert "ArchiveClassesAtExit" in other
    from aa.tools.mining.session import class_archive_file

    assert (
        class_archive_file(tmp_path, "/usr/bin/java") == final
    )  # what `aa mine prepare` looks for


def test_inputs_are_measured_and_checked_before_spark(tmp_path: Path) -> None:
    simulate(SimulateConfig(out=str(tmp_path / "w"), start=MONDAY, days=0.01, routers=("a",)))
    roots = resolve_inputs([str(tmp_path / "w")])
    size = measure_inputs(roots)
    assert size == sum(f.stat().st_size for f in (tmp_path / "w").rglob("*.parquet")) > 0
    assert measure_inputs(["hdfs://nn/aa/eventlog"]) is None  # remote: Spark alone knows
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no event log in"):
        measure_inputs([str(tmp_path / "empty")])
    live = tmp_path / "live" / "eventlog" / "date=2030-01-07" / "hour=10"  # a running router's
    live.mkdir(parents=True)
    (live / ".part-r1-000001.parquet.inprogress").write_bytes(b"PAR1")
    with pytest.raises(
        UsageError, match="1 still being written by a running router; a file becomes readable"
    ):
        measure_inputs([str(tmp_path / "live")])
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"x": [1]}), other / "part-0.parquet")
    with pytest.raises(UsageError, match="not an event log: no column id"):
        measure_inputs([str(other)])
    (other / "part-0.parquet").unlink()
    row = {
        "id": ["a"],
        "type": ["x"],
        "time": pa.array([MONDAY], pa.timestamp("us", tz="UTC")),
        "values_types": ["s"],
    }
    pq.write_table(pa.table({**row, "values": ["not a map"]}), other / "part-0.parquet")
    with pytest.raises(UsageError, match="column values, values_types of another type"):
        measure_inputs([str(other)])


@pytest.mark.parametrize(
    "argv, says",
    [
        (["mine", "/nonexistent/aa-logs"], "no such event log folder: /nonexistent/aa-logs"),
        (["mine", "EMPTY"], "no event log in"),
        (["mine", "--master", "lokal[2]", "LOGS"], "is not a Spark master URL"),
        (["mine", "--master", "spark://127.0.0.1:CLOSED", "LOGS"], "not a Spark master"),
        (["mine", "--conf", "spark.x", "LOGS"], "is not KEY=VALUE"),
    ],
)
def test_cli_bad_input_is_one_line(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    simulate(SimulateConfig(out=str(tmp_path / "logs"), start=MONDAY, days=0.005, routers=("a",)))
    with socket.socket() as s:  # a port nothing listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        closed = str(s.getsockname()[1])
        argv = [
            {"EMPTY": str(tmp_path / "empty"), "LOGS": str(tmp_path / "logs")}.get(a, a).replace(
                "CLOSED", closed
            )
            for a in argv
        ]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("aa mine: ") and says in err, err


def test_cli_without_java_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    simulate(SimulateConfig(out=str(tmp_path / "logs"), start=MONDAY, days=0.005, routers=("a",)))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-java-here"))
    assert main(["mine", "--adapters", str(tmp_path / "ad"), str(tmp_path / "logs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Spark needs Java" in err and "JAVA_HOME" in err
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert main(["mine", "-q", str(tmp_path / "logs")]) == 2
    assert "has no bin/java" in capsys.readouterr().err
    assert not (tmp_path / "ad").exists()


def test_otsu_finds_the_valley() -> None:
    hist = (
        [(float(v), 100) for v in range(2, 6)]
        + [(float(v), 1) for v in range(6, 14)]
        + [(float(v), 80) for v in range(14, 20)]
    )
    cut = otsu_threshold(hist)
    assert cut is not None and 5 < cut < 14
    assert otsu_threshold([(1.0, 3)]) is None


def test_desks_are_grouped_into_rooms_no_wider_than_the_span() -> None:
    # One floor as the simulated office has it: desks at x 5.5 and 14.5 in one office,
    # 25.5 and 34.5 in the next (the wall at 20 m), a third desk squeezed in at 16. The
    # nearest pair across the wall (16 and 25.5, 9.5 m) is nearer than desk-mates (9 m
    # and 10.5 m): the grouping goes by the widest spread of a room, not the nearest pair.
    desks = {
        "a": ("B1", 0, 5.5, 5.0),
        "b": ("B1", 0, 14.5, 4.0),
        "c": ("B1", 0, 16.0, 6.0),
        "d": ("B1", 0, 25.5, 5.0),
        "e": ("B1", 0, 34.5, 6.0),
        "f": ("B1", 1, 5.5, 5.0),  # another floor, right above a
        "g": ("B2", 0, 5.6, 5.0),  # another building
    }
    rooms = group_rooms(desks, 15.0)
    assert rooms["a"] == rooms["b"] == rooms["c"] and rooms["d"] == rooms["e"]
    assert len({rooms["a"], rooms["d"], rooms["f"], rooms["g"]}) == 4
    # The same answer whatever order the desks come in, and numbered by name.
    assert group_rooms(dict(reversed(list(desks.items()))), 15.0) == rooms
    assert rooms["a"] == "B1/0/0" and rooms["d"] == "B1/0/1"
    # A span under the nearest two desks leaves each desk in a room of its own.
    assert len(set(group_rooms(desks, 1.0).values())) == 7


def _prof(freq: float = 1.0) -> dict[str, object]:
    return {"frequency": freq, "types": {"str": 1}}


def test_type_mappings_need_every_frequent_target_attribute() -> None:
    types = {
        "quote": {"attributes": {"StockSymbol": _prof(), "Price": _prof(), "Note": _prof(0.1)}},
        "ticker": {"attributes": {"Symbol": _prof(), "Last": _prof()}},
        "weather": {"attributes": {"City": _prof()}},
    }
    corr = [
        {"a": ["quote", "StockSymbol"], "b": ["ticker", "Symbol"], "confidence": 1.0},
        {"a": ["quote", "Price"], "b": ["ticker", "Last"], "confidence": 0.9},
    ]
    maps = type_mappings(types, corr)
    assert {(m["from"], m["to"]) for m in maps} == {("quote", "ticker"), ("ticker", "quote")}
    q2t = next(m for m in maps if m["from"] == "quote")
    assert (
        q2t["attributes"] == {"Price": "Last", "StockSymbol": "Symbol"} and q2t["confidence"] == 0.9
    )
    assert type_mappings(types, corr[:1]) == []  # Price ↔ Last missing: no mapping either way


def test_scores() -> None:
    truth = [("quote", "StockSymbol", "ticker", "Symbol"), ("quote", "Price", "ticker", "Last")]
    data = {
        "correspondences": [
            {"a": ["quote", "StockSymbol"], "b": ["ticker", "Symbol"]},
            {"a": ["bt-scan", "Node"], "b": ["wifi-scan", "Node"]},  # same name: counted apart
            {"a": ["quote", "Price"], "b": ["weather", "Humidity"]},
        ],
        "mappings": [],
    }
    s = score_schema(data, truth)
    assert (s["precision"], s["recall"], s["same_name_found"]) == (0.5, 0.5, 1)
    place = SimpleNamespace(building="B1", floor=2, x=10.0, y=5.0, room="B1/2/office-1")
    loc = score_location(
        {
            "radios": {
                "r1": {"building": "B1", "floor": 2, "x": 13.0, "y": 9.0},
                "r2": {"building": "B1", "floor": 1, "x": 0.0, "y": 0.0},
            }
        },
        {"r1": place, "r2": place, "r3": place},
    )
    assert (loc["precision"], loc["recall"], loc["error_m"]["mean"]) == (0.5, round(1 / 3, 4), 5.0)
    people = [
        SimpleNamespace(name="alice", phone="phone-alice"),
        SimpleNamespace(name="bob", phone="phone-bob"),
    ]
    t0 = MONDAY + timedelta(hours=9)
    truth_p = frozenset({("alice", "bob", t0 + timedelta(minutes=m)) for m in range(4)})
    episodes = [
        [
            "phone-bob",
            "phone-alice",
            (t0 + timedelta(minutes=2)).isoformat(),
            (t0 + timedelta(minutes=6)).isoformat(),
        ],
        ["laptop-bob", "phone-alice", t0.isoformat(), (t0 + timedelta(hours=1)).isoformat()],
    ]
    pr = score_presence(
        {"episodes": episodes},
        truth_p,
        people,
        MONDAY,
        MONDAY + timedelta(days=1),
        timedelta(minutes=1),
    )
    assert (pr["precision"], pr["recall"]) == (0.5, 0.5)
    text = format_report(
        {
            "world": "w",
            "span": ["a", "b"],
            "schema": {"version": 1, **s},
            "location": {"missing": "none"},
        }
    )
    assert "precision 0.500" in text and "no artefact" in text


def test_simulate_writes_routers_logs_with_duplicates(tmp_path: Path) -> None:
    cfg = SimulateConfig(
        out=str(tmp_path),
        start=MONDAY + timedelta(hours=9),
        days=1 / 24,
        routers=("r1", "r2", "r3"),
        overlap=0.5,
        seed=3,
    )
    result = simulate(cfg)
    tables = [
        ds.dataset(Path(f) / "eventlog", format="parquet", partitioning="hive").to_table()
        for f in result.folders
    ]
    assert [t.num_rows for t in tables] == [result.rows[r] for r in ("r1", "r2", "r3")]
    ids = [i for t in tables for i in t.column("id").to_pylist()]
    assert len(set(ids)) == result.events < len(ids)  # every event logged, some by several routers
    types = set(tables[0].column("type").to_pylist())
    assert {"wifi-scan", "bt-scan", "position", "quote", "ticker"} <= types
    world = json.loads((tmp_path / "world.json").read_text())
    assert world["world"]["seed"] == 3 and world["events"] == result.events
    assert sorted(resolve_inputs([str(tmp_path)])) == sorted(
        str(Path(f, "eventlog").resolve()) for f in result.folders
    )


def test_inputs_and_config_are_checked(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        resolve_inputs([str(tmp_path / "nope")])
    assert resolve_inputs(["hdfs://nn/aa/eventlog"]) == ["hdfs://nn/aa/eventlog"]
    with pytest.raises(UsageError):
        MineConfig(inputs=("x",), adapters="a", tasks=("schema", "weather"))


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["mine", "--help"], ["mine", "simulate", "--help"], ["mine", "report", "--help"]):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(argv)
        assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--master URL" in out and "aa mine simulate" in out and "aa mine report" in out
    args = build_parser().parse_args(
        ["mine", "--master", "local[2]", "--tasks", "schema", "/a", "/b"]
    )
    assert args.logdirs == ["/a", "/b"] and args.master == "local[2]"


def test_cli_simulate_and_report_without_artefacts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["mine", "simulate", "--out", str(tmp_path / "w"), "--days", "0.01", "--routers", "a"])
        == 0
    )
    assert "events written" in capsys.readouterr().out
    assert (
        main(
            ["mine", "report", "--adapters", str(tmp_path / "none"), "--world", str(tmp_path / "w")]
        )
        == 0
    )
    assert capsys.readouterr().out.count("no artefact") == 3
    assert main(["mine", "report", "--world", str(tmp_path / "nothing")]) == 2


def test_pathloss_fit_and_place_a_radio_nobody_stands_near() -> None:
    from aa.tools.mining.pathloss import Cell, PathLoss, fit, place

    true = PathLoss(at_1m=-40.0, exponent=3.0, floor_loss=15.0)
    radio = (1, 33.0, 5.0)  # floor 1, in a corner nobody on floor 1 visits
    spots = [(1, x, 15.0) for x in range(2, 20, 3)] + [
        (2, x, y) for x in range(24, 40, 3) for y in (3.0, 7.0)
    ]
    cells = [
        Cell(
            f,
            float(x),
            y,
            true.predict((x - radio[1]) ** 2 + (y - radio[2]) ** 2, abs(f - radio[0])),
            5,
        )
        for f, x, y in spots
    ]
    # Loudest on floor 2 (right above it), yet the model puts it on floor 1.
    assert max(cells, key=lambda c: c.rssi).floor == 2
    best, second = place(cells, true, [0, 1, 2], (0.0, 0.0, 40.0, 20.0))[:2]
    assert (best.floor, round(best.x), round(best.y)) == (
        1,
        33,
        5,
    ) and best.rmse < 0.1 < second.rmse
    samples = [
        (
            ((c.x - radio[1]) ** 2 + (c.y - radio[2]) ** 2) ** 0.5,
            abs(c.floor - radio[0]),
            c.rssi,
            c.n,
        )
        for c in cells
    ]
    got = fit(samples)
    assert (
        abs(got.at_1m + 40) < 0.01
        and abs(got.exponent - 3) < 0.01
        and abs(got.floor_loss - 15) < 0.01
    )


def test_public_names_exist() -> None:
    import importlib

    for name in ("aa.tools.mining", "aa.addins.adapters"):
        module = importlib.import_module(name)
        assert module.__all__ and all(hasattr(module, attr) for attr in module.__all__), name
        assert (Path(module.__file__).parent / "py.typed").exists()  # type: ignore[arg-type]


def test_numbers_key_does_not_depend_on_the_order_of_the_candidates() -> None:
    """Two string links between quote and ticker, both at confidence 1.0 (as on a small
    office): the numbers are split by the one sharing more values, whichever comes first."""
    from aa.tools.mining.schema import _key

    def link(a: str, b: str, shared: int) -> dict[str, object]:
        return {
            "a": ["quote", a],
            "b": ["ticker", b],
            "kind": "strings",
            "confidence": 1.0,
            "evidence": {"shared": shared},
        }

    links = [link("Currency", "Ccy", 3), link("StockSymbol", "Symbol", 4)]
    picks = {_key(order, "quote", "ticker")["a"][1] for order in (links, links[::-1])}  # type: ignore[index]
    assert picks == {"StockSymbol"}
    same = [link("A", "X", 2), link("B", "Y", 2)]
    assert _key(same, "quote", "ticker") == _key(same[::-1], "quote", "ticker") == same[0]
    assert _key(same, "ticker", "quote") is None


def test_cluster_options_become_spark_settings() -> None:
    from aa.tools.mining.session import shuffle_partitions_for

    s = session_settings(
        SparkConfig(
            master="spark://10.0.0.5:7077",
            executor_memory="2g",
            total_cores=4,
            driver_host="10.0.0.9",
        ),
        2 * 2**20,
    )
    assert (s["spark.executor.memory"], s["spark.cores.max"], s["spark.driver.host"]) == (
        "2g",
        "4",
        "10.0.0.9",
    )
    # A cluster's partitions come from its executors' cores, known once they are there.
    assert "spark.sql.shuffle.partitions" not in s
    assert shuffle_partitions_for(4, 2 * 2**20) == 4 and shuffle_partitions_for(2, None) == 64
    assert shuffle_partitions_for(2, 350 * 2**20) == 44
    for bad in (
        {"executor_memory": "lots"},
        {"total_cores": 0},
        {"driver_host": "a b"},
        {"executor_wait": 0},
    ):
        with pytest.raises(UsageError):
            SparkConfig(**bad)  # type: ignore[arg-type]


def test_a_master_url_that_is_not_a_master_is_one_line_in_seconds() -> None:
    """A closed port, and a web server (the master's web UI), each a clear error before any
    JVM starts."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
        t = time.monotonic()
        with pytest.raises(UsageError, match=r"refused.*not a Spark master"):
            check_master(f"spark://127.0.0.1:{closed}")
        assert time.monotonic() - t < 5

    class Quiet(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Quiet) as web:
        threading.Thread(target=web.serve_forever, daemon=True).start()
        try:
            t = time.monotonic()
            with pytest.raises(UsageError, match="not a Spark master"):
                check_master(f"spark://127.0.0.1:{web.server_address[1]}", timeout=2)
            assert time.monotonic() - t < 5
        finally:
            web.shutdown()
    for bad in ("spark://host", "spark://host:99999"):
        with pytest.raises(UsageError, match="HOST:PORT"):
            check_master(bad)


def test_bad_files_are_skipped_with_their_reason_and_the_rest_mined(tmp_path: Path) -> None:
    """A half-written Parquet file and a file of another schema beside a router's log: each
    named with its reason, the others still read; a folder with nothing sound is an error."""
    from aa.tools.mining import scan_inputs

    simulate(SimulateConfig(out=str(tmp_path / "w"), start=MONDAY, days=0.01, routers=("a",)))
    (root,) = resolve_inputs([str(tmp_path / "w")])
    good = sorted(Path(root).rglob("*.parquet"))
    size = sum(f.stat().st_size for f in good)
    hour = good[0].parent
    half = hour / "part-half.parquet"
    half.write_bytes(good[0].read_bytes()[: good[0].stat().st_size // 2])
    pq.write_table(pa.table({"x": [1]}), hour / "part-other.parquet")
    scanned = scan_inputs([root])
    assert scanned.bytes == size
    reasons = dict(scanned.skipped)
    assert reasons.keys() == {str(half), str(hour / "part-other.parquet")}
    assert reasons[str(half)].startswith("is not a readable Parquet file (")
    assert reasons[str(hour / "part-other.parquet")] == "is not an event log: no column id, " + (
        "type, time, values, values_types"
    )
    for f in good:
        f.unlink()
    with pytest.raises(UsageError, match=r"part-.*\.parquet is not .* \(and 1 more files\): no"):
        scan_inputs([root])


def test_artefacts_are_written_without_hard_links_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system without hard links (some network mounts): versions are still claimed
    once each and written whole."""

    def no_links(src: object, dst: object) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    a = write_artefact(tmp_path, "schema", {"types": {}}, inputs=["/d"], events={"unique": 0})
    b = write_artefact(tmp_path, "schema", {"types": {}}, inputs=["/d"], events={"unique": 0})
    assert (a.version, b.version) == (1, 2) and read_artefact(tmp_path / "schema").version == 2
    assert sorted(p.name for p in (tmp_path / "schema").iterdir()) == [
        "current",
        "v1.json",
        "v2.json",
    ]
