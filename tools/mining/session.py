"""The Spark session of a mining run: sized from the input, quick to start on a small
machine, quiet, and failing with one line a user can act on.

Why the start matters. For a log under 100,000 events the mining itself is milliseconds
of work per query; what costs is the JVM: loading Spark's classes, compiling its hot code
(JIT) and every query's generated code. On a 2-core machine a default session spends tens
of CPU seconds on that. `session_settings` therefore sizes the session from the Parquet
bytes to read (pure: tested without Spark):

- shuffle partitions: one per `BYTES_PER_PARTITION` of input, at least one per core, at
  most 32 per core (adaptive execution merges small ones, never splits big ones); the
  cores are this machine's for a local master, and a cluster's executors' otherwise,
  asked of Spark once they registered (`wait_for_executors`, which also stops a job that
  gets none instead of letting it wait for ever);
- a *small* log (under `SMALL_LOG_BYTES`) runs on a JVM that only uses the quick JIT
  compiler (C1) and the serial collector, and without whole-stage code generation: nothing
  it runs is hot long enough to repay C2 or Janino;
- no web UI, no console progress bar, Spark's log at ERROR (WARN with ``verbose``);
- the driver's JVM (this machine's, whatever the master) maps Spark's classes from a
  class archive (AppCDS, `class_archive_options`) instead of loading and verifying them
  one by one: the first run without one says so in a line and writes it when its JVM
  exits (~180 MB; `stop_session` waits for that and puts it in place), the next ones
  start in half the time. ``aa mine prepare`` (`aa.tools.mining.prepare`) writes it ahead.
  The archive is shared by every virtual environment with the same PySpark: it lives in
  ``~/.cache/aa/<PySpark version>/``, and since a JVM takes an archive only for the very
  jar files (paths, sizes, times) it was written from, Spark runs from one shared copy of
  PySpark's ``bin``, ``jars`` and ``python`` there (`shared_spark_home`: hard links where
  the file system allows, else a copy), not from each clone's own.

The JVM's stderr is read by a thread (`_StderrPump`): unless ``verbose``, only Spark's
ERROR log lines (without their stack traces) go on, to a *sink* (the progress line's
writer, which clears the status line first); the JVM's start-up notes, WARN lines and
stack traces are dropped. Its last lines are kept, so a JVM that dies at start is reported
by what it said.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from aa.mesh import AaError, UsageError

if TYPE_CHECKING:
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

__all__ = [
    "SparkConfig",
    "SparkStartError",
    "open_session",
    "session_settings",
    "check_java",
    "class_archive_options",
    "class_archive_file",
    "archive_dir",
    "shared_spark_home",
    "stop_session",
    "check_master",
    "probe_spark_rpc",
    "spark_error_message",
    "local_cores",
    "shuffle_partitions_for",
    "wait_for_executors",
    "NoExecutorsError",
    "BYTES_PER_PARTITION",
    "SMALL_LOG_BYTES",
]

#: Parquet bytes per shuffle partition: about 250,000 logged events (~35 bytes each in the
#: routers' compressed Parquet), whose aggregation state (maps of strings, ~10× the bytes on
#: disk) stays far below a task's share of the heap.
BYTES_PER_PARTITION: Final = 8 * 2**20
#: Logs smaller than this (~500,000 events) are "small": their JVM is tuned to start fast
#: (see the module docstring). Above it, C2 and whole-stage code generation repay their cost.
SMALL_LOG_BYTES: Final = 16 * 2**20
#: Shuffle partitions per local core at most (Spark's adaptive execution coalesces).
MAX_PARTITIONS_PER_CORE: Final = 32
#: JVM options of a small log's driver: C1 only (compiles at once, never recompiles with
#: C2), one GC thread (nothing to collect concurrently in a short run).
SMALL_JVM_OPTIONS: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: Lines of the JVM's stderr kept to explain a failed start.
_TAIL_LINES: Final = 40

#: Spark master URLs this job knows how to run on (anything else is a typo).
_MASTER = re.compile(
    r"^(local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?|local-cluster\[\d+,\d+,\d+\]|spark://[^/\s]+"
    r"|yarn|k8s://\S+|mesos://\S+|connect://\S+)$"
)

_LOG4J: Final = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""


class SparkStartError(AaError):
    """Spark could not start (the JVM died, or refused the configuration); the message
    says what the JVM said last. ``__cause__`` is PySpark's exception."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SparkConfig:
    """How the Spark session is made."""

    #: Spark master URL: ``local[*]`` (all cores of this machine), ``local[2]``,
    #: ``spark://host:7077``, ``yarn``, ``k8s://…``.
    master: str = "local[*]"
    #: Partitions after a shuffle. None: sized from the input (see `session_settings`).
    shuffle_partitions: int | None = None
    #: Heap of the driver JVM, which in local mode also runs the tasks. None: a third of
    #: this machine's memory, 2 to 16 GiB (8 GiB on a 24 GiB machine): a 10-million-event
    #: log and its caches need about that, and the rest stays for the OS's file cache.
    driver_memory: str | None = None
    #: Application name shown by the cluster manager.
    app_name: str = "aa-mine"
    #: Spark's own log at WARN (not ERROR), and the JVM's stderr passed on whole.
    verbose: bool = False
    #: Folder of the JVM's class archive (see `class_archive_options`); None:
    #: ``$XDG_CACHE_HOME/aa`` or ``~/.cache/aa``; "": no archive.
    class_archive_dir: str | None = None
    #: Heap of each executor on a cluster (``spark.executor.memory``); None: Spark's 1g.
    executor_memory: str | None = None
    #: Cores the job takes of a cluster in all (``spark.cores.max``); None: all it offers.
    total_cores: int | None = None
    #: Address the executors reach the driver at (``spark.driver.host``): this machine's
    #: name or address as the cluster sees it. None: Spark's guess (loopback when local).
    driver_host: str | None = None
    #: Seconds a cluster job waits for its first executor before it stops (a worker too
    #: small for ``executor_memory``, or one that cannot reach the driver, would hang it).
    executor_wait: float = 60.0
    #: Further ``spark.*`` settings, as (key, value) pairs; they win over ours.
    extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not _MASTER.match(self.master):
            raise UsageError(
                f"--master {self.master!r} is not a Spark master URL "
                "(local, local[N], local[*], spark://HOST:PORT, yarn, k8s://…)"
            )
        if self.shuffle_partitions is not None and self.shuffle_partitions < 1:
            raise UsageError("SparkConfig.shuffle_partitions must be at least 1")
        for flag, size in (
            ("--driver-memory", self.driver_memory),
            ("--executor-memory", self.executor_memory),
        ):
            if size is not None and not re.fullmatch(r"[1-9]\d*[kmgtKMGT]?", size):
                raise UsageError(f"{flag} {size!r} is not a size such as 4g or 512m")
        if self.total_cores is not None and self.total_cores < 1:
            raise UsageError("--total-cores must be at least 1")
        if self.driver_host is not None and not re.fullmatch(r"[\w.:\-\[\]]+", self.driver_host):
            raise UsageError(f"--driver-host {self.driver_host!r} is not a host name or address")
        if not 0 < self.executor_wait <= 86_400:
            raise UsageError("--executor-wait must be between 0 and 86400 seconds")


def local_cores(master: str) -> int | None:
    """Cores a local master uses (None for a cluster)."""
    if not master.startswith("local") or master.startswith("local-cluster"):
        return None
    if "[" not in master:
        return 1
    inside = master[master.find("[") + 1 : master.find("]")].split(",")[0]
    return (os.cpu_count() or 1) if inside == "*" else max(1, int(inside))


def check_master(master: str, *, timeout: float = 5.0) -> None:
    """For a standalone master (``spark://h1:p1,h2:p2``): that one of its addresses is a
    Spark RPC port, in seconds.

    Spark itself would try for a minute (three 20-second registrations) before giving up
    with a misleading "stopped SparkContext", logging errors all along. A closed port, a web
    server (the master's web UI, 8080) or anything else not speaking Spark's RPC raises
    `UsageError` naming what answered (see `probe_spark_rpc`).
    """
    if not master.startswith("spark://"):
        return
    why = ""
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--master {master!r}: {address!r} is not HOST:PORT")
        verdict = probe_spark_rpc(host.strip("[]"), int(port), timeout=timeout)
        if verdict is None:
            return
        why = f"{address}: {verdict}"
    raise UsageError(f"{why}: not a Spark master (or use --master 'local[*]')")


#: A Spark RPC frame asking for a stream no server has (`probe_spark_rpc`): frame length
#: (8 bytes, itself included), message type 6 (StreamRequest), the stream id (4-byte length,
#: UTF-8). A Spark server answers with a StreamFailure (type 8) and logs nothing.
_PROBE_STREAM = b"/files/aa-mine-probe"
_PROBE: Final = (
    (8 + 1 + 4 + len(_PROBE_STREAM)).to_bytes(8, "big")
    + b"\x06"
    + len(_PROBE_STREAM).to_bytes(4, "big")
    + _PROBE_STREAM
)
#: Spark's reply types to a stream request: StreamResponse, StreamFailure.
_STREAM_REPLIES: Final = (7, 8)


def probe_spark_rpc(host: str, port: int, *, timeout: float = 5.0) -> str | None:
    """None if *host*:*port* answers as a Spark RPC server, else what is wrong, in a few
    words ("connection refused", "a web server answers (HTTP/1.1 400 ...): Spark's web UI?").

    The probe is a request for a stream that does not exist: a Spark server replies with a
    failure frame, an HTTP server with an HTTP error, anything else with something else or
    nothing. A server that closes the connection without a word (Spark with authentication
    on) is taken as Spark: Spark itself then says more."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(_PROBE)
            reply = b""
            try:
                while len(reply) < 9:
                    chunk = sock.recv(9 - len(reply))
                    if not chunk:
                        return None if not reply else "the connection closed mid-answer"
                    reply += chunk
            except TimeoutError:
                return f"no answer in {timeout:g} s" if not reply else "a partial answer"
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    if reply[8] in _STREAM_REPLIES and int.from_bytes(reply[:8], "big") > 9:
        return None
    if reply.startswith(b"HTTP/"):
        return "a web server answers (Spark's web UI? the master's port is usually 7077)"
    return f"something else answers ({reply[:9]!r})"


#: A class archive being written (by a JVM at its exit) is taken as whole this many
#: seconds after it was last written (a JVM writes it in a few seconds).
_ARCHIVE_SETTLE_S: Final = 30.0


def class_archive_file(folder: Path, java: str) -> Path:
    """The class archive of *java* and the Spark that runs (it may not exist yet)."""
    import hashlib

    import pyspark

    key = hashlib.sha256(
        f"{os.path.realpath(java)}\0{pyspark.__version__}\0{_spark_home()}".encode()
    ).hexdigest()[:16]
    return folder / f"spark-{key}.jsa"


def _spark_home() -> str:
    """The Spark PySpark launches: $SPARK_HOME, else PySpark's own folder."""
    import pyspark

    return os.path.realpath(os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__))


#: What of PySpark's folder a Spark home needs: the launch scripts, the classes, the
#: Python side that executors run.
_SPARK_HOME_PARTS: Final = ("bin", "jars", "python", "conf", "sbin")


def shared_spark_home(folder: Path) -> Path | None:
    """``folder/spark``: PySpark's Spark, shared by every virtual environment with this
    PySpark version, made once (atomically: a folder renamed into place); None when it
    cannot be made (the clone's own PySpark is used then). Files are hard links where
    the file system allows (no space taken), else copies."""
    import pyspark

    home = folder / "spark"
    if (home / ".complete").is_file():
        return home
    source = Path(pyspark.__file__).parent
    tmp = folder / f".spark.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for part in _SPARK_HOME_PARTS:
            if (source / part).is_dir():
                shutil.copytree(
                    source / part,
                    tmp / part,
                    symlinks=True,
                    copy_function=_link_or_copy,
                    ignore=shutil.ignore_patterns("__pycache__"),
                )
        (tmp / ".complete").write_text(f"PySpark {pyspark.__version__} from {source}\n")
        try:
            os.rename(tmp, home)
        except OSError:  # another run made it meanwhile (or left a broken one)
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    return home if (home / ".complete").is_file() else None


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def use_shared_spark_home(config: SparkConfig) -> None:
    """Run Spark from `shared_spark_home` unless $SPARK_HOME names one or *config* keeps
    no archive (before `class_archive_file`, whose name depends on it)."""
    folder = archive_dir(config)
    if folder is None or os.environ.get("SPARK_HOME"):
        return
    home = shared_spark_home(folder)
    if home is not None:
        os.environ["SPARK_HOME"] = str(home)


def class_archive_options(folder: Path, java: str, now: float) -> str:
    """JVM options that use this machine's archive of Spark's classes, or that write it
    at the JVM's exit if there is none yet ("" while another run is writing it).

    The archive is for one Java and one Spark: its name holds a hash of both. A JVM that
    cannot use an archive (stale, half written) ignores it and loads classes as usual;
    unknown options are ignored too (a JVM other than HotSpot), and the JVM's own log is
    off (it would warn on stdout, where our results go).
    """
    final = class_archive_file(folder, java)
    stem = final.name.removesuffix(".jsa")
    quiet = "-XX:+IgnoreUnrecognizedVMOptions -Xlog:disable -Xlog:all=error:stderr"
    if not final.is_file():
        for part in folder.glob(f"{stem}.*.part"):
            try:
                if now - part.stat().st_mtime < _ARCHIVE_SETTLE_S:
                    return ""  # being written
                os.replace(part, final)
                break
            except OSError:
                return ""
        else:
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError:
                return ""
            return f"-XX:ArchiveClassesAtExit={folder / f'{stem}.{os.getpid()}.part'} {quiet}"
    return f"-XX:SharedArchiveFile={final} {quiet}"


#: The class archive this process's JVM writes at its exit, if it writes one: (part, final).
_writing: list[tuple[Path, Path]] = []
#: Seconds `stop_session` waits for a JVM to write its class archive (~180 MB; a few
#: seconds on an idle machine, a minute on a very busy one).
ARCHIVE_WRITE_TIMEOUT_S: Final = 120.0


def stop_session(spark: SparkSession, *, timeout: float = ARCHIVE_WRITE_TIMEOUT_S) -> Path | None:
    """Stop *spark*. If its JVM writes the class archive at its exit, end that JVM now
    (PySpark's gateway exits when its stdin closes), wait for it, and put the archive in
    place, so the very next run uses it. Returns the archive written, else None.

    The JVM is gone afterwards; a later `open_session` in this process starts a new one.
    """
    from pyspark import SparkContext

    spark.stop()
    if not _writing:
        return None
    part, final = _writing.pop()
    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None or proc.stdin is None:
        return None
    try:
        proc.stdin.close()
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:  # left to the next run (see _ARCHIVE_SETTLE_S)
        return None
    except (OSError, ValueError):
        pass
    SparkContext._gateway = SparkContext._jvm = None
    try:
        if part.stat().st_size > 0 and not final.exists():
            os.replace(part, final)
            return final
    except OSError:
        pass
    return None


def archive_dir(config: SparkConfig) -> Path | None:
    """The folder of *config*'s class archive (None: no archive): the one it names, else
    ``$XDG_CACHE_HOME/aa/<PySpark version>`` (``~/.cache/aa/…``)."""
    if config.class_archive_dir is not None:
        return Path(config.class_archive_dir) if config.class_archive_dir else None
    import pyspark

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "aa", pyspark.__version__)


def _default_memory() -> str:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "4g"
    return f"{min(16, max(2, total // 3 // 2**30))}g"


def session_settings(config: SparkConfig, input_bytes: int | None) -> dict[str, str]:
    """The Spark settings for *config* and *input_bytes* of Parquet to read (None: not
    known, e.g. a remote URI), ``config.extra`` last. Pure.

    >>> session_settings(SparkConfig(master="local[2]"), 2_000_000)["spark.sql.shuffle.partitions"]
    '2'
    """
    s = {
        "spark.master": config.master,
        "spark.app.name": config.app_name,
        "spark.driver.memory": config.driver_memory or _default_memory(),
        "spark.sql.session.timeZone": "UTC",
        # Our progress line replaces Spark's console bar, which fights it.
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
    }
    cores = local_cores(config.master)
    small = input_bytes is not None and input_bytes < SMALL_LOG_BYTES
    if cores is not None:
        # Local: no web UI and the driver on loopback, so mining opens no port to the network.
        s["spark.ui.enabled"] = "false"
        s["spark.driver.host"] = "127.0.0.1"
        s["spark.driver.bindAddress"] = "127.0.0.1"
    if small:
        # The driver JVM is this machine's whatever the master: on a cluster it only plans.
        s["spark.driver.defaultJavaOptions"] = SMALL_JVM_OPTIONS
        s["spark.sql.codegen.wholeStage"] = "false"
    if config.executor_memory is not None:
        s["spark.executor.memory"] = config.executor_memory
    if config.total_cores is not None:
        s["spark.cores.max"] = str(config.total_cores)
    if config.driver_host is not None:
        s["spark.driver.host"] = config.driver_host
    partitions = config.shuffle_partitions
    if partitions is None and cores is not None:
        partitions = shuffle_partitions_for(cores, input_bytes)
    if partitions is not None:
        # A cluster's are set once its executors are there (`open_session`).
        s["spark.sql.shuffle.partitions"] = str(partitions)
    s.update(config.extra)
    return s


def shuffle_partitions_for(cores: int, input_bytes: int | None) -> int:
    """Shuffle partitions for *cores* running tasks and *input_bytes* of Parquet (None:
    unknown): one per `BYTES_PER_PARTITION`, a multiple of the cores, at most
    `MAX_PARTITIONS_PER_CORE` per core. Pure.

    >>> shuffle_partitions_for(2, 2_000_000), shuffle_partitions_for(4, None)
    (2, 128)
    """
    cores = max(1, cores)
    top = MAX_PARTITIONS_PER_CORE * cores
    if input_bytes is None:
        return top
    need = -(-input_bytes // BYTES_PER_PARTITION)
    return min(top, max(cores, -(-need // cores) * cores))


def check_java() -> str:
    """The ``java`` Spark will run (``$JAVA_HOME/bin/java``, else the one on PATH).

    Raises `UsageError` when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home, "bin", "java")
        if os.access(java, os.X_OK):
            return str(java)
        raise UsageError(
            f"JAVA_HOME={home} has no bin/java: point it at a Java 17+ runtime, or unset it"
        )
    java_path = shutil.which("java")
    if java_path is None:
        raise UsageError(
            "Spark needs Java (17 or later) and there is no 'java' on PATH: "
            "install one (apt-get install default-jre-headless) or set JAVA_HOME"
        )
    return java_path


#: The lines of the JVM's stderr passed on when not verbose: log lines at ERROR and up.
_PASS = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (ERROR|FATAL) ")


class _StderrPump:
    """Reads the JVM's stderr line by line: passes lines on to *sink* (all of them when
    verbose, else only those `_PASS` matches) and keeps the last ones."""

    def __init__(self, stream: IO[bytes], sink: Callable[[str], None], verbose: bool) -> None:
        self.stream, self.sink, self.verbose = stream, sink, verbose
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.thread = threading.Thread(target=self._run, name="aa-mine-jvm-stderr", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for raw in iter(self.stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail.append(line)
            if self.verbose or _PASS.match(line):
                try:
                    self.sink(line)
                except (OSError, ValueError):  # our stderr closed: keep draining the pipe
                    pass

    def last_words(self) -> str:
        """The JVM's last meaningful line (for an error message)."""
        self.thread.join(timeout=2.0)
        for line in reversed(self.tail):
            text = line.strip()
            if text and not text.startswith(("at ", "...", "WARNING: Using incubator")):
                return text
        return "the JVM exited without a word"


def _print_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def open_session(
    config: SparkConfig,
    *,
    input_bytes: int | None = None,
    sink: Callable[[str], None] | None = None,
) -> SparkSession:
    """A SparkSession for *config* and a log of *input_bytes* (see `session_settings`), or
    the running one (Spark has one per process; JVM options then stay as they were).

    Raises `UsageError` without Java, `SparkStartError` when the JVM or the context cannot
    start. JVM lines that pass the filter go to *sink* (default: stderr).
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    settings = session_settings(config, input_bytes)
    level = "warn" if config.verbose else "error"
    if local_cores(config.master) is not None:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="aa-mine-") as tmp:
        if SparkContext._gateway is None:  # no JVM yet: start it with our stderr pump
            java = check_java()
            log4j = Path(tmp, "log4j2.properties")
            log4j.write_text(_LOG4J.format(level=level), encoding="utf-8")
            opts = settings.get("spark.driver.defaultJavaOptions", "")
            archive = archive_dir(config)
            writes = False
            if archive is not None:  # the driver's classes, for any master
                use_shared_spark_home(config)
                cds = class_archive_options(archive, java, time.time())
                if "ArchiveClassesAtExit=" in cds:
                    part = Path(cds.split("ArchiveClassesAtExit=", 1)[1].split()[0])
                    _writing[:] = [(part, class_archive_file(archive, java))]
                    writes = True
                opts = f"{opts} {cds}"
            settings["spark.driver.defaultJavaOptions"] = (
                f"{opts} -Dlog4j2.configurationFile={log4j.as_uri()}".strip()
            )
            conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
            _launch(conf, sink or _print_stderr, config.verbose)
            if writes:
                (sink or _print_stderr)(
                    f"aa mine: first run with this Spark here: its class archive (~180 MB, "
                    f"in {archive}) is written as it ends; later runs start faster"
                )
        conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
        try:
            spark = SparkSession.builder.config(conf=conf).getOrCreate()
        except Exception as exc:  # Py4JJavaError: the context refused the configuration
            raise SparkStartError(f"Spark could not start: {spark_error_message(exc)}") from exc
    if local_cores(config.master) is None:
        try:
            cores = wait_for_executors(spark, config)
        except BaseException:
            spark.stop()
            raise
        if config.shuffle_partitions is None and "spark.sql.shuffle.partitions" not in dict(
            config.extra
        ):
            settings["spark.sql.shuffle.partitions"] = str(
                shuffle_partitions_for(cores, input_bytes)
            )
    for key in (
        "spark.sql.shuffle.partitions",
        "spark.sql.codegen.wholeStage",
        "spark.sql.session.timeZone",
    ):
        if key in settings:  # runtime settings: also right for a session that was running
            spark.conf.set(key, settings[key])
    spark.sparkContext.setLogLevel(level.upper())
    return spark


class NoExecutorsError(AaError):
    """A cluster gave the job no executor in time (`SparkConfig.executor_wait`)."""


def wait_for_executors(
    spark: SparkSession, config: SparkConfig, *, clock: Callable[[], float] = time.monotonic
) -> int:
    """Wait until the cluster has given *spark* an executor; return the cores the job
    runs tasks on (Spark's default parallelism: the executors' cores, at least 2).

    Raises `NoExecutorsError` after ``config.executor_wait`` seconds without one: Spark
    would wait for ever, saying only in its log that the "Initial job has not accepted any
    resources"."""
    sc = spark.sparkContext
    deadline = clock() + config.executor_wait
    tick = threading.Event()
    # The driver counts among the block managers; each executor adds one.
    while sc._jsc.sc().getExecutorMemoryStatus().size() < 2:
        if clock() >= deadline:
            asked = ", ".join(
                f"{what} {value}"
                for what, value in (
                    ("executor memory", config.executor_memory or "1g"),
                    ("cores", config.total_cores),
                )
                if value
            )
            raise NoExecutorsError(
                f"no executor in {config.executor_wait:g} s from {config.master} (Spark: "
                f'"Initial job has not accepted any resources"): no worker has room for '
                f"{asked}, or the workers cannot reach this driver at "
                f"{sc.getConf().get('spark.driver.host')} (--driver-host)"
            )
        tick.wait(0.1)
    return int(sc.defaultParallelism)


def _launch(conf: SparkConf, sink: Callable[[str], None], verbose: bool) -> None:
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    # The JVM's stderr is a pipe of ours: the pump reads it until every JVM process closed it.
    r, w = os.pipe()
    pump = _StderrPump(os.fdopen(r, "rb"), sink, verbose)
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": w})  # type: ignore[no-untyped-call]  # py4j: untyped
    except Exception as exc:  # JAVA_GATEWAY_EXITED: the JVM said why on its stderr
        os.close(w)
        raise SparkStartError(f"Spark could not start: {pump.last_words()}") from exc
    os.close(w)
    try:
        SparkContext(conf=conf, gateway=gateway)
    except Exception as exc:
        raise SparkStartError(f"Spark could not start: {spark_error_message(exc)}") from exc


def spark_error_message(exc: BaseException) -> str:
    """What a (Java) exception from Spark says, in one line: no stack trace, no class
    names in front."""
    text = str(getattr(exc, "java_exception", None) or exc).strip()
    for line in text.splitlines():
        line = line.strip().removeprefix(": ")
        if line and not line.startswith(("at ", "An error occurred while calling")):
            while (shorter := re.sub(r"^[\w.$]+(Exception|Error): ", "", line)) != line:
                line = shorter
            return line
    return type(exc).__name__
