"""Awaiting what has no event of its own, with a timeout (tests never sleep to wait)."""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Await a condition that has no event of its own (a counter in another component),
    re-checking every few milliseconds and failing after *timeout* seconds. Tests that can
    await a future or a queue do that instead."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
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


async def next_event(sub: Any, timeout: float = 5.0) -> Any:
    """The next event of a subscription, or fail after *timeout* seconds."""
    async with asyncio.timeout(timeout):
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
