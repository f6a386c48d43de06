"""The mining job: the event logs read and de-duplicated once, then each mining task, each
writing its artefact (the Spark session is `aa.tools.mining.session`'s).

Reading. The inputs are event log folders of one or more routers (`aa.router.eventlog`):
a router's data folder (its ``eventlog/`` is used), an ``eventlog/`` folder itself, or any
URI Spark reads (``hdfs://…/eventlog``, ``s3a://…``), each a root of Hive partitions. The
Parquet files under them are read in one scan with the event log's schema given, so Spark
neither infers a schema nor discovers partitions (each a job of its own; the partition
columns are not used). Local inputs are checked first, before any JVM starts: a folder
without a log, or with Parquet files that are not an event log, is one line of error.

De-duplication, where counts go wrong if done carelessly. Events flood the mesh and every
router logs every event it dispatches, so reading two routers' logs gives most events
twice (same ``id``, different ``logged_by``). A router dispatches an id once, so one
router's log holds each id once, but the union does not: rows are de-duplicated by ``id``
over the union before any task counts anything (one shuffle of the whole input, kept in
memory/disk for the tasks that follow). Which copy survives does not matter: the copies
differ only in ``logged_by`` and the file they sit in, never in ``time`` or ``values``.
The same aggregation counts the copies, so the rows read, the unique events and their
types come from one action, which also fills the cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from aa.mesh import UsageError

from .artefacts import TASKS, Artefact, write_artefact
from .location import LocationConfig, mine_location, scans
from .presence import PresenceConfig, mine_presence
from .progress import Progress
from .schema import SchemaConfig, mine_schema
from .session import SparkConfig, open_session
from .uris import UnreadableInput, unreadable_input

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "SparkConfig",
    "MineConfig",
    "MineResult",
    "open_session",
    "resolve_inputs",
    "measure_inputs",
    "scan_inputs",
    "ScannedInputs",
    "read_events",
    "UnreadableInput",
    "run_mining",
    "EVENT_COLUMNS",
]

#: The event log's columns the job reads, as Spark reads them (see `aa.router.eventlog`).
EVENT_COLUMNS: Final = (
    ("id", "string"),
    ("type", "string"),
    ("time", "timestamp"),
    ("values", "map<string,string>"),
    ("values_types", "map<string,string>"),
)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class ScannedInputs:
    """What `scan_inputs` found under the event log roots."""

    #: Bytes of the Parquet files to read (None if a root is a remote URI, whose size
    #: Spark alone knows).
    bytes: int | None
    #: Files left out, each with the reason: (path, reason).
    skipped: tuple[tuple[str, str], ...] = ()


def scan_inputs(roots: Sequence[str]) -> ScannedInputs:
    """Check every Parquet file under the local *roots* (its footer only) before Spark
    starts: a file that is not Parquet (half written, corrupt) or not an event log (another
    schema) is skipped, with its reason, and the others are mined.

    Raises `UsageError` for a local root without a Parquet file, or none that is an event
    log (naming the first bad file and why).
    """
    total: int | None = 0
    skipped: list[tuple[str, str]] = []
    for root in roots:
        if "://" in root and not root.startswith("file://"):
            total = None
            continue
        local = Path(root.removeprefix("file://"))
        files = (
            [local]
            if local.is_file()
            else sorted(f for f in local.rglob("*.parquet") if not _hidden(f, local))
        )
        if not files:
            writing = [] if local.is_file() else list(local.rglob(".part-*.parquet.inprogress"))
            if writing:
                raise UsageError(
                    f"no closed event log file in {root} yet: {len(writing)} still being written "
                    "by a running router; a file becomes readable when it is closed (every 10 "
                    "minutes, at the hour's end, or when the router stops)"
                )
            raise UsageError(
                f"no event log in {root}: no .parquet file under it (is it a router's data folder?)"
            )
        bad = [(str(f), why) for f in files if (why := _file_problem(f)) is not None]
        if len(bad) == len(files):
            path, why = bad[0]
            more = f" (and {len(bad) - 1} more files)" if len(bad) > 1 else ""
            raise UsageError(f"{path} {why}{more}: no event log to mine in {root}")
        skipped += bad
        if total is not None:
            gone = {p for p, _ in bad}
            total += sum(f.stat().st_size for f in files if str(f) not in gone)
    return ScannedInputs(bytes=total, skipped=tuple(skipped))


def measure_inputs(roots: Sequence[str]) -> int | None:
    """Bytes of event log Parquet under the local *roots* (see `scan_inputs`, which also
    says which files it left out)."""
    return scan_inputs(roots).bytes


def _hidden(path: Path, root: Path) -> bool:
    # Spark skips files and folders whose names start with "." or "_" (files being written).
    return any(part.startswith((".", "_")) for part in path.relative_to(root).parts)


def _file_problem(path: Path) -> str | None:
    """Why *path* is not an event log file Spark can read, in a few words (None: it is)."""
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)  # the footer only
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        return f"is not a readable Parquet file ({_first_line(exc)})"
    names = set(schema.names)
    missing = [c for c, _ in EVENT_COLUMNS if c not in names]
    if missing:
        return f"is not an event log: no column {', '.join(missing)}"
    wrong = [c for c, kind in EVENT_COLUMNS if not _arrow_is(schema.field(c).type, kind)]
    if wrong:
        return f"is not an event log: column {', '.join(wrong)} of another type"
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _arrow_is(arrow_type: Any, kind: str) -> bool:
    import pyarrow as pa

    if kind == "string":
        return bool(pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type))
    if kind == "timestamp":
        return bool(pa.types.is_timestamp(arrow_type))
    return bool(pa.types.is_map(arrow_type))


def read_events(
    spark: SparkSession, inputs: Sequence[str], *, exclude: Sequence[str] = ()
) -> DataFrame:
    """The rows of all *inputs* (one scan) but the files *exclude* names: columns id, type
    ("" for none), time, values, values_types. Not de-duplicated; see the module
    docstring."""
    from pyspark.sql import functions as F

    if exclude:  # a local root with a file left out: its other files, one by one
        gone = set(exclude)
        listed: list[str] = []
        for root in inputs:
            local = Path(root.removeprefix("file://"))
            if ("://" in root and not root.startswith("file://")) or local.is_file():
                listed.append(root)
                continue
            listed += sorted(
                str(f)
                for f in local.rglob("*.parquet")
                if not _hidden(f, local) and str(f) not in gone
            )
        inputs = listed
    schema = ", ".join(f"`{c}` {t}" for c, t in EVENT_COLUMNS)
    try:  # lists the files: an input Spark cannot open fails here
        df = (
            spark.read.schema(schema)
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", "*.parquet")
            .parquet(*inputs)
        )
    except Exception as exc:
        if (reason := unreadable_input(exc, inputs)) is not None:
            raise UnreadableInput(reason) from exc
        raise
    return df.select(
        "id", F.coalesce("type", F.lit("")).alias("type"), "time", "values", "values_types"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MineConfig:
    """One mining run."""

    #: Event log roots (see `resolve_inputs`).
    inputs: tuple[str, ...]
    #: Folder the artefacts go to (one subfolder per task).
    adapters: str
    #: Tasks to run, of `TASKS`.
    tasks: tuple[str, ...] = TASKS
    #: Files under the inputs not to read (see `scan_inputs`).
    exclude: tuple[str, ...] = ()
    schema: SchemaConfig = field(default_factory=SchemaConfig)
    location: LocationConfig = field(default_factory=LocationConfig)
    presence: PresenceConfig = field(default_factory=PresenceConfig)

    def __post_init__(self) -> None:
        unknown = set(self.tasks) - set(TASKS)
        if unknown or not self.tasks:
            raise UsageError(
                f"tasks must be some of {', '.join(TASKS)}, not "
                f"{', '.join(sorted(unknown)) or 'none'}"
            )
        if not self.inputs:
            raise UsageError("give at least one event log folder")


@dataclass(frozen=True, slots=True, kw_only=True)
class MineResult:
    """What a run did."""

    #: Rows read (with duplicates) and unique events, and unique events per type.
    events: Mapping[str, Any]
    #: The artefact each task wrote.
    artefacts: Mapping[str, Artefact]
    #: Seconds per step ("read", and each task's name; tasks side by side overlap) and in
    #: all ("total").
    seconds: Mapping[str, float]


def _config_dict(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


def _dedup(raw: DataFrame) -> DataFrame:
    """One row per id (its first copy), with ``copies``: how many rows had it.

    `first` of a map keeps no fixed-width buffer, so Spark aggregates by sorting. Grouped
    as it comes, each task would sort its map-valued rows by id for a partial aggregate
    that merges nothing (a router's log holds an id once) and then the shuffled rows again:
    repartitioned by id first, the rows are sorted once, after the shuffle."""
    from pyspark.sql import functions as F

    return (
        raw.repartition("id")
        .groupBy("id")
        .agg(
            *[F.first(c).alias(c) for c in ("type", "time", "values", "values_types")],
            F.count(F.lit(1)).alias("copies"),
        )
    )


#: Spark actions per step (for progress).
_PARTS: Final = {"read": 1, "schema": 4, "location": 2, "presence": 5}


def run_mining(
    spark: SparkSession,
    config: MineConfig,
    *,
    progress: Progress | None = None,
    side_by_side: bool = False,
) -> MineResult:
    """Read and de-duplicate the logs, run each task, then write each task's artefact
    (none if a task fails).

    *side_by_side*: run the tasks at once, each from its own thread (Spark runs their jobs
    side by side). For a small log, whose time goes to planning and compiling queries on
    the driver, one core at a time, this keeps both cores busy; a large log's tasks run
    one after the other, each with the whole heap. *progress*, if given, is told each step
    (`Progress.begin`) and each Spark action done.
    """
    from concurrent.futures import ThreadPoolExecutor

    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    def begin(step: str, parts: int) -> None:
        if progress is not None:
            progress.begin(step, parts, alongside=side_by_side and step != "read")

    def ticker(step: str) -> Callable[[], None]:
        def tick() -> None:
            if progress is not None:
                progress.part_done(step)

        return tick

    tick = ticker("read")

    seconds: dict[str, float] = {}
    t0 = t = time.perf_counter()
    inputs = resolve_inputs(config.inputs)
    begin("read", _PARTS["read"])
    events = _dedup(read_events(spark, inputs, exclude=config.exclude)).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    parsed = None
    artefacts: dict[str, Artefact] = {}
    try:
        rows = (
            events.groupBy("type")
            .agg(F.count(F.lit(1)).alias("n"), F.sum("copies").alias("read"))
            .collect()
        )
        tick()
        by_type = {r["type"]: r["n"] for r in rows}
        counts = {
            "read": sum(r["read"] for r in rows),
            "unique": sum(by_type.values()),
            "by_type": dict(sorted(by_type.items())),
        }
        seconds["read"] = time.perf_counter() - t
        # Location and presence read the same scans: their Radios JSON is parsed once, and kept.
        loc, pres = config.location, config.presence
        if {"location", "presence"} <= set(config.tasks) and (
            loc.scan_types,
            loc.node,
            loc.radios,
        ) == (pres.scan_types, pres.node, pres.radios):
            parsed = scans(events, loc.scan_types, loc.node, loc.radios).persist(
                StorageLevel.MEMORY_AND_DISK
            )
        if progress is not None:
            progress.finish("read")

        def run(task: str) -> tuple[dict[str, Any], float]:
            t = time.perf_counter()
            task_config: Any = getattr(config, task)
            begin(task, _PARTS[task])
            if task == "schema":
                data = mine_schema(events, task_config, by_type=by_type, tick=ticker(task))
            elif task == "location":
                data = mine_location(events, task_config, parsed=parsed, tick=ticker(task))
            else:
                data = mine_presence(events, task_config, parsed=parsed, tick=ticker(task))
            if progress is not None:
                progress.finish(task)
            return data, time.perf_counter() - t

        todo = [task for task in TASKS if task in config.tasks]
        if side_by_side and len(todo) > 1:
            with ThreadPoolExecutor(
                max_workers=len(todo), thread_name_prefix="aa-mine-task"
            ) as pool:
                done = list(pool.map(run, todo))  # the first error, if any, is raised here
        else:
            done = [run(task) for task in todo]
        # Written once every task is done: a run that fails (or is stopped) half way adds
        # nothing to the adapters folder, and each artefact is written whole.
        for task, (data, secs) in zip(todo, done):
            artefacts[task] = write_artefact(
                config.adapters,
                task,
                data,
                inputs=inputs,
                events=counts,
                config=_config_dict(getattr(config, task)),
            )
            seconds[task] = secs
    finally:
        if parsed is not None:
            parsed.unpersist()
        events.unpersist()
    seconds["total"] = time.perf_counter() - t0
    return MineResult(events=counts, artefacts=artefacts, seconds=seconds)
