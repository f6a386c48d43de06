"""Cost guards: how much CPU a piece of work takes, for the tests that hold an attack's
bound (a pattern that once froze a router for hours, advice that once took 52 s)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def cpu_seconds() -> Iterator[Callable[[], float]]:
    """CPU seconds this process spends in the block, read with the function it yields.

    Not wall time (CI once measured 0.5 s of it for 15 ms of work): another process's load does
    not count, and the cyclic collector is off inside, so a full collection of everything the
    suite has built so far is not billed to the guarded work. Compare with a bound far above
    the honest cost and far below the attack's."""
    enabled = gc.isenabled()
    gc.disable()
    start = time.process_time()
    spent: float | None = None
    try:
        yield lambda: spent if spent is not None else time.process_time() - start
    finally:
        spent = time.process_time() - start
        if enabled:
            gc.enable()
