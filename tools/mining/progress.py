"""Progress of a long mining run: a line per stage from Spark's status tracker.

A daemon thread polls ``SparkContext.statusTracker()`` every `interval` seconds and writes
lines such as::

    aa mine [location] job 7 stage 2/3: tasks 13/40 (2 running)

A line is written when a stage starts or ends, and otherwise at most every `every`
seconds while its task count moves, so a 10-minute job prints a few hundred lines, not
thousands. `Progress.poll` does the work of one tick and takes `now`, so it is tested with
a fake tracker and no thread.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Protocol, TextIO

__all__ = ["Progress", "StatusTracker"]


class StatusTracker(Protocol):
    """The part of ``pyspark.StatusTracker`` used here."""

    def getActiveStageIds(self) -> list[int]: ...
    def getActiveJobsIds(self) -> list[int]: ...
    def getJobInfo(self, jobId: int) -> Any: ...
    def getStageInfo(self, stageId: int) -> Any: ...


class Progress:
    """Writes a progress line per active stage of the running Spark jobs.

    >>> with Progress(spark.sparkContext.statusTracker()) as progress:
    ...     progress.label = "schema"
    ...     df.count()
    """

    def __init__(
        self,
        tracker: StatusTracker,
        *,
        out: TextIO | None = None,
        interval: float = 0.5,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tracker = tracker
        self.out = out if out is not None else sys.stderr
        self.interval = interval
        self.every = every
        self.clock = clock
        #: What the run is doing now, shown in brackets (set by the job between tasks).
        self.label = ""
        self._last: dict[int, tuple[str, float]] = {}  # stage -> (line, when written)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self, now: float) -> list[str]:
        """One tick: the lines to write now (also written to `out`)."""
        lines = []
        active: dict[int, str] = {}
        try:
            stage_ids = sorted(self.tracker.getActiveStageIds())
            jobs = [self.tracker.getJobInfo(j) for j in self.tracker.getActiveJobsIds()]
        except Exception:  # the context is stopping: nothing to report
            return []
        for sid in stage_ids:
            info = self.tracker.getStageInfo(sid)
            if info is None:
                continue
            job = next((j for j in jobs if j is not None and sid in j.stageIds), None)
            where = ""
            if job is not None:
                stages = sorted(job.stageIds)
                where = f"job {job.jobId} stage {stages.index(sid) + 1}/{len(stages)}"
            else:
                where = f"stage {sid}"
            running = f" ({info.numActiveTasks} running)" if info.numActiveTasks else ""
            label = f"[{self.label}] " if self.label else ""
            active[sid] = f"aa mine {label}{where}: tasks {info.numCompletedTasks}/{info.numTasks}{running}"
        for sid, line in active.items():
            prev = self._last.get(sid)
            if prev is None or (line != prev[0] and now - prev[1] >= self.every):
                lines.append(line)
                self._last[sid] = (line, now)
        for sid in list(self._last):
            if sid not in active:
                del self._last[sid]
        for line in lines:
            self.out.write(line + "\n")
        if lines:
            self.out.flush()
        return lines

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll(self.clock())

    def start(self) -> None:
        """Start polling in a daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="aa-mine-progress", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop polling (waits for the thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> "Progress":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
