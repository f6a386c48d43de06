"""Events waiting for a reader: what an iterated subscription holds, on either side of the
wire (`aa.client.AsyncSubscription`, `aa.router.LocalSubscription`).

Bounded: past `MAX_QUEUED_EVENTS` the oldest event is dropped and counted, so a reader that
stopped reading costs bounded memory and never slows the sender. Closable with a reason:
once closed, readers get what is still queued, then the reason (`ConnectionClosed`, or the
error given, e.g. the `PatternError` of a pattern the router stopped).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final

from .errors import AaError, ConnectionClosed
from .event import Event

__all__ = ["EventQueue", "MAX_QUEUED_EVENTS"]

#: Events one reader may fall behind before the oldest are dropped: at a brisk 1,000 events/s,
#: a reader may stall for over a minute and lose nothing.
MAX_QUEUED_EVENTS: Final = 100_000

_CLOSED: Final = None  # the end-of-stream marker in the queue


class EventQueue:
    """A bounded, closable queue of events with async iteration.

    >>> import asyncio
    >>> async def demo():
    ...     q = EventQueue(maxsize=2)
    ...     for i in range(3):
    ...         q.put(Event(values={"i": i}))
    ...     q.close()
    ...     return [e.values["i"] async for e in q], q.dropped
    >>> asyncio.run(demo())
    ([1, 2], 1)
    """

    __slots__ = ("maxsize", "dropped", "error", "_queue", "_closed")

    def __init__(self, maxsize: int = MAX_QUEUED_EVENTS) -> None:
        self.maxsize = maxsize
        #: Events dropped because the reader fell behind.
        self.dropped = 0
        #: Why the queue was closed, if for a reason other than an orderly end.
        self.error: AaError | None = None
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._closed = False

    def put(self, event: Event) -> None:
        """Queue *event* (dropping the oldest if full); ignored once closed."""
        if self._closed:
            return
        queue = self._queue
        if queue.qsize() >= self.maxsize:
            queue.get_nowait()
            self.dropped += 1
        queue.put_nowait(event)

    def close(self, error: AaError | None = None) -> None:
        """End the stream: readers get what is queued, then *error* or `ConnectionClosed`."""
        if not self._closed:
            self._closed = True
            self.error = error
            self._queue.put_nowait(_CLOSED)

    @property
    def closed(self) -> bool:
        return self._closed

    def qsize(self) -> int:
        """Events waiting (the end-of-stream marker not counted)."""
        return self._queue.qsize() - (1 if self._closed else 0)

    async def get(self) -> Event:
        """The next event. Raises the closing error, or `ConnectionClosed`, once drained."""
        event = await self._queue.get()
        if event is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # every later reader learns it too
            raise self.error or ConnectionClosed("subscription is closed")
        return event

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.get()
        except ConnectionClosed:
            raise StopAsyncIteration from None
