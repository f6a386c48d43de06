"""The per-evaluation budget of the sandbox: the deadline, the allocation total, the call
depth, and the one exception that stops a pattern.

How a runaway pattern is stopped
--------------------------------
The pattern's code is rewritten (see `compiler.py`) so that every loop iteration, every
comprehension step and every call of a function the pattern defines calls `tick()`. `tick`
compares `time.perf_counter()` with the evaluation's deadline and, once it has passed, raises
`SandboxStop`. Three properties make that exception unstoppable from inside the pattern:

1. `SandboxStop` derives from `BaseException`, not `Exception`, and the pattern never gets a
   name for it: every `except` clause of a pattern goes through `except_filter`, which turns
   a bare `except:`, `except BaseException` (however it was spelled or obtained, e.g. through
   `ValueError.mro()[-2]`) into `except Exception`.
2. The stop is *sticky*: once a violation is recorded, the deadline is set to -inf, so every
   later tick raises again. A `finally:` that loops, or a `return` in a `finally:` that
   swallows the exception, gets stopped at its next tick.
3. After the evaluation returns, the engine checks `violation` anyway, so a stop that was
   swallowed and followed by straight-line code still stops the pattern.

The wall clock is cheap (about 45 ns) but counts time the router was descheduled or busy
elsewhere; before stopping a pattern for time, `tick` confirms with the thread's CPU clock
(about 600 ns, so it is read once at the start of scripts and looping expressions, and once
more only when the wall clock says the budget is gone). Garbage collection that happens to
run during an evaluation is not charged to it: a full pass over a big router's heap takes
tens of milliseconds to seconds (at a million subscriptions) and would stop whichever
innocent pattern was running; `gc.callbacks` total the collector's CPU time, and the
budget subtracts what was spent during the evaluation. A hostile pattern gains little by
making garbage: a young pass walks what was allocated since the last one, in time of the
order of allocating it, which is the pattern's own; the older passes come once per twenty
young ones and more rarely still, and its memory guards bound what it can keep.

What ticks cannot stop: one long call into C (sorting a million big equal strings, a
catastrophic regular expression, `statistics` over a million items) runs to its end; the
pattern is stopped right after it returns, and the guards in `guards.py` keep the size of
what such calls work on bounded.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = [
    "Budget",
    "SandboxStop",
    "TIMEOUT",
    "MEMORY",
    "FORBIDDEN",
]

#: The pattern used more than its time budget.
TIMEOUT = "pattern-timeout"
#: The pattern tried to build something too large, recurse too deep, or keep too much state.
MEMORY = "pattern-memory"
#: The pattern tried something the sandbox does not allow (private attributes, str.format...).
FORBIDDEN = "pattern-forbidden"

_perf = time.perf_counter
try:
    _cpu: Callable[[], float] = time.thread_time
    _cpu()
except (AttributeError, OSError):  # pragma: no cover - platforms without a thread clock
    _cpu = time.process_time


class SandboxStop(BaseException):
    """The pattern broke a sandbox rule; it is stopped. Never visible to pattern code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


#: CPU seconds the collector has spent in this process, in total (its passes run in the
#: thread whose allocation set them off: the evaluating thread, during an evaluation).
_GC_CPU = [0.0]
#: When the pass under way started (thread CPU), or None between passes.
_GC_STARTED: list[float | None] = [None]


def _note_collection(phase: str, info: dict[str, Any]) -> None:
    # (An XPath evaluation's profile hook sees this callback's calls and may check the
    # deadline inside it: `_collected` counts the pass under way too.)
    if phase == "start":
        _GC_STARTED[0] = _cpu()
    else:
        started, _GC_STARTED[0] = _GC_STARTED[0], None
        if started is not None:
            _GC_CPU[0] += _cpu() - started


def _collected() -> float:
    """The collector's CPU seconds so far, the pass under way included."""
    started = _GC_STARTED[0]
    return _GC_CPU[0] if started is None else _GC_CPU[0] + _cpu() - started


gc.callbacks.append(_note_collection)


class Budget:
    """The running evaluation's budget. One per engine; the engine is single-threaded, and
    evaluations do not nest (a pattern cannot call another)."""

    __slots__ = (
        "limit",
        "deadline",
        "cpu_start",
        "gc_start",
        "violation",
        "allocated",
        "max_allocation",
        "depth",
    )

    def __init__(self, limit: float, max_allocation: int) -> None:
        #: Seconds one evaluation may run.
        self.limit = limit
        #: perf_counter() value after which `tick` checks the CPU clock; -inf once stopped.
        self.deadline = float("-inf")
        self.cpu_start = 0.0
        #: `_GC_CPU` at the start: the collector's time since is not the pattern's.
        self.gc_start = 0.0
        #: The first violation of this evaluation, or None.
        self.violation: SandboxStop | None = None
        #: Elements charged by guarded operations in this evaluation.
        self.allocated = 0
        self.max_allocation = max_allocation
        #: Current nesting of calls to pattern-defined functions.
        self.depth = 0

    def start(self, limit: float | None = None) -> None:
        """Begin an evaluation (or a compilation, with its own *limit*)."""
        self.violation = None
        self.allocated = 0
        self.depth = 0
        self.cpu_start = _cpu()
        self.gc_start = _GC_CPU[0]
        self.deadline = _perf() + (self.limit if limit is None else limit)

    def start_untimed(self) -> None:
        """Begin an evaluation of code that cannot loop: only the sticky state is reset."""
        self.violation = None
        self.allocated = 0
        self.depth = 0

    def stop(self, code: str, message: str) -> NoReturn:
        """Record a violation (the first one wins) and raise it; later ticks re-raise it."""
        if self.violation is None:
            self.violation = SandboxStop(code, message)
        self.deadline = float("-inf")
        raise self.violation

    def raise_violation(self) -> NoReturn:
        """Raise the violation recorded: after a stop, or once `overran` said True."""
        assert self.violation is not None
        raise self.violation

    def expired(self) -> None:
        """Called by `tick` when the wall clock passed the deadline: stop, unless CPU time
        says the evaluation was merely descheduled, in which case the deadline moves."""
        if self.violation is not None:
            raise self.violation
        used = _cpu() - self.cpu_start - (_collected() - self.gc_start)
        if used < self.limit:
            self.deadline = _perf() + (self.limit - used)
            return
        self.stop(TIMEOUT, f"pattern stopped: exceeded its time budget of {self.limit * 1000:g} ms")

    def overran(self) -> bool:
        """After an evaluation: did it run past its budget (e.g. in one long C call)?"""
        if _perf() <= self.deadline:
            return False
        try:
            self.expired()
        except SandboxStop:
            return True
        return False

    def charge(self, n: int) -> None:
        """Count *n* elements built by a guarded operation against the evaluation's total."""
        self.allocated += n
        if self.allocated > self.max_allocation:
            self.stop(
                MEMORY,
                f"pattern stopped: built more than {self.max_allocation:,} elements in one "
                "evaluation",
            )

    def make_tick(self) -> Callable[[], bool]:
        """The `_tick_` guard: True while in budget (so it can sit in a comprehension's `if`)."""
        perf = _perf
        budget = self

        def _tick_() -> bool:
            if perf() > budget.deadline:
                budget.expired()
            return True

        return _tick_
