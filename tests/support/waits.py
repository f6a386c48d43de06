"""Awaiting what has no event of its own, with a timeout (tests never sleep to wait)."""

from __future__ import annotations

import asyncio
import os
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any

#: Seconds `wait_for` and `next_event` wait when not told, on a machine with a core for each
#: runnable process; a busier one gets more (`patience`). Such a deadline only bounds how long
#: a failure takes to show: a test that claims a time passes its own timeout, left as it is.
DEFAULT_TIMEOUT = 5.0


def patience(seconds: float = DEFAULT_TIMEOUT) -> float:
    """*seconds* stretched by the machine's load: runnable processes per core over the last
    minute, when above one (at most six times)."""
    try:
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return seconds
    return seconds * min(6.0, max(1.0, per_core))


async def wait_for(predicate: Callable[[], bool], timeout: float | None = None) -> None:
    """Await a condition that has no event of its own (a counter in another component),
    re-checking every few milliseconds and failing after *timeout* seconds (`patience()` when
    not given). Tests that can await a future or a queue do that instead."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(patience() if timeout is None else timeout):
        while not predicate():
            tick = loop.create_future()
            loop.call_later(0.005, tick.set_result, None)
            await tick


@types.coroutine
def next_turn() -> Generator[None, None, None]:
    """Let every other ready task and callback of the loop run once, and come back on the
    next turn (a bare yield to the loop, not a wait of any length), for a test that
    feeds work in bursts or that measures how long the loop takes to come back to it."""
    yield


async def next_event(sub: Any, timeout: float | None = None) -> Any:
    """The next event of a subscription, or fail after *timeout* seconds (`patience()` when
    not given)."""
    async with asyncio.timeout(patience() if timeout is None else timeout):
        return await sub.get()


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], timeout: float = 5.0, every: float = 0.05
) -> None:
    """`wait_for` with a predicate that has to await (a store query), re-checked every
    *every* seconds."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        while not await predicate():
            tick = loop.create_future()
            loop.call_later(every, tick.set_result, None)
            await tick


def settle(
    read: Callable[[], Any], ok: Callable[[Any], bool], timeout: float, every: float = 0.1
) -> Any:
    """For blocking tests (a real process's /proc): re-read *read* every *every* seconds
    until *ok* holds or *timeout* passes, and return the last value for the caller to
    assert on (so a failure shows the value, not only "timed out")."""
    import threading
    import time

    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while True:
        value = read()
        if ok(value) or time.monotonic() > deadline:
            return value
        tick.wait(every)


async def paced(rate: float, count: int | None = None) -> AsyncIterator[tuple[int, float]]:
    """A load generator's clock, not a wait: yields (n, the loop time turn n was due) for
    *count* turns (None: no end), *rate* per second from now, on a fixed schedule (a late turn
    does not shift the ones after it). The caller publishes at each, or measures how late it
    came."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    n = 0
    while count is None or n < count:
        due = start + n / rate
        tick = loop.create_future()
        loop.call_at(due, tick.set_result, None)
        await tick
        yield n, due
        n += 1
