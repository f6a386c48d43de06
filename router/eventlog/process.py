"""The event log's writer process: `aa.router.eventlog.writer` runs there, so that turning
rows into Parquet takes none of the router's GIL (why: `aa.router.eventlog.recorder`).

`WriterProcess` is the router's handle on it, with the `Writer`'s methods (``scan``,
``write``, ``close``, ``maintain``) and counters; each call runs on the log's one
executor thread, sends the command and waits for the answer (the wait holds no GIL).

Protocol, over a socket pair (`multiprocessing.connection` framing, pickled tuples)::

    router → writer   ("init", now, (root, router, config))     first, once
                      (command, now, args)                      scan, write, close, maintain, stop
    writer → router   (counters, records)                       after each command

*now* is the router's clock (`EventLog`'s; tests move it): the writer's clock for file
ages and bounds. *counters* are the `Writer`'s (rows, files, deleted, dropped, errors)
since it started, and the rows it holds (waiting); *records* the log records it made
meanwhile, ``(level, text)``, which the router logs as its own — the writer process has no
log output of its own.

Deferred writing: a ``write`` is answered once its rows are held, not written
(`EventLogConfig.defer_bytes`). The process writes what it holds, oldest first, when no
command has come for ``defer_pause`` seconds (the router paused: it goes on until the next
command), before a ``close`` or ``stop``, and whatever is beyond ``defer_bytes`` or older
than ``defer_seconds`` at once. Why: on a machine whose cores the router and its clients
fill, the writer's work per row (decoding, the Arrow columns, Parquet) is taken from
routing, while holding a row costs the writer next to nothing; a burst is routed at full
speed, and written after it.

Life: the process starts with the first command and ends at "stop", or when the socket
closes because the router died — having closed its open file either way, so every row it
was given is readable. It runs in a session of its own: the Ctrl-C meant for a router in a
terminal does not cut its writer off mid-file; and at a lower priority (`WRITER_NICE`). If
it dies (killed, out of memory), the rows
in its open file are lost, those of the command in flight too (counted as dropped), and
the next command, once `RESTART_DELAY` seconds of the log's clock have passed, starts a
new one, whose ``scan`` removes the hidden file the dead one left. The rows a dead writer
held are counted as dropped too.
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import os
import platform
import re
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:
    from .recorder import EventLogConfig
    from .writer import Writer

__all__ = [
    "WriterProcess",
    "RESTART_DELAY",
    "STOP_TIMEOUT",
    "WRITER_NICE",
    "Chunk",
    "Hop",
    "safe_name",
]

#: This router's hop for events it logs as the bytes they came in from a peer (a flood
#: group's blob, whose ttl and path in each event's meta are the origin's): ``(ttl, path)``,
#: written in each event's meta in their place.
Hop = tuple[int, Sequence[str]]
#: Rows logged at one time: ``(logged, count, msgpack of [[id, type, values, meta], ...],
#: hop)``, *hop* None when their meta is as dispatched. Defined here, on the router's side,
#: with `safe_name`: the router process never imports the writer (`writer`, pyarrow), which
#: only the writer process loads.
Chunk = tuple[float, int, bytes, "Hop | None"]


def safe_name(name: str) -> str:
    """*name* (a router's id) as it appears in the log's file names."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "router"


log = logging.getLogger("aa.router.eventlog")

#: Seconds after a writer process died before the next one is started: a writer that cannot
#: start (or dies at once) must not be restarted for every batch of rows.
RESTART_DELAY: Final = 10.0
#: Seconds the writer process has, once told to stop, to close its file and exit.
STOP_TIMEOUT: Final = 60.0

#: How much lower the writer process's scheduling priority is than the router's (nice).
#: On a machine whose cores are all busy, routing comes first, and the writer still keeps
#: up; where the cores are not all busy, it changes nothing (figures: docs/performance.md).
WRITER_NICE: Final = 5

#: The writer process's garbage-collector thresholds. A row group makes some 50,000
#: short-lived containers, none in a cycle: with Python's default (700) the collector would
#: walk them again and again for nothing.
GC_THRESHOLD: Final = (100_000, 50, 100)

#: The writer process's malloc settings (glibc), in bytes. A row group allocates and frees
#: buffers of megabytes (the chunks received, the columns, Parquet's pages); with glibc's
#: defaults they are mapped and unmapped, or the heap's top given back, at every row group,
#: and the kernel zeroes every page again when it is touched next, on the writer's CPU.
#: Below `MALLOC_MMAP_THRESHOLD` they come from the heap, whose free top is given back
#: only beyond `MALLOC_TRIM_THRESHOLD` (above what the writer holds, `defer_bytes`, with a
#: row group's work), and once the writer has been idle for `TRIM_IDLE` seconds. 32 MiB is
#: the highest mmap threshold glibc accepts on 64-bit machines.
MALLOC_MMAP_THRESHOLD: Final = 32 * 1024 * 1024
MALLOC_TRIM_THRESHOLD: Final = 256 * 1024 * 1024
#: Seconds without a command, and nothing held, after which the writer gives its free heap
#: back to the system (`malloc_trim`): its memory after a burst is not kept for good.
TRIM_IDLE: Final = 5.0
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)

# The writer process imports only what it needs: `aa.router`'s __init__ would import the
# whole router (the store's SQLAlchemy, the pattern engine: time and memory at every start). So the
# router package and this room are entered as bare ones, their modules found on their
# folders' paths.
_BOOT: Final = """\
import importlib.machinery, importlib.util, json, sys
sys.path[:] = json.loads(sys.argv[1])
import aa
def bare(name, folder):
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    package = importlib.util.module_from_spec(spec)
    package.__path__ = [folder]
    sys.modules[name] = package
    return package
aa.router = bare("aa.router", sys.argv[2].rsplit("/", 1)[0])
aa.router.eventlog = bare("aa.router.eventlog", sys.argv[2])
from aa.router.eventlog.process import child_main
child_main(int(sys.argv[3]))
"""

_ZERO: Final = (0, 0, 0, 0, 0)  # rows, files, deleted, dropped, errors


class WriterProcess:
    """The router's side of the writer process. Every method but the counters runs on the
    log's executor thread. Never raises for the writer's failures: they are counted and
    logged."""

    def __init__(self, root: Path, router: str, config: EventLogConfig, clock: Callable[[], float]):
        self.root, self.router, self.config, self.clock = root, router, config, clock
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._earlier: tuple[int, ...] = _ZERO  # the counters of writer processes that ended
        self._totals: tuple[int, ...] = _ZERO  # their sum: replaced whole, read from any thread
        self._lost_rows = self._lost_errors = 0  # on our side of the socket
        self._waiting = 0  # rows the running writer held at its last answer
        self._died_at: float | None = None

    @property
    def rows(self) -> int:
        return self._totals[0]

    @property
    def files(self) -> int:
        return self._totals[1]

    @property
    def deleted(self) -> int:
        return self._totals[2]

    @property
    def dropped(self) -> int:
        return self._totals[3] + self._lost_rows

    @property
    def errors(self) -> int:
        return self._totals[4] + self._lost_errors

    @property
    def waiting(self) -> int:
        """Rows the writer process holds, not yet written (as of its last answer)."""
        return self._waiting

    @property
    def pid(self) -> int | None:
        """The writer process's id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def scan(self) -> None:
        if self._conn is None:
            self._start(0)  # which scans
        else:
            self._call("scan", 0)

    def write(self, chunks: list[Chunk]) -> None:
        self._call("write", sum(c[1] for c in chunks), chunks)

    def close(self) -> None:
        self._call("close", 0)

    def maintain(self) -> None:
        self._call("maintain", 0)

    def stop(self) -> None:
        """Have the writer close its file and exit (it is started again if called again)."""
        if self._conn is not None:
            self._call("stop", 0)
        self._end()

    def _call(self, command: str, rows: int, *args: Any) -> None:
        if self._conn is None and not self._start(rows):
            return
        assert self._conn is not None
        try:
            self._conn.send((command, self.clock(), args))
            counters, records = self._conn.recv()
        except Exception as exc:  # OSError, EOFError: it died; anything else: our bug
            held, self._waiting = self._waiting, 0  # what it held died with it
            self._lost(
                rows + held,
                f"lost the writer process ({exc!r})",
                exc_info=not isinstance(exc, (OSError, EOFError)),
            )
            self._end()
            return
        counters, self._waiting = counters[:5], counters[5]
        self._totals = tuple(e + c for e, c in zip(self._earlier, counters))
        for level, text in records:
            log.log(level, "%s", text)

    def _lost(self, rows: int, why: str, *, exc_info: bool = False) -> None:
        self._lost_rows += rows
        self._lost_errors += 1
        self._died_at = self.clock()
        log.error("event log: %s; %d rows dropped", why, rows, exc_info=exc_info)

    def _start(self, rows: int) -> bool:
        if self._died_at is not None and 0 <= self.clock() - self._died_at < RESTART_DELAY:
            self._lost_rows += rows
            if rows:
                log.error(
                    "event log: no writer process (restarted %g s after it died); %d rows dropped",
                    RESTART_DELAY,
                    rows,
                )
            return False
        try:
            ours, theirs = socket.socketpair()
        except OSError as exc:
            self._lost(rows, f"cannot start the writer process ({exc})")
            return False
        try:
            argv = [
                sys.executable,
                "-c",
                _BOOT,
                json.dumps(sys.path),
                str(Path(__file__).parent),
                str(theirs.fileno()),
            ]
            self._proc = subprocess.Popen(
                argv,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except Exception as exc:  # OSError: no such interpreter, out of processes
            ours.close()
            self._lost(rows, f"cannot start the writer process ({exc})")
            return False
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        # Rows of the command that started it are counted once, by whichever of these fails.
        self._call("init", rows, str(self.root), self.router, self.config)
        if self._conn is not None:
            self._call("scan", rows)  # a new writer continues the numbering, removes leftovers
        return self._conn is not None

    def _end(self) -> None:
        conn, proc = self._conn, self._proc
        self._conn = self._proc = None
        self._earlier = self._totals
        if conn is not None:
            conn.close()  # the writer sees the end of its input: it closes its file, exits
        if proc is not None:
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                log.error("event log: the writer process does not stop; killing it")
                proc.kill()
                proc.wait()


class _Records(logging.Handler):
    """Keeps the writer process's log records for its next answer."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        self.records.append((record.levelno, text))

    def take(self) -> list[tuple[int, str]]:
        out, self.records = self.records, []
        return out


class _Write(NamedTuple):
    """The rows of one ``write`` command, held."""

    chunks: list[Chunk]
    rows: int
    bytes: int
    logged: float  # when its first rows were logged (the log's clock)


class _Held:
    """The rows the writer process holds, oldest first: one entry per ``write``."""

    def __init__(self) -> None:
        self._writes: deque[_Write] = deque()
        self.rows = self.bytes = 0

    def __bool__(self) -> bool:
        return bool(self._writes)

    def add(self, chunks: list[Chunk]) -> None:
        w = _Write(chunks, sum(c[1] for c in chunks), sum(len(c[2]) for c in chunks), chunks[0][0])
        self._writes.append(w)
        self.rows += w.rows
        self.bytes += w.bytes

    def write_oldest(self, writer: Writer) -> None:
        chunks, rows, size, _ = self._writes.popleft()
        self.rows -= rows
        self.bytes -= size
        try:
            writer.write(chunks)  # counts and logs what it cannot write
        except Exception:  # never expected: a bug; the rows are counted, the writer goes on
            writer.errors += 1
            writer.dropped += rows
            log.error("event log: writing %d held rows failed", rows, exc_info=True)

    def write_due(self, writer: Writer, now: float) -> None:
        """Write the oldest rows while more than ``defer_bytes`` are held, or the oldest were
        logged ``defer_seconds`` before *now* or earlier."""
        config = writer.config
        while self._writes and (
            self.bytes > config.defer_bytes or self._writes[0].logged <= now - config.defer_seconds
        ):
            self.write_oldest(writer)

    def write_all(self, writer: Writer) -> None:
        while self._writes:
            self.write_oldest(writer)


def _tune_malloc() -> Callable[[], None]:
    """Set the writer process's malloc thresholds; returns the call that trims the heap
    (nothing where the C library is not glibc)."""
    if platform.libc_ver()[0] != "glibc":
        return lambda: None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):
        return lambda: None
    return lambda: libc.malloc_trim(0)


def child_main(fd: int) -> None:
    """The writer process: answer commands until "stop" or the end of input."""
    from .writer import Writer  # pyarrow: loaded here, in the writer process only

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the router says when to stop
    try:
        os.nice(WRITER_NICE)
    except OSError:
        pass
    gc.collect()
    gc.freeze()  # what was imported is never garbage
    gc.set_threshold(*GC_THRESHOLD)
    trim = _tune_malloc()
    records = _Records()
    logger = logging.getLogger("aa.router.eventlog")
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    conn = Connection(fd)
    now = [0.0]
    writer: Writer | None = None
    held = _Held()
    paused = False  # no command for defer_pause seconds: writing what is held, until one comes
    busy = False  # a command or a write since the last trim
    while True:
        if (
            held
            and writer is not None
            and not conn.poll(0 if paused else writer.config.defer_pause)
        ):
            paused = busy = True
            held.write_oldest(writer)  # the router paused: write what it sent meanwhile
            continue
        if busy and not held and not conn.poll(TRIM_IDLE):
            trim()  # idle: give the heap's free pages back, then wait for the next command
        busy = True
        paused = False
        try:
            command, now[0], args = conn.recv()
        except (EOFError, OSError):
            command, args = "stop", ()  # the router is gone: close the file, end
        try:
            if command == "init":
                root, router, config = args
                writer = Writer(Path(root), router, config, lambda: now[0])
            elif writer is None:
                raise RuntimeError(f"{command!r} before 'init'")
            elif command == "write":
                held.add(*args)
                held.write_due(writer, now[0])
            elif command == "maintain":
                held.write_due(writer, now[0])
                writer.maintain()
            elif command in ("close", "stop"):
                held.write_all(writer)
                writer.close()
            elif command == "scan":
                writer.scan()
            else:
                raise RuntimeError(f"unknown command {command!r}")
        except Exception:
            if writer is not None:
                writer.errors += 1
            logger.error("event log: %s failed", command, exc_info=True)
        counters = (
            (*_ZERO, 0)
            if writer is None
            else (
                writer.rows,
                writer.files,
                writer.deleted,
                writer.dropped,
                writer.errors,
                held.rows,
            )
        )
        try:
            conn.send((counters, records.take()))
        except OSError:
            pass
        if command == "stop":
            conn.close()
            os._exit(0)  # nothing else to tear down; skip interpreter shutdown
