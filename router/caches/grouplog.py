"""The log of one group of client caches (caches with the same pattern) and its members'
views over it — pure, no I/O; see `aa.router.caches.clientcaches` for the model (one shared
log per pattern, each cache a view: after its floor, newest max_count, within max_age) and
the order every router computes alike (time stamp, then id).

Drops (what a client is told it lost while away): an event a cache took, past its floor,
that left the cache unacknowledged because of its count or age limit. Counting them must
not cost per member on each event. A member's drops are of two kinds: entries still in the
group log but below the member's view (another member keeps them), found by bisection when
asked; and entries the group's head moved past. The head moves in mark order, so a member
notes, when its floor is set, the group's count of passed entries plus the entries at or
below its floor still ahead of the head (`passed_at`): every pass beyond that number is an
entry past its floor, a drop. Drops already below a new floor are kept in `lost` when the
floor moves, so the count only grows. It is exact for events that arrive in order; an event
arriving late with a mark at or below a floor (a clock far behind) may count once."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable
from typing import Final

from aa.mesh import Event

from ..store import ExpiryPolicy, event_time

__all__ = [
    "COMPACT_AT",
    "Entry",
    "Group",
    "Mark",
    "Member",
    "entry_mark",
    "entry_seq",
    "entry_time",
    "mark_of",
    "time_of",
]

#: A group log is compacted (its dead prefix deleted) once the prefix is this long and at
#: least half the list: amortised O(1) per event, no copy per trim.
COMPACT_AT: Final = 1024

#: A place in a cache's order: (time in seconds, length of the id, id).
Mark = tuple[float, int, str]
#: One log entry: (seq, time, length of the id, id, event); its mark is entry[1:4].
Entry = tuple[int, float, int, str, Event]


def mark_of(time_s: float, event_id: str) -> Mark:
    """The mark of the event *event_id* with time stamp *time_s* (see the module docstring)."""
    return (time_s, len(event_id), event_id)


class Group:
    """Caches whose patterns have the same key, and the log their pattern filled."""

    __slots__ = ("key", "matcher", "members", "log", "head", "keep", "max_age", "ids", "passed")

    def __init__(self, key: Hashable, matcher: Callable[[Event], bool]) -> None:
        self.key = key
        self.matcher = matcher
        self.members: dict[str, Member] = {}
        #: Entries in mark order, seqs increasing; live from `head` on.
        self.log: list[Entry] = []
        self.head = 0
        self.keep = 0  # entries the most demanding member may need
        self.max_age: float | None = None  # longest member age limit; None: some have none
        self.ids: set[str] = set()  # ids in the log (dead prefix included, until compacted)
        self.passed = 0  # entries the head has moved past, ever (members' drops count them)

    def retune(self, cap: int) -> None:
        keep = 0
        age: float | None = 0.0
        for c in self.members.values():
            keep = max(keep, min(c.policy.max_count or cap, cap))
            if age is not None:
                a = c.policy.max_age
                age = None if a is None else max(age, a.total_seconds())
        self.keep, self.max_age = keep, age

    def settle(self, now: float) -> None:
        """After an insertion: move `head` past what no member can return any more."""
        log = self.log
        head = max(self.head, len(log) - self.keep)
        if self.max_age is not None:
            oldest = now - self.max_age
            while head < len(log) and log[head][1] < oldest:
                head += 1
        self.passed += head - self.head
        self.head = head
        self._compact()

    def trim(self, now: float) -> None:
        """Drop entries no member can still return: acknowledged by all, or too old."""
        log = self.log
        head = self.head
        floors = [c.floor for c in self.members.values() if c.floor is not None]
        if len(floors) == len(self.members):  # every member acknowledged something
            head = bisect_right(log, min(floors), head, key=entry_mark)
        if self.max_age is not None:
            head = bisect_left(log, now - self.max_age, head, key=entry_time)
        self.passed += head - self.head
        self.head = head
        self._compact()

    def _compact(self) -> None:
        head = self.head
        if head >= COMPACT_AT and head * 2 >= len(self.log):
            self.ids.difference_update(e[3] for e in self.log[:head])
            del self.log[:head]
            self.head = 0


class Member:
    __slots__ = (
        "client_id",
        "group",
        "policy",
        "timeout",
        "last_seen",
        "floor",
        "lost",
        "passed_at",
    )

    def __init__(
        self,
        client_id: str,
        group: Group,
        policy: ExpiryPolicy,
        timeout: float,
        now: float,
        floor: Mark | None,
    ) -> None:
        self.client_id = client_id
        self.group = group
        self.policy = policy
        self.timeout = timeout
        self.last_seen = now
        #: Entries with a mark ≤ floor are not (or no longer) in this cache; None: no floor.
        self.floor = floor
        #: Drops below the floor, counted when it moved (module docstring).
        self.lost = 0
        #: The group's `passed` once the entries at or below the floor have passed too.
        self.passed_at = self._passed_at(floor)

    def _passed_at(self, floor: Mark | None) -> int:
        g = self.group
        below = 0 if floor is None else bisect_right(g.log, floor, g.head, key=entry_mark) - g.head
        return g.passed + below

    def set_floor(self, floor: Mark, cap: int) -> None:
        """Move the floor up to *floor*, keeping the drops it covers in `lost`."""
        before = self.dropped(cap, None)
        self.floor = floor
        self.passed_at = self._passed_at(floor)
        self.lost = 0
        self.lost = max(0, before - self.dropped(cap, None))

    def dropped(self, cap: int, now: float | None) -> int:
        """Events this cache took and lost to its count or age limit unacknowledged, ever
        (with *now* None, the age limit as of the last sweep)."""
        g = self.group
        passed = max(0, g.passed - self.passed_at)
        start = g.head
        if self.floor is not None:
            start = bisect_right(g.log, self.floor, start, key=entry_mark)
        return self.lost + passed + max(0, self.first(cap, now) - start)

    def first(self, cap: int, now: float | None) -> int:
        """Index in the group log of this cache's oldest event."""
        g, pol = self.group, self.policy
        log = g.log
        lo = max(g.head, len(log) - min(pol.max_count or cap, cap))
        if self.floor is not None:
            lo = bisect_right(log, self.floor, lo, key=entry_mark)
        if now is not None and pol.max_age is not None:
            lo = bisect_left(log, now - pol.max_age.total_seconds(), lo, key=entry_time)
        return lo


def entry_seq(entry: Entry) -> int:
    return entry[0]


def entry_time(entry: Entry) -> float:
    return entry[1]


def entry_mark(entry: Entry) -> Mark:
    return (entry[1], entry[2], entry[3])


def time_of(event: Event, now: float) -> float:
    t = event_time(event)
    return now if t is None else t.timestamp()
