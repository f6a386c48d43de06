"""The mesh event cache (Å §4.5) — pure: no I/O, never written to disk.

Every router keeps the newest events it dispatched, in memory, for clients that ask for
them ("what did I miss?"). It differs from the persistent store in four ways (Å §4.5):
cached events are only returned when asked for, never replayed with a subscription;
publishers cannot set its expiry, only opt out (meta ``mesh_cache: False``, see
`aa.router.store.expiry.wants_mesh_cache`); it lives in memory only; and it is opt-out.

Bounds: at most `max_events` events and about `max_bytes` bytes; the oldest go first.

Events are kept *encoded* (msgpack, as on the wire), a batch of them per block, and decoded
only when a client asks. Why (every dispatched event goes through here):

- keeping the events' Python objects alive is costly per dispatched event: their memory is
  cold again by the time they are freed 20,000 events later; encoded, a typical event is a
  few hundred bytes of one `bytes` object instead of a couple of KiB of objects, and the
  byte count is exact rather than estimated;
- a batch (`add_many`, one C call for the whole batch the router dispatched in one go)
  costs a fraction per event of encoding one event at a time;
- events relayed from a peer are not encoded again at all: the cache keeps the bytes they
  came in (a flood group's blob, `aa.mesh.protocol.FloodGroup`), whose ``ttl`` and ``path``
  in each event's meta are the origin's, with this router's hop beside them (`add_many`'s
  *hop*), and a query sets each event's ttl and path from the hop as the relay did. Encoding
  them was a fifth of a relaying router's work.

A block is evicted event by event as far as the bounds go (its memory goes with its last
event, so the cache may hold one block more than the bounds until then). Adding a block
does nothing per event: a query decodes every block it holds and reads each event's time
from its meta there (20,000 events in tens of milliseconds): queries are rare, events are
not.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Final

from aa.mesh import META_PATH, META_TTL, Event, UsageError
from aa.mesh.protocol import pack_events, packed_event, unpack

__all__ = [
    "MeshCache",
    "approx_size",
    "encode_events",
    "MESH_CACHE_MAX_EVENTS",
    "MESH_CACHE_MAX_BYTES",
]

#: Default bound on cached events. At a typical 0.5 KiB per event, 10 MiB; at 1,000
#: events/s, the last ten seconds or so, enough for a client that blinked.
MESH_CACHE_MAX_EVENTS: Final = 20_000
#: Default bound on the cache's estimated memory, in bytes (32 MiB): a router runs on small
#: machines too, and the cache is a convenience, not a guarantee.
MESH_CACHE_MAX_BYTES: Final = 32 * 1024 * 1024

#: Bytes one cached event costs beyond its encoding: its time and list slots, its share of
#: the block.
_ENTRY_OVERHEAD: Final = 120


_Encoded = bytes  # (MeshCache.bytes hides the name inside the class)


def encode_events(events: Sequence[Event]) -> bytes | None:
    """*events* as the cache keeps a block of them: one msgpack array (`aa.mesh.protocol`) of
    ``[id, type, values, meta]``, from each event's own encoding (`packed_event`: made once
    and shared with the deliveries and floods of the event); None if one is outside the
    value model. The event log takes the same bytes (`aa.router.eventlog`)."""
    try:
        return pack_events(events)
    except UsageError:  # outside the value model (never for a checked event)
        return None


def approx_size(event: Event) -> int:
    """How many bytes of memory *event* takes in the cache (its encoding and its entry)."""
    try:
        return (
            _ENTRY_OVERHEAD + 1 + len(packed_event(event))
        )  # in a block of one: 1 byte of array header
    except UsageError:
        return _ENTRY_OVERHEAD


def _utcnow() -> datetime:
    return datetime.now(UTC)


#: A relayed block's hop: the ``ttl`` and ``path`` to set in each event's meta when read.
Hop = tuple[int, Sequence[str]]


class _Block:
    """Events added together: how many, their encoding, how many were evicted, the time of
    those without a ``time`` stamp, and the hop to set in their meta when read (None: their
    encoding holds their own). Their times are read from their encoding when a query asks:
    nothing is done per event when they are added."""

    __slots__ = ("count", "data", "start", "unit", "added", "hop")

    def __init__(self, count: int, data: bytes, added: datetime, hop: Hop | None = None) -> None:
        self.count = count
        self.data = data
        self.added = added
        self.hop = hop
        self.start = 0  # events before this index are evicted
        self.unit = _ENTRY_OVERHEAD + len(data) / count  # bytes per event, on average


class MeshCache:
    """The newest dispatched events, bounded by count and bytes, kept encoded.

    >>> cache = MeshCache(max_events=2)
    >>> for i in range(3):
    ...     cache.add(Event(values={"i": i}, id=f"e{i}"))
    >>> [e.values["i"] for e in cache.query()]
    [1, 2]

    `add` and `add_many` are O(events added) (each event is evicted once); `query` walks
    the cache.
    """

    __slots__ = ("max_events", "max_bytes", "_blocks", "_count", "_bytes", "_clock")

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
        self._blocks: deque[_Block] = deque()  # oldest first
        self._count = 0
        self._bytes = 0.0

    def __len__(self) -> int:
        return self._count

    @property
    def bytes(self) -> int:
        """The memory the cached events hold (their encodings and entries)."""
        return round(self._bytes)

    def add(self, event: Event, *, now: datetime | None = None) -> bool:
        """Cache *event*, evicting the oldest events past the bounds. Its time is its
        ``time`` stamp, or *now* (default: the clock) when it has none.

        Returns False (and caches nothing) for an event bigger than the whole byte bound.
        The caller checks `wants_mesh_cache(event)` first.
        """
        return self.add_many([event], now=now) == 1

    def add_many(
        self,
        events: Sequence[Event],
        *,
        now: datetime | None = None,
        encoded: _Encoded | None = None,
        hop: Hop | None = None,
    ) -> int:
        """Cache *events*, in order, as one block; how many were cached. An event's time is
        its ``time`` stamp, or *now* (default: the clock) when it has none. A batch bigger
        than the byte bound is cached one event at a time (what fits). *encoded*:
        `encode_events(events)`, when the caller has it already; or, with *hop* (ttl,
        path), the bytes the events came in from a peer, checked (a flood group's blob),
        which differ from *events* only in each meta's ``ttl`` and ``path``: *hop*'s."""
        if not events:
            return 0
        data = encoded if encoded is not None else encode_events(events)
        if data is None or _ENTRY_OVERHEAD * len(events) + len(data) > self.max_bytes:
            if len(events) == 1 and hop is None:
                return 0
            return sum(self.add_many([e], now=now) for e in events)
        n = len(events)
        added = now if now is not None else self._clock()
        block = _Block(n, data, added, None if hop is None else (hop[0], tuple(hop[1])))
        self._blocks.append(block)
        self._count += n
        self._bytes += block.unit * n
        self._evict()
        return n

    def _evict(self) -> None:
        blocks = self._blocks
        while self._count > self.max_events or self._bytes > self.max_bytes:
            oldest = blocks[0]
            live = oldest.count - oldest.start
            if self._count > self.max_events:
                k = min(live, self._count - self.max_events)
            else:
                k = min(live, max(1, int((self._bytes - self.max_bytes) // oldest.unit) + 1))
            oldest.start += k
            self._count -= k
            self._bytes -= k * oldest.unit
            if oldest.start >= oldest.count:
                blocks.popleft()
        if not blocks:
            self._bytes = 0.0

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
        trusted = Event.trusted
        for block in self._blocks:
            items = unpack(block.data)
            hop = block.hop
            for i in range(block.start, block.count):
                id_, type_, values, meta = items[i]
                if meta is None:  # a peer may send nil for an empty meta (relayed blocks)
                    meta = {}
                if since is not None:
                    t = meta.get("time")
                    if type(t) is not datetime or t.tzinfo is None:
                        t = block.added
                    if t < since:
                        continue
                if hop is not None:  # as the relay set them (`flood_events`)
                    meta[META_TTL] = hop[0]
                    meta[META_PATH] = list(hop[1])
                event = trusted(values, type_, meta, id_)
                if match is not None and not match(event):
                    continue
                out.append(event)
                if limit is not None and len(out) >= limit:
                    return out
        return out

    def clear(self) -> None:
        """Forget every cached event."""
        self._blocks.clear()
        self._count = 0
        self._bytes = 0.0
