"""Run-time errors of pattern code: counted per params bucket, told to its subscribers at
most once a `NOTICE_INTERVAL`, and a pattern that only errs stopped.

The rules (users read them in the docs' "debugging a pattern"):

- An error raised by pattern code is still an answer — an expression does not match, a
  script's run forwards nothing (`python_kernel.py`) — and it is now also *reported*: the
  exception's type and message, its line in the pattern's source, and how many runs raised
  since the last notice.
- A `NameError` for a name the pattern does not call is a value the event lacks: the normal
  case for a filter over events of many shapes. It is neither reported nor counted. A name
  the pattern *calls* (`foward()`) is a typo, since no event value can be called: reported.
  In an expression, a TypeError, AttributeError or KeyError is a value of another type,
  or a key the event lacks (`"hot" > 100`, `meta["site"]`): no match, not reported either.
  A script is a program: there they are bugs (`state["n"] += 1`), and reported.
- Notices are per bucket (its subscribers share pattern and params, so they share errors):
  the first at once, then at most one per `NOTICE_INTERVAL`, the runs that raised in
  between counted in the next.
- A bucket whose last `STOP_AFTER_ERRORS` runs all raised, with no clean run among them,
  only errs: it is stopped with code `pattern-errors` (the subscription ends, as for any
  other stop). A single clean run starts the count again.
- The predicate tier reports the same errors (`1 / Count` of a zero), but its clean runs
  are not tracked (that would cost every evaluation of a million subscriptions): it is
  never stopped for errors, and an expression there costs the router no pattern code.

Nothing here reads a clock: `due(now)` is given the time (monotonic seconds).
"""

from __future__ import annotations

import ast
from collections.abc import Hashable
from dataclasses import dataclass
from types import FunctionType
from typing import Any, Final

__all__ = [
    "RunErrors",
    "ErrorNotice",
    "NOTICE_INTERVAL",
    "STOP_AFTER_ERRORS",
    "ERRORS_CODE",
    "called_names",
    "NO_MATCH_IN_EXPRESSIONS",
]

#: Seconds between two notices to the same subscribers: a pattern raising on each of
#: thousands of events a second must not flood its subscriber (or the router's log).
NOTICE_INTERVAL: Final = 1.0
#: Consecutive runs that raised after which a pattern is stopped: at a few events a second
#: that is minutes of notices its author had; at a high rate it is a fraction of a second of
#: useless work saved each second for good.
STOP_AFTER_ERRORS: Final = 1000
#: The stop code of a pattern that only errs.
ERRORS_CODE: Final = "pattern-errors"
#: Longest error text and source line kept in a notice, in characters.
MAX_ERROR_TEXT: Final = 300
MAX_LINE_TEXT: Final = 200
#: The file name the compiler gives pattern code (`compiler.compile_python`).
PATTERN_FILE: Final = "<pattern>"

_ATOMS = (str, int, float, bool, bytes, type(None))
#: What an expression raises for an event whose values have other types or keys than it
#: expects (`Temperature > 100` of a text, `Sensor.startswith("lab")` of a number,
#: `meta["site"]` of an event without): the event is not one it is about, so no match, as
#: the docs promise, and nothing to tell.
NO_MATCH_IN_EXPRESSIONS: Final = (TypeError, AttributeError, KeyError)


@dataclass(frozen=True, slots=True)
class ErrorNotice:
    """What the subscribers of a pattern are told about its run-time errors."""

    #: The exception's type and message, e.g. ``KeyError: 'n'``.
    error: str
    #: Runs that raised since the last notice (this notice's first error included).
    count: int
    #: The line of the pattern's source it was raised on (1-based; 0: unknown) and its text.
    line: int = 0
    text: str = ""

    def where(self) -> str:
        """The error and where it was raised, without the count."""
        where = f"line {self.line}: {self.error}" if self.line else self.error
        return f"{where}  [{self.text}]" if self.text else where

    def __str__(self) -> str:
        times = "once" if self.count == 1 else f"{self.count:,} times"
        return f"{self.where()} ({times} since the last notice)"


class _Tally:
    __slots__ = ("count", "streak", "first", "sent")

    def __init__(self) -> None:
        self.count = 0  # runs that raised since the last notice
        self.streak = 0  # runs that raised since the last clean run
        self.first: ErrorNotice | None = None  # the window's first error (count not set)
        self.sent = -1e18  # when the last notice went (monotonic seconds)


class RunErrors:
    """The erring buckets of one engine (keyed by bucket object: anything hashable).

    Kernels call `failed(bucket, exc, source, called)` where they turn an error into "no
    match", and, after a clean run, reset the streak through `tallies` (empty, and so free,
    while nothing errs). The engine calls `due(now)` after each event while `tallies` is
    not empty."""

    __slots__ = ("tallies", "interval", "stop_after", "_wake", "_next")

    def __init__(
        self, *, interval: float = NOTICE_INTERVAL, stop_after: int = STOP_AFTER_ERRORS
    ) -> None:
        self.tallies: dict[Hashable, _Tally] = {}
        self.interval = interval
        self.stop_after = stop_after
        self._wake = False  # a notice or a stop is due at once
        self._next = 0.0  # no pending notice is due before this

    def failed(
        self,
        bucket: Hashable,
        exc: BaseException,
        source: str,
        called: Any,
        *,
        expression: bool = False,
        streak: bool = True,
    ) -> bool:
        """Count *exc*, raised by *bucket*'s run of *source*; *called* gives the names the
        source calls (`called_names`), asked only for a NameError. An *expression* does not
        apply to an event whose values have other types (`NO_MATCH_IN_EXPRESSIONS`). Without
        *streak* (the predicate tier, which does not report clean runs) the error is told
        but never stops the pattern. Returns False if it is not an error."""
        if type(exc) is NameError and getattr(exc, "name", None) not in called():
            return False
        if expression and isinstance(exc, NO_MATCH_IN_EXPRESSIONS):
            return False
        tally = self.tallies.get(bucket)
        if tally is None:
            tally = self.tallies[bucket] = _Tally()
        if streak:
            tally.streak += 1
        if tally.count == 0:
            tally.first = describe(exc, source)
            self._wake = True
        tally.count += 1
        if tally.streak >= self.stop_after:
            self._wake = True
        return True

    def clean(self, bucket: Hashable) -> None:
        """*bucket* ran without raising: its streak starts again."""
        tally = self.tallies.get(bucket)
        if tally is not None:
            tally.streak = 0

    def forget(self, bucket: Hashable) -> None:
        self.tallies.pop(bucket, None)

    def due(
        self, now: float
    ) -> tuple[list[tuple[Any, ErrorNotice]], list[tuple[Any, ErrorNotice]]]:
        """(notices due now, buckets to stop), each with its notice. Tallies with nothing
        left to tell are dropped once their interval is over."""
        if not self._wake and now < self._next:
            return [], []
        self._wake = False
        notices: list[tuple[Any, ErrorNotice]] = []
        stops: list[tuple[Any, ErrorNotice]] = []
        interval = self.interval
        soonest = now + interval
        for bucket, tally in list(self.tallies.items()):
            if tally.streak >= self.stop_after:
                del self.tallies[bucket]
                stops.append((bucket, _counted(tally)))
                continue
            if tally.count:
                if now - tally.sent >= interval:
                    notices.append((bucket, _counted(tally)))
                    tally.count, tally.first, tally.sent = 0, None, now
                else:
                    soonest = min(soonest, tally.sent + interval)
            elif tally.streak == 0 and now - tally.sent >= interval:
                del self.tallies[bucket]
        self._next = soonest
        return notices, stops


def _counted(tally: _Tally) -> ErrorNotice:
    first = tally.first or ErrorNotice(error="error", count=0)
    return ErrorNotice(error=first.error, count=tally.count, line=first.line, text=first.text)


def describe(exc: BaseException, source: str) -> ErrorNotice:
    """*exc* as a notice (count 0): its type and message, and the deepest line of pattern
    code in its traceback. The message is read only from plain arguments: an object the
    pattern made could run its own `__str__` outside the sandbox's budget."""
    name = type(exc).__name__
    if all(type(a) in _ATOMS for a in exc.args) and not isinstance(
        getattr(type(exc), "__str__", None), FunctionType
    ):
        try:
            text = str(exc)
        except Exception:
            text = ""
        error = f"{name}: {text}" if text else name
    else:
        error = name
    if len(error) > MAX_ERROR_TEXT:
        error = error[: MAX_ERROR_TEXT - 3] + "..."
    line = 0
    one_line = source.strip()
    if "\n" not in one_line:  # an expression (the predicate tier's closures have no lines)
        line = 1
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == PATTERN_FILE:
            line = tb.tb_lineno
        tb = tb.tb_next
    text = ""
    if line:
        lines = source.splitlines()
        if 0 < line <= len(lines):
            text = lines[line - 1].strip()
            if len(text) > MAX_LINE_TEXT:
                text = text[: MAX_LINE_TEXT - 3] + "..."
    return ErrorNotice(error=error, count=0, line=line, text=text)


def called_names(source: str) -> frozenset[str]:
    """The bare names *source* calls (`foward()`): a NameError for one of those is a typo,
    not a value the event lacks."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()
    return frozenset(
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    )
