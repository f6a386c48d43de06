"""The same answers everywhere: the mining job's artefacts do not depend on how Spark
partitions the work (one core and one shuffle partition, or two cores and 16 partitions) nor
on where it runs (a real standalone cluster, a Master and a Worker on loopback), and files it
cannot read are named and left out."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import settle
from support.spark import (
    TASKS,
    StandaloneCluster,
    artefact_texts,
    first_difference,
    log_bytes,
    need_spark,
)

from aa.tools.mining import MineConfig, SimulateConfig, SparkConfig, open_session, run_mining
from aa.tools.mining import simulate as simulate_office

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

START = datetime(2030, 1, 7, 7, 0, tzinfo=UTC)
#: Shuffle partitions of the two-core run below: eight a core.
PARTITIONS = 16


@pytest.fixture(scope="module")
def office(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short working morning logged by two routers with overlap (duplicates to drop)."""
    out = tmp_path_factory.mktemp("office")
    simulate_office(
        SimulateConfig(
            out=str(out), start=START, days=6 / 24, step_seconds=120, seed=3, overlap=0.5
        )
    )
    return out


def _mine_locally(
    office: Path, adapters: Path, master: str, partitions: int, input_bytes: int | None
) -> dict[str, bytes]:
    """The artefacts of *office* mined in this process; *input_bytes* as `open_session`
    takes it (None: unknown, so the settings of a big log)."""
    spark = open_session(
        SparkConfig(
            master=master, shuffle_partitions=partitions, driver_memory="1g", class_archive_dir=""
        ),
        input_bytes=input_bytes,
    )
    try:
        run_mining(spark, MineConfig(inputs=(str(office),), adapters=str(adapters)))
    finally:
        spark.stop()
    return artefact_texts(adapters)


@pytest.fixture(scope="module")
def one_core(office: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """As `aa mine` runs on this small log (the first session of the process: the JVM keeps
    its options)."""
    need_spark()
    return _mine_locally(office, tmp_path_factory.mktemp("one"), "local[1]", 1, log_bytes(office))


def _same(a: dict[str, bytes], b: dict[str, bytes]) -> None:
    assert a.keys() == b.keys() == {"schema", "location", "presence"}
    for task in a:
        assert a[task] == b[task], f"{task} differs {first_difference(a[task], b[task])}"


def test_partitioning_does_not_change_the_artefacts_one_core_one_partition_vs_two_cores_16(
    office: Path, one_core: dict[str, bytes], tmp_path: Path
) -> None:
    """Two cores and 16 shuffle partitions, their tasks finishing in any order, most of them
    holding few keys of this small log and some none. Not the most `aa mine` sizes a two-core
    session to (`MAX_PARTITIONS_PER_CORE` each, 64), nor Spark's default of 200: each
    partition is a task in every stage of every query, so the count sets the run's time (64
    took 2.3 times as long as 16 here), while the artefacts' independence of it shows from
    two partitions on. This run plans as for a big log (whole-stage code generation), the
    one-core run as for a small one: the artefacts do not depend on that either."""
    _same(one_core, _mine_locally(office, tmp_path, "local[2]", PARTITIONS, None))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    need_spark()
    with StandaloneCluster(tmp_path_factory.mktemp("spark"), cores=1, memory="1g") as c:
        yield c


def _aa(*args: str, cache: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`aa mine` with *args*, its class archive in *cache* (`mining_cache`)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run(
        [str(Path(sys.executable).with_name("aa")), "mine", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.fixture(scope="module")
def logs(office: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The office's logs with a half-written Parquet file and one of another schema beside
    them (``part-half.parquet``, ``part-other.parquet``)."""
    logs = tmp_path_factory.mktemp("logs") / "logs"
    shutil.copytree(office, logs)
    first = sorted((logs / "r1").rglob("*.parquet"))[0]
    half, other = first.with_name("part-half.parquet"), first.with_name("part-other.parquet")
    half.write_bytes(first.read_bytes()[: first.stat().st_size // 2])
    pq.write_table(pa.table({"id": [1]}), other)
    return logs


@pytest.fixture(scope="module")
def cluster_run(
    cluster: StandaloneCluster,
    logs: Path,
    tmp_path_factory: pytest.TempPathFactory,
    mining_cache: Path,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One `aa mine` on the real cluster over `logs`, bad files and all, and its adapters
    folder: the two tests below check what it did, each its own claim (one JVM start and one
    job fewer than a run each)."""
    adapters = tmp_path_factory.mktemp("cluster-run") / "ad"
    out = _aa(
        "-q",
        "--master",
        cluster.url,
        "--driver-host",
        "127.0.0.1",
        "--driver-memory",
        "1g",
        "--executor-memory",
        "512m",
        "--total-cores",
        "1",
        "--adapters",
        str(adapters),
        str(logs),
        cache=mining_cache,
    )
    return out, adapters


def _content(text: bytes) -> dict[str, object]:
    """An artefact's document less ``inputs`` (the folders it was mined from)."""
    doc = json.loads(text)
    doc.pop("inputs")
    return doc  # type: ignore[no-any-return]


def test_a_real_cluster_runs_the_job_with_the_same_artefacts(
    cluster: StandaloneCluster,
    cluster_run: tuple[subprocess.CompletedProcess[str], Path],
    one_core: dict[str, bytes],
) -> None:
    """The artefacts of the cluster's run are the one-core run's, apart from the folders
    named as inputs (the run reads a copy of the logs, with two bad files beside them)."""
    out, adapters = cluster_run
    assert out.returncode == 0, out.stderr
    state = cluster.wait(
        lambda s: any(a["name"] == "aa-mine" for a in s.get("completedapps", [])),
        60,
        "no completed application",
    )
    (app,) = [a for a in state["completedapps"] if a["name"] == "aa-mine"]
    assert app["state"] == "FINISHED", app
    mined = artefact_texts(adapters)
    assert mined.keys() == one_core.keys() == {"schema", "location", "presence"}
    for task in mined:
        assert _content(mined[task]) == _content(one_core[task]), task


def test_a_cluster_without_room_stops_with_sparks_reason(
    cluster: StandaloneCluster, office: Path, tmp_path: Path, mining_cache: Path
) -> None:
    """The worker has 1g: an executor of 4g never starts, and the job says so in one line
    instead of waiting for ever (after a wait of a second: no wait makes the master give such
    an executor, so a longer one would only idle)."""
    out = _aa(
        "-q",
        "--master",
        cluster.url,
        "--driver-host",
        "127.0.0.1",
        "--driver-memory",
        "1g",
        "--executor-memory",
        "4g",
        "--executor-wait",
        "1",
        "--adapters",
        str(tmp_path / "ad"),
        str(office),
        cache=mining_cache,
    )
    said = _said(out.stderr)
    assert out.returncode == 1 and len(said) == 1, out.stderr
    assert "Initial job has not accepted any resources" in out.stderr, out.stderr
    assert "no executor in 1 s" in out.stderr and not (tmp_path / "ad").exists()


def test_the_web_ui_port_is_not_a_master(
    cluster: StandaloneCluster, office: Path, mining_cache: Path
) -> None:
    t = time.monotonic()
    out = _aa(
        "--master",
        f"spark://127.0.0.1:{cluster.ui_port}",
        str(office),
        cache=mining_cache,
        timeout=60,
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "a web server answers" in out.stderr and time.monotonic() - t < 30


def test_ctrl_c_stops_the_job_at_once_and_quietly(
    office: Path, tmp_path: Path, mining_cache: Path
) -> None:
    """A real `aa mine` interrupted while Spark runs its jobs: it ends in seconds, with
    one line, no py4j traceback, and its JVM gone."""
    need_spark()
    env = {**os.environ, "XDG_CACHE_HOME": str(mining_cache)}
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("aa")), "mine", "--master", "local[1]"]
        + ["--driver-memory", "1g", "--adapters", str(tmp_path / "ad"), str(office)],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True)  # type: ignore[union-attr]
    reader.start()
    seen = []
    deadline = time.monotonic() + 600
    try:
        while not any(" read" in x for x in seen):  # Spark runs the reading job
            seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        jvms = _children(proc.pid)
        assert jvms, "no JVM under aa mine"
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        took = time.monotonic() - t
    finally:
        proc.kill()
    reader.join(timeout=30)  # stderr's end
    rest = [lines.get() for _ in range(lines.qsize())]
    assert code == 130 and took < 15, (code, took, rest)
    assert [x for x in rest if not x.startswith("aa mine ")] == ["aa mine: interrupted\n"], rest
    # Killed, so gone as soon as the kernel has torn it down (a gigabyte of heap and the mapped
    # class archive take a moment): `aa mine` does not wait for that before it exits.
    left = settle(lambda: [pid for pid in jvms if _alive(pid)], lambda pids: not pids, 15)
    assert not left, left


def _children(pid: int) -> list[int]:
    """The processes whose parent is *pid* (the JVM PySpark started)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_bad_files_are_named_and_the_rest_mined(
    logs: Path, cluster_run: tuple[subprocess.CompletedProcess[str], Path]
) -> None:
    """The cluster's run over the logs with a half-written Parquet file and one of another
    schema beside them: a line for each, and nothing else said (its artefacts, those of the
    sound files, are the clean run's: the test above)."""
    out, adapters = cluster_run
    assert out.returncode == 0, out.stderr
    (half,), (other,) = logs.rglob("part-half.parquet"), logs.rglob("part-other.parquet")
    assert sorted(_said(out.stderr)) == [
        f"aa mine: skipping {half}: it is not a readable Parquet file ({_footer_error(half)})",
        f"aa mine: skipping {other}: it is not an event log: no column type, time, values, "
        "values_types",
    ]
    assert all((adapters / task / "current").is_file() for task in TASKS)


def _footer_error(path: Path) -> str:
    try:
        pq.read_schema(path)
    except (OSError, ValueError) as exc:
        return str(exc).strip().splitlines()[0][:200]
    raise AssertionError(f"{path} reads")


def _said(stderr: str) -> list[str]:
    """What `aa mine` said, less a notice that it writes Spark's class archive (none when
    `mining_cache` holds the session's archive, as it should)."""
    return [line for line in stderr.splitlines() if "first run with this Spark here" not in line]
