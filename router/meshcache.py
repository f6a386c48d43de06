"""The mesh event cache (Å §4.5) — pure: no I/O, never written to disk.

Every router keeps the newest events it dispatched, in memory, for clients that ask for
them ("what did I miss?"). It differs from the persistent store in four ways (Å §4.5):
cached events are only returned when asked for, never replayed with a subscription;
publishers cannot set its expiry, only opt out (meta ``mesh_cache: False``, see
`aa.router.policy.wants_mesh_cache`); it lives in memory only; and it is opt-out.

Bounds: at most `max_events` events and about `max_bytes` bytes; the oldest go first. The
byte count is an estimate of the Python objects' size (`approx_size`), cheap enough to take
on every event; it is there so that a few huge events cannot hold the router's memory when
the count bound alone would let them. It is taken from the values' msgpack encoding (done
in C: under a microsecond for a typical event, a third of walking the values in Python, which
mattered at 50,000 events/s) plus a fixed cost per top-level item for the Python objects.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime, timezone
from typing import Any, Callable, Final

import msgpack

from aa.mesh import Event, UsageError

from .policy import event_time

__all__ = ["MeshCache", "approx_size", "MESH_CACHE_MAX_EVENTS", "MESH_CACHE_MAX_BYTES"]

#: Default bound on cached events. At a typical 0.5 KiB per event, 10 MiB; at 1,000
#: events/s, the last ten seconds or so, enough for a client that blinked.
MESH_CACHE_MAX_EVENTS: Final = 20_000
#: Default bound on the cache's estimated memory, in bytes (32 MiB): a router runs on small
#: machines too, and the cache is a convenience, not a guarantee.
MESH_CACHE_MAX_BYTES: Final = 32 * 1024 * 1024

# Estimated sizes of CPython objects, in bytes (64-bit builds), for `approx_size`.
_EVENT_OVERHEAD: Final = 200  # the Event, its two dicts, the id string
_STR_OVERHEAD: Final = 50
_SCALAR: Final = 32
_CONTAINER: Final = 64
_SLOT: Final = 8


def _size(v: Any) -> int:
    t = type(v)
    if t is str or t is bytes:
        return _STR_OVERHEAD + len(v)
    if t is dict:
        return _CONTAINER + sum(_STR_OVERHEAD + len(k) + _SLOT * 2 + _size(x) for k, x in v.items())
    if t is list or t is tuple:
        return _CONTAINER + sum(_SLOT + _size(x) for x in v)
    return _SCALAR


#: Estimated Python overhead of one top-level value or meta item beyond its encoded bytes:
#: the key string, the dict slot and the value object.
_ITEM: Final = 100
_packer = msgpack.Packer(use_bin_type=True, datetime=True, default=lambda _obj: 0)


def approx_size(event: Event) -> int:
    """About how many bytes of memory *event* holds (values, meta, type, id)."""
    values, meta = event.values, event.meta
    try:
        encoded = len(_packer.pack(values)) + len(_packer.pack(meta))
    except Exception:  # not msgpack-able (never for checked events): walk it instead
        _packer.reset()
        return _EVENT_OVERHEAD + _size(values) + _size(meta) + len(event.type or "")
    return _EVENT_OVERHEAD + _ITEM * (len(values) + len(meta)) + encoded + len(event.type or "")


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class MeshCache:
    """The newest dispatched events, bounded by count and estimated bytes.

    >>> cache = MeshCache(max_events=2)
    >>> for i in range(3):
    ...     cache.add(Event(values={"i": i}, id=f"e{i}"))
    >>> [e.values["i"] for e in cache.query()]
    [1, 2]

    `add` is O(1) (amortised: each event is evicted once); `query` walks the cache.
    """

    __slots__ = ("max_events", "max_bytes", "_items", "_bytes", "_clock")

    def __init__(
        self,
        *,
        max_events: int = MESH_CACHE_MAX_EVENTS,
        max_bytes: int = MESH_CACHE_MAX_BYTES,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        if type(max_events) is not int or max_events < 1:
            raise UsageError(f"max_events must be a positive int, not {max_events!r}")
        if type(max_bytes) is not int or max_bytes < 1:
            raise UsageError(f"max_bytes must be a positive int, not {max_bytes!r}")
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._clock = clock
        #: (event time, event, estimated size), oldest first (in the order added).
        self._items: deque[tuple[datetime, Event, int]] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        """The estimated memory the cached events hold."""
        return self._bytes

    def add(self, event: Event, *, now: datetime | None = None) -> bool:
        """Cache *event*, evicting the oldest events past the bounds. Its time is its
        ``time`` stamp, or *now* (default: the clock) when it has none.

        Returns False (and caches nothing) for an event bigger than the whole byte bound.
        The caller checks `wants_mesh_cache(event)` first.
        """
        size = approx_size(event)
        if size > self.max_bytes:
            return False
        t = event_time(event)
        if t is None:
            t = now if now is not None else self._clock()
        items = self._items
        items.append((t, event, size))
        self._bytes += size
        while len(items) > self.max_events or self._bytes > self.max_bytes:
            self._bytes -= items.popleft()[2]
        return True

    def query(
        self,
        match: Callable[[Event], bool] | None = None,
        *,
        since: datetime | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Cached events that *match* accepts with a time at or after *since*, oldest first
        (in the order they were dispatched here); the first *limit* of them."""
        if limit is not None and (type(limit) is not int or limit < 0):
            raise UsageError(f"limit must be a non-negative int or None, not {limit!r}")
        out: list[Event] = []
        if limit == 0:
            return out
        for t, event, _ in self._items:
            if since is not None and t < since:
                continue
            if match is not None and not match(event):
                continue
            out.append(event)
            if limit is not None and len(out) >= limit:
                break
        return out

    def clear(self) -> None:
        """Forget every cached event."""
        self._items.clear()
        self._bytes = 0
