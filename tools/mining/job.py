"""The mining job: a Spark session for a small machine, the event logs read and
de-duplicated once, then each mining task, each writing its artefact.

Reading. The inputs are event log folders of one or more routers (`aa.router.eventlog`):
a router's data folder (its ``eventlog/`` is used), an ``eventlog/`` folder itself, or any
URI Spark reads (``hdfs://…/eventlog``, ``s3a://…``), each a root of Hive partitions.

De-duplication, where counts go wrong if done carelessly. Events flood the mesh and every
router logs every event it dispatches, so reading two routers' logs gives most events
twice (same ``id``, different ``logged_by``). A router dispatches an id once, so one
router's log holds each id once, but the union does not: rows are de-duplicated by ``id``
over the union before any task counts anything (one shuffle of the whole input, kept in
memory/disk for the tasks that follow). Which copy survives does not matter: the copies
differ only in ``logged_by`` and the file they sit in, never in ``time`` or ``values``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from aa.mesh import UsageError

from .artefacts import TASKS, Artefact, write_artefact
from .location import LocationConfig, mine_location, scans
from .presence import PresenceConfig, mine_presence
from .progress import Progress
from .schema import SchemaConfig, mine_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SparkConfig", "MineConfig", "MineResult", "open_session", "resolve_inputs", "read_events", "run_mining"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SparkConfig:
    """How the Spark session is made."""

    #: Spark master URL: ``local[*]`` (all cores of this machine), ``local[2]``,
    #: ``spark://host:7077``, ``yarn``, ``k8s://…``.
    master: str = "local[*]"
    #: Partitions after a shuffle. None: 32 per core for a local master, Spark's own default
    #: for a cluster. Adaptive execution merges small ones (a small log ends up with a few),
    #: but never splits big ones: too few, and a 10-million-event log makes tasks whose
    #: aggregation state no longer fits the heap (the JVM then spends its time in GC).
    shuffle_partitions: int | None = None
    #: Heap of the driver JVM, which in local mode also runs the tasks. None: a third of
    #: this machine's memory, 2 to 16 GiB (8 GiB on a 24 GiB machine): a 10-million-event
    #: log and its caches need about that, and the rest stays for the OS's file cache.
    driver_memory: str | None = None
    #: Application name shown by the cluster manager.
    app_name: str = "aa-mine"
    #: Further ``spark.*`` settings, as (key, value) pairs.
    extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.master:
            raise UsageError("SparkConfig.master must be a Spark master URL")
        if self.shuffle_partitions is not None and self.shuffle_partitions < 1:
            raise UsageError("SparkConfig.shuffle_partitions must be at least 1")


def _local_cores(master: str) -> int | None:
    if not master.startswith("local"):
        return None
    inside = master[master.find("[") + 1 : master.find("]")] if "[" in master else "1"
    inside = inside.split(",")[0]
    return os.cpu_count() or 1 if inside == "*" else max(1, int(inside))


def _default_memory() -> str:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "4g"
    return f"{min(16, max(2, total // 3 // 2**30))}g"


def open_session(config: SparkConfig) -> "SparkSession":
    """A SparkSession for *config* (or the running one: Spark has one per process).

    A local master binds the driver to 127.0.0.1 and has no web UI: mining on a laptop
    opens no port to the network.
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(config.master).appName(config.app_name)
    builder = builder.config("spark.driver.memory", config.driver_memory or _default_memory())
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    # Our own progress lines (`Progress`) replace Spark's console bar, which fights them.
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    cores = _local_cores(config.master)
    if cores is not None:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        builder = builder.config("spark.ui.enabled", "false")
    partitions = config.shuffle_partitions or (32 * cores if cores else None)
    if partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(partitions))
    for key, value in config.extra:
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def resolve_inputs(paths: Sequence[str]) -> list[str]:
    """The event log roots to read: a local router data folder becomes its ``eventlog/``,
    a local folder of routers' data folders (as `aa mine simulate` writes) each of theirs.

    Raises `UsageError` for a local path that does not exist. URIs are passed on as they
    are (Spark reports what it cannot read).
    """
    if not paths:
        raise UsageError("give at least one event log folder")
    out = []
    for p in paths:
        if "://" in p and not p.startswith("file://"):
            out.append(p)
            continue
        local = Path(p.removeprefix("file://"))
        if not local.exists():
            raise UsageError(f"no such event log folder: {p}")
        if (local / "eventlog").is_dir():
            out.append(str((local / "eventlog").resolve()))
        elif not any(local.glob("date=*")) and (subs := sorted(local.glob("*/eventlog"))):
            out.extend(str(s.resolve()) for s in subs)  # a folder of routers' data folders
        else:
            out.append(str(local.resolve()))
    return out


def read_events(spark: "SparkSession", inputs: Sequence[str]) -> "DataFrame":
    """The events of all *inputs*, each once: columns id, type, time, values, values_types.

    Not de-duplicated yet when one input is read; see the module docstring.
    """
    from pyspark.sql import functions as F

    frames = [
        spark.read.parquet(p).select("id", F.coalesce("type", F.lit("")).alias("type"), "time", "values", "values_types")
        for p in inputs
    ]
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    return df


@dataclass(frozen=True, slots=True, kw_only=True)
class MineConfig:
    """One mining run."""

    #: Event log roots (see `resolve_inputs`).
    inputs: tuple[str, ...]
    #: Folder the artefacts go to (one subfolder per task).
    adapters: str
    #: Tasks to run, of `TASKS`.
    tasks: tuple[str, ...] = TASKS
    schema: SchemaConfig = field(default_factory=SchemaConfig)
    location: LocationConfig = field(default_factory=LocationConfig)
    presence: PresenceConfig = field(default_factory=PresenceConfig)

    def __post_init__(self) -> None:
        unknown = set(self.tasks) - set(TASKS)
        if unknown or not self.tasks:
            raise UsageError(f"tasks must be some of {', '.join(TASKS)}, not {', '.join(sorted(unknown)) or 'none'}")
        if not self.inputs:
            raise UsageError("give at least one event log folder")


@dataclass(frozen=True, slots=True, kw_only=True)
class MineResult:
    """What a run did."""

    #: Rows read (with duplicates) and unique events, and unique events per type.
    events: Mapping[str, Any]
    #: The artefact each task wrote.
    artefacts: Mapping[str, Artefact]
    #: Seconds per step ("read", and each task's name) and in all ("total").
    seconds: Mapping[str, float]


def _config_dict(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


def run_mining(spark: "SparkSession", config: MineConfig, *, progress: Progress | None = None) -> MineResult:
    """Read and de-duplicate the logs, run each task, write each task's artefact."""
    from pyspark import StorageLevel

    def label(text: str) -> None:
        if progress is not None:
            progress.label = text

    seconds: dict[str, float] = {}
    t0 = t = time.perf_counter()
    inputs = resolve_inputs(config.inputs)
    label("read")
    raw = read_events(spark, inputs)
    read = raw.count()  # cheap: Parquet footers
    events = raw.dropDuplicates(["id"]).persist(StorageLevel.MEMORY_AND_DISK)
    parsed = None
    artefacts: dict[str, Artefact] = {}
    try:
        by_type = {r["type"]: r["count"] for r in events.groupBy("type").count().collect()}
        counts = {"read": read, "unique": sum(by_type.values()), "by_type": dict(sorted(by_type.items()))}
        seconds["read"] = time.perf_counter() - t
        # Location and presence read the same scans: their Radios JSON is parsed once, and kept.
        loc, pres = config.location, config.presence
        if {"location", "presence"} <= set(config.tasks) and (loc.scan_types, loc.node, loc.radios) == (
            pres.scan_types, pres.node, pres.radios
        ):
            parsed = scans(events, loc.scan_types, loc.node, loc.radios).persist(StorageLevel.MEMORY_AND_DISK)
        for task in TASKS:
            if task not in config.tasks:
                continue
            t = time.perf_counter()
            label(task)
            task_config: Any = getattr(config, task)
            if task == "schema":
                data = mine_schema(events, task_config, by_type=by_type)
            elif task == "location":
                data = mine_location(events, task_config, parsed=parsed)
            else:
                data = mine_presence(events, task_config, parsed=parsed)
            artefacts[task] = write_artefact(
                config.adapters, task, data, inputs=inputs, events=counts, config=_config_dict(task_config)
            )
            seconds[task] = time.perf_counter() - t
    finally:
        if parsed is not None:
            parsed.unpersist()
        events.unpersist()
        label("")
    seconds["total"] = time.perf_counter() - t0
    return MineResult(events=counts, artefacts=artefacts, seconds=seconds)
