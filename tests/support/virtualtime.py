"""An event loop whose clock moves only when it has nothing to do: a test of timers runs on
it in no real time and reads exact instants, whatever the machine's load.

When no callback is ready, the loop jumps its clock to its next timer instead of sleeping.
It is for code whose waits are timers and other tasks: a socket or a thread that has not
answered yet does not hold the clock back, so a timer pending beside it (a timeout) fires at
once. With no timer at all, the loop waits for I/O as usual. ``virtual_time(main())`` runs a
coroutine on such a loop (as `asyncio.run` does) and returns its result."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualTimeLoop", "virtual_time"]

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Polls; where the loop would then sleep until its next timer, moves the clock there."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        ready: list[tuple[Any, int]] = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only I/O can wake the loop
            return super().select(None)  # type: ignore[no-any-return]
        self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """`time()` is virtual seconds from 0, moved only by the loop's waits for timers."""

    def __init__(self) -> None:
        self._jumping = _JumpingSelector()
        super().__init__(self._jumping)

    def time(self) -> float:
        return self._jumping.now


def virtual_time(main: Coroutine[Any, Any, T]) -> T:
    """Run *main* on a `VirtualTimeLoop` and return its result."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
