"""Progress of a mining run as one status line: an overall percentage, the current step,
and what Spark is doing in it (when one step runs; steps side by side show the
percentage alone)::

    aa mine  47% schema: stage 2/3, tasks 13/40 (12 s)

The run is a list of steps (`plan`: starting Spark, reading, then each task) with weights
from a profile of typical runs. The job says when a step begins and how many Spark
actions it takes (`Progress.begin`; tasks of a small log run side by side), and when each
action is done (`Progress.part_done`);
inside an action the share of finished tasks of Spark's active jobs (from its status
tracker) moves the percentage on. Starting Spark has no tracker: its share grows with the
seconds waited. The percentage never goes back.

On a terminal the line is rewritten in place (``\\r`` and erase to the end of the line);
otherwise a plain line is written when the step changes and at most every `every` seconds.
Other lines (the JVM's, see `aa.tools.mining.session`) go through `Progress.message`,
which clears the status line first. `Progress.poll` does the work of one tick and takes
`now`, so it is tested with a fake tracker and no thread.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, TextIO

__all__ = ["Progress", "StatusTracker", "plan", "STEP_WEIGHTS"]

#: Share of a run's time per step, from profiles of small and large logs on 2 cores
#: (starting Spark dominates a small log, the tasks a large one).
STEP_WEIGHTS: Final = {
    "start": 20.0,
    "read": 15.0,
    "schema": 25.0,
    "location": 15.0,
    "presence": 25.0,
}
#: Seconds of Spark's start after which its share is 63 % done (1 − 1/e).
_START_SECONDS: Final = 8.0


def plan(tasks: Sequence[str]) -> list[tuple[str, float]]:
    """The steps of a run of *tasks*, with their weights."""
    return [(s, STEP_WEIGHTS[s]) for s in ("start", "read", *tasks)]


class StatusTracker(Protocol):
    """The part of ``pyspark.StatusTracker`` used here."""

    def getActiveJobsIds(self) -> list[int]: ...
    def getJobInfo(self, jobId: int) -> Any: ...
    def getStageInfo(self, stageId: int) -> Any: ...


class Progress:
    """The status line of a run of *steps* (see `plan`).

    >>> with Progress(plan(["schema"])) as progress:
    ...     spark = open_session(...)
    ...     progress.tracker = spark.sparkContext.statusTracker()
    ...     run_mining(spark, config, progress=progress)
    """

    def __init__(
        self,
        steps: Sequence[tuple[str, float]],
        *,
        out: TextIO | None = None,
        tty: bool | None = None,
        interval: float = 0.5,
        every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = out if out is not None else sys.stderr
        self.tty = tty if tty is not None else _isatty(self.out)
        self.interval, self.every, self.clock = interval, every, clock
        self.tracker: StatusTracker | None = None
        total = sum(w for _, w in steps) or 1.0
        self._steps = [(name, w / total) for name, w in steps]
        self._state = {name: "pending" for name, _ in self._steps}
        #: Running steps: step -> [parts, parts done].
        self._running_steps: dict[str, list[int]] = {}
        if self._steps:
            self._state[self._steps[0][0]] = "running"
            self._running_steps[self._steps[0][0]] = [1, 0]
        self._begun = self._started = clock()
        self._shown = 0.0  # highest fraction shown: the line never goes back
        self._last = ("", -math.inf)  # (step, when) of the last plain line
        self._drawn = False  # a status line is on the terminal
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def step(self) -> str:
        """The running step(s), joined by "+"."""
        return "+".join(s for s, _ in self._steps if s in self._running_steps)

    def begin(self, step: str, parts: int = 1, *, alongside: bool = False) -> None:
        """*step* starts, in *parts* Spark actions; the steps running before it are done,
        unless it runs *alongside* them."""
        with self._lock:
            if not alongside:
                for name in list(self._running_steps):
                    self._finish(name)
            self._state[step] = "running"
            self._running_steps[step] = [max(1, parts), 0]
            self._begun = self.clock()

    def finish(self, step: str) -> None:
        """*step* is done."""
        with self._lock:
            self._finish(step)

    def _finish(self, step: str) -> None:
        self._running_steps.pop(step, None)
        self._state[step] = "done"

    def part_done(self, step: str | None = None) -> None:
        """One Spark action of *step* (default: the only running one) is done."""
        with self._lock:
            for name, counts in self._running_steps.items():
                if step is None or name == step:
                    counts[1] += 1
                    break

    def fraction(self, now: float, running: float | None = None) -> float:
        """How much of the run is done, 0 to 1 (*running*: share of the running action
        done, else asked of the tracker)."""
        share = (
            running
            if running is not None
            else (self._running()[0] if self.tracker is not None else 0.0)
        )
        total = 0.0
        for name, weight in self._steps:
            if self._state[name] == "done":
                total += weight
            elif name in self._running_steps:
                parts, done = self._running_steps[name]
                if name == "start":
                    inside = 1.0 - math.exp(-(now - self._begun) / _START_SECONDS)
                else:
                    inside = (done + share) / parts
                total += weight * min(inside, 0.99)
        self._shown = max(self._shown, total)
        return self._shown

    def _running(self) -> tuple[float, str]:
        """(share of the running action done, what it is doing) from Spark's tracker."""
        if self.tracker is None:
            return 0.0, ""
        try:
            jobs = [self.tracker.getJobInfo(j) for j in sorted(self.tracker.getActiveJobsIds())]
            stages = [
                (j, self.tracker.getStageInfo(s))
                for j in jobs
                if j is not None
                for s in sorted(j.stageIds)
            ]
        except Exception:  # the context is stopping: nothing to report
            return 0.0, ""
        known = [(j, s) for j, s in stages if s is not None]
        tasks = sum(s.numTasks for _, s in known)
        done = sum(s.numCompletedTasks for _, s in known)
        active = [
            (j, s) for j, s in known if s.numActiveTasks or 0 < s.numCompletedTasks < s.numTasks
        ]
        if not active:
            return (done / tasks if tasks else 0.0), ""
        job, info = active[-1]
        ids = sorted(job.stageIds)
        where = (
            f"stage {ids.index(info.stageId) + 1}/{len(ids)}, " if hasattr(info, "stageId") else ""
        )
        return (
            done / tasks if tasks else 0.0
        ), f": {where}tasks {info.numCompletedTasks}/{info.numTasks}"

    def render(self, now: float) -> str:
        """The status line."""
        share, detail = self._running()
        pct = self.fraction(now, share) * 100
        # Tasks side by side share Spark's tracker: one stage's count would jump between
        # theirs (and back); the percentage alone is their combined figure.
        detail = "" if self.step == "start" or len(self._running_steps) > 1 else detail
        label = "starting Spark" if self.step == "start" else self.step or "done"
        return f"aa mine {pct:3.0f}% {label}{detail} ({now - self._started:.0f} s)"

    def poll(self, now: float) -> str | None:
        """One tick: the status line, written if it is due (None if nothing was)."""
        with self._lock:
            line = self.render(now)
            if self.tty:
                self.out.write("\r" + line + "\x1b[K")
                self._drawn = True
            elif self.step != self._last[0] or now - self._last[1] >= self.every:
                self.out.write(line + "\n")
                self._last = (self.step, now)
            else:
                return None
            self.out.flush()
            return line

    def message(self, line: str) -> None:
        """Write *line* above the status line."""
        with self._lock:
            self.out.write(("\r\x1b[K" if self._drawn else "") + line + "\n")
            self._drawn = False
            self.out.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll(self.clock())
            except (OSError, ValueError):  # our stderr went away: stop drawing
                return

    def start(self) -> None:
        """Start drawing in a daemon thread."""
        if self._thread is None:
            self.poll(self.clock())
            self._thread = threading.Thread(target=self._run, name="aa-mine-progress", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop drawing (waits for the thread) and clear the status line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self._drawn:
                self.out.write("\r\x1b[K")
                self.out.flush()
                self._drawn = False

    def __enter__(self) -> Progress:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False
