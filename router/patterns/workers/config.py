"""The worker tier's caps and its configuration. Each cap bounds something a subscriber
controls, with its unit and the reason for its value."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import Final

from aa.mesh import UsageError

__all__ = [
    "WorkerConfig",
    "lock_down",
    "MAX_BATCH_EVENTS",
    "MAX_BACKLOG_EVENTS",
    "MAX_REPLY_BYTES",
    "MAX_STOP_MESSAGE",
    "PRECHECK_MAX_SOURCE",
    "WATCH_INTERVAL",
]

#: Most events in one batch sent to a worker. Big enough that the pipe's per-frame cost
#: vanishes, small enough that one batch's reply is a few milliseconds of the router's loop.
MAX_BATCH_EVENTS: Final = 256

#: Events that may wait for one worker (not yet sent). A worker that falls this far behind
#: drops the newest events, counted and noticed to its subscribers: about 5 MB of typical
#: events per worker, and seconds of traffic, never unbounded memory in the router.
MAX_BACKLOG_EVENTS: Final = 20_000

#: Largest reply frame a worker may send (deliveries and derived events of one batch), in
#: bytes. A bigger one is a broken worker: it is killed. Each pattern run is capped far
#: below (`limits.MAX_DERIVED_TOTAL_BYTES`), so only a batch of many heavy patterns gets near.
MAX_REPLY_BYTES: Final = 64 * 1024 * 1024

#: Longest stop message sent to a subscriber, in characters: a message that quotes pattern
#: data (a huge attribute name) must not outgrow the frame cap or the subscriber's screen.
MAX_STOP_MESSAGE: Final = 500

#: Pattern sources up to this many characters are also compiled in the router at subscribe
#: time (about 8 µs per character: at most ~5 ms), so a bad pattern is refused at once, as
#: an error to the subscribe. Longer sources are compiled only in the worker, under its
#: deadline; a refusal then comes as a stop (`pattern-compile`/`pattern-refused`).
PRECHECK_MAX_SOURCE: Final = 512

#: Seconds between two looks of the router's watchdog at busy workers.
WATCH_INTERVAL: Final = 0.01


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """How many worker processes run patterns, and the limits the OS and the router enforce
    on them.

    >>> WorkerConfig(workers=2).kill_after
    0.04

    Raises `UsageError` for a value out of its range.
    """

    #: Worker processes sharing the worker-tier patterns (plus one warm spare).
    workers: int = 2
    #: Worker processes for new patterns (probation: `probation.py`); None: as many as
    #: `workers`; 0: none (new patterns go straight to the regular workers).
    probation_workers: int | None = None
    #: Events a pattern runs on probation, and seconds it spends there at least, before it
    #: moves to a regular worker.
    probation_events: int = 100
    probation_seconds: float = 1.0
    #: Seconds of wall time one evaluation (or one batch's compile) may run before the
    #: router's watchdog looks at the worker's CPU clock; it is killed once the call has
    #: also burnt `kill_cpu` seconds of CPU past that point (so a descheduled worker on a
    #: busy machine is not killed for the machine's sake).
    kill_after: float = 0.04
    #: CPU seconds of confirmation past `kill_after` (see there). More than the pattern
    #: time budget's 20 ms plus one 10 ms clock tick of /proc's CPU figures, so a loop the
    #: sandbox's ticks stop in time is never killed instead.
    kill_cpu: float = 0.03
    #: Seconds one compilation may take in a worker (a 64 KB script takes ~0.5 s).
    compile_deadline: float = 2.0
    #: Address space one worker may use beyond what it holds after start-up, in bytes
    #: (RLIMIT_AS): past it allocations fail and the pattern running is stopped.
    memory: int = 512 * 1024 * 1024
    #: CPU seconds a client's patterns may use at once beyond their share of a busy worker
    #: (and again as debt before they are stopped): see the package docstring. With the
    #: 20 ms evaluation budget, another client on the worker waits at most ~80 ms of CPU.
    client_burst: float = 0.03
    #: Seconds a spare worker may take to start before it counts as failed.
    start_timeout: float = 20.0

    def __post_init__(self) -> None:
        if (
            isinstance(self.workers, bool)
            or not isinstance(self.workers, int)
            or not 1 <= self.workers <= 64
        ):
            raise UsageError(f"workers must be an int in 1..64, not {self.workers!r}")
        p = self.probation_workers
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 64):
            raise UsageError(f"probation_workers must be None or an int in 0..64, not {p!r}")
        if (
            isinstance(self.probation_events, bool)
            or not isinstance(self.probation_events, int)
            or self.probation_events < 1
        ):
            raise UsageError(f"probation_events must be an int >= 1, not {self.probation_events!r}")
        for name in (
            "kill_after",
            "kill_cpu",
            "compile_deadline",
            "client_burst",
            "start_timeout",
            "probation_seconds",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 60:
                raise UsageError(f"{name} must be seconds in (0, 60], not {v!r}")
        if (
            isinstance(self.memory, bool)
            or not isinstance(self.memory, int)
            or self.memory < 32 * 1024 * 1024
        ):
            raise UsageError(f"memory must be an int of bytes >= 32 MiB, not {self.memory!r}")

    @property
    def probation_count(self) -> int:
        """Probation workers (`probation_workers`, None meaning as many as `workers`)."""
        return self.workers if self.probation_workers is None else self.probation_workers


def lock_down(memory: int) -> None:
    """Close every descriptor but the pipe, then set the OS limits (`child.py`'s docstring)."""
    try:
        os.close(2)
    except OSError:
        pass
    os.closerange(3, 65536)
    here = _address_space()
    limits = [
        (resource.RLIMIT_AS, here + memory),
        (resource.RLIMIT_NOFILE, 2),
        (resource.RLIMIT_FSIZE, 0),
        (resource.RLIMIT_CORE, 0),
    ]
    if os.geteuid() != 0:
        limits.append((resource.RLIMIT_NPROC, 0))
    for which, value in limits:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass  # a limit the platform refuses; the others still hold


def _address_space() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
