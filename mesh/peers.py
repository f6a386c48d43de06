"""The peer table and its poison list (pure: no I/O; time is passed in).

Å §4.1: "When a connection to a router is lost, or an exception otherwise occurs during a
communication, it is added to a 'poison' list. Subsequent connection attempts occur in
exponentially increasing intervals – thus a faulty node is increasingly marginalized the more
frequently it fails, up until a maximum interval." Routers keep one table of the routers they
know (by peer endpoint); clients keep one of the routers they may connect to (by client
endpoint). The owner does the connecting and reports the outcome here.

States of one entry, and the calls that move it::

    state        call                      next state   effect
    ----------   -----------------------   ----------   ---------------------------------------
    idle         due(now) lists it          idle         (when next_attempt <= now)
    idle         record_attempt             connecting
    connecting   record_success             connected    connected_since = now
    connecting   record_failure             poisoned     failures += 1; retry after back-off
    connected    record_failure             poisoned     as above, but first failures = 0 if
                                                         the link stayed up >= stable_after
    connected    record_closed              idle         closed on purpose: no penalty, retry
                                                         after retry_base (or as due before)
    poisoned     due(now) lists it          poisoned     (when next_attempt <= now)
    poisoned     record_attempt             connecting
    any          record_success             connected    (a peer that dialled us)

Back-off: after the n-th failure in a row, the next attempt is at
``now + min(retry_base * 2**(n-1), retry_max)``, shortened by up to `jitter` (a fraction) so
that the clients of a router that restarts do not all call back in the same instant.

Flapping: a router that accepts a connection and drops it a moment later is as faulty as one
that refuses it. So success does not forgive failures at once: only a connection that has
stayed up for `stable_after` seconds resets the count. A flapping peer's interval keeps
doubling, exactly as if every attempt had failed.

Forgetting: a router that has been of no use for `forget_after` seconds (7 days: no
connection, no first-hand sighting) is forgotten at its next failure, unless it is
configured. Routers come and go — a laptop's, a test's on a random port — and without this
every one that ever answered stayed in the table and the topology file for good, dialled
every `retry_max`. One that comes back is heard of again (a beacon, zeroconf, a peer's
router list, or its own dial). An operator may also forget a router at once (`forget`,
`aa mesh forget`), configured or not.

Size: the table is capped (entries come from peers' router lists, which we do not control).
When full, the least recently useful entry goes: the one longest without a successful
connection or a first-hand sighting (a beacon, configuration). Configured, connecting and
connected entries are never evicted.
"""

from __future__ import annotations

import enum
import random
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from .endpoints import parse_endpoint
from .errors import UsageError

__all__ = [
    "PeerTable",
    "PeerEntry",
    "PeerState",
    "Source",
    "MAX_PEERS",
    "RETRY_BASE",
    "RETRY_MAX",
    "RETRY_JITTER",
    "STABLE_AFTER",
    "FORGET_AFTER",
]

#: Most entries in one table, in entries. Å meshes are tens of routers; a thousand leaves room
#: for big sites while bounding what a peer's router list can make us hold (~200 KB).
MAX_PEERS: Final = 1024
#: First retry interval after a failure, in seconds: long enough not to spin on a refused port.
RETRY_BASE: Final = 1.0
#: Longest retry interval, in seconds: a router that comes back is found within five minutes.
RETRY_MAX: Final = 300.0
#: Largest fraction by which an interval is shortened at random: spreads the reconnection
#: storm after a popular router restarts. 0 makes intervals exact (tests).
RETRY_JITTER: Final = 0.1
#: Seconds a connection must stay up before its peer's failures are forgiven. Well above a
#: keep-alive round (seconds): a peer that fails within a minute of every connect is faulty.
STABLE_AFTER: Final = 60.0
#: Seconds a router may be of no use (no connection, no first-hand sighting) before its next
#: failure forgets it (7 days: a laptop away for a long weekend is still known).
FORGET_AFTER: Final = 7 * 24 * 3600.0
#: Own addresses remembered (to never dial ourselves), in addresses: one per interface.
_MAX_OWN_ADDRESSES: Final = 64


class PeerState(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    POISONED = "poisoned"


class Source(enum.Enum):
    """How we came to know an address, strongest first (an entry keeps its strongest)."""

    CONFIGURED = "configured"  # well-known endpoints in the configuration
    DISCOVERED = "discovered"  # heard first-hand: a broadcast beacon, zeroconf
    TOLD = "told"  # another router told us (hello, router list)
    PERSISTED = "persisted"  # read from the topology file at start


_STRENGTH = {Source.CONFIGURED: 0, Source.DISCOVERED: 1, Source.TOLD: 2, Source.PERSISTED: 3}


@dataclass(slots=True, kw_only=True)
class PeerEntry:
    """One known router. Owned by its `PeerTable`: read it, change it only through the table."""

    #: Endpoint we dial, "host:port".
    address: str
    source: Source
    #: The router's id, once known (from a beacon or its hello).
    router_id: str | None = None
    state: PeerState = PeerState.IDLE
    #: Failures in a row (not reset by a short-lived connection).
    failures: int = 0
    #: Monotonic time before which we do not dial it.
    next_attempt: float = 0.0
    #: Monotonic time the current connection came up; None when not connected.
    connected_since: float | None = None
    #: Monotonic time of the last success or first-hand sighting (eviction order).
    last_useful: float = 0.0


class PeerTable:
    """Known routers, their states and their poison back-off.

    >>> t = PeerTable(jitter=0.0)
    >>> _ = t.add("10.0.0.2:7447", source=Source.CONFIGURED, now=0.0)
    >>> t.due(0.0)
    ['10.0.0.2:7447']
    >>> t.record_attempt("10.0.0.2:7447", 0.0); t.record_failure("10.0.0.2:7447", 0.0)
    1.0
    >>> t.due(0.5), t.due(1.0)
    ([], ['10.0.0.2:7447'])

    Raises `UsageError` for a malformed address or bad limits.
    """

    __slots__ = (
        "own_id",
        "max_entries",
        "retry_base",
        "retry_max",
        "stable_after",
        "jitter",
        "forget_after",
        "_rng",
        "_entries",
        "_own_addresses",
    )

    def __init__(
        self,
        *,
        own_id: str | None = None,
        max_entries: int = MAX_PEERS,
        retry_base: float = RETRY_BASE,
        retry_max: float = RETRY_MAX,
        stable_after: float = STABLE_AFTER,
        jitter: float = RETRY_JITTER,
        rng: random.Random | None = None,
        forget_after: float = FORGET_AFTER,
    ) -> None:
        if type(max_entries) is not int or max_entries < 1:
            raise UsageError("max_entries must be a positive int")
        if not 0 < retry_base <= retry_max:
            raise UsageError("need 0 < retry_base <= retry_max (seconds)")
        if stable_after < 0:
            raise UsageError("stable_after must not be negative (seconds)")
        if not 0 <= jitter < 1:
            raise UsageError("jitter must be a fraction in [0, 1)")
        if not forget_after > 0:
            raise UsageError("forget_after must be positive (seconds)")
        self.own_id = own_id
        self.max_entries = max_entries
        self.retry_base = float(retry_base)
        self.retry_max = float(retry_max)
        self.stable_after = float(stable_after)
        self.jitter = float(jitter)
        self.forget_after = float(forget_after)
        self._rng = rng if rng is not None else random.Random()
        # Insertion order = eviction order: the front is the least recently useful entry.
        self._entries: OrderedDict[str, PeerEntry] = OrderedDict()
        self._own_addresses: OrderedDict[str, None] = OrderedDict()

    # -- knowing -----------------------------------------------------------------------------

    def add(
        self, address: str, *, source: Source, now: float, router_id: str | None = None
    ) -> PeerEntry | None:
        """Learn (or hear again of) the router at *address*; returns its entry.

        None when the address is ours (see `record_self`) or the table is full of entries that
        may not be evicted. Hearing an address first-hand (configured, discovered) counts as
        useful and keeps it from eviction; hearsay (told, persisted) does not refresh it, so a
        peer cannot keep dead addresses alive by repeating them.
        """
        parse_endpoint(address)  # InvalidValue (a UsageError) when malformed
        if address in self._own_addresses:
            return None
        if router_id is not None and router_id == self.own_id:
            self.record_self(address)
            return None
        entry = self._entries.get(address)
        if entry is None:
            if len(self._entries) >= self.max_entries and not self._evict_one():
                return None
            entry = PeerEntry(address=address, source=source, router_id=router_id, last_useful=now)
            self._entries[address] = entry
            return entry
        if _STRENGTH[source] < _STRENGTH[entry.source]:
            entry.source = source
        if router_id is not None:
            entry.router_id = router_id
        if source is Source.CONFIGURED or source is Source.DISCOVERED:
            self._useful(entry, now)
        return entry

    def get(self, address: str) -> PeerEntry | None:
        return self._entries.get(address)

    def remove(self, address: str) -> None:
        """Forget *address* (no error if unknown)."""
        self._entries.pop(address, None)

    def forget(self, router: str) -> list[PeerEntry]:
        """Drop every entry whose address or router id is *router*, whatever its source;
        returns the entries dropped (none: nothing matched). The caller decides whether a
        live router may be forgotten: a connected one is simply heard of again."""
        gone = [e for e in self._entries.values() if router in (e.address, e.router_id)]
        for e in gone:
            del self._entries[e.address]
        return gone

    def record_self(self, address: str) -> None:
        """*address* turned out to be this very router: forget it and never dial it again."""
        self._entries.pop(address, None)
        self._own_addresses[address] = None
        if len(self._own_addresses) > _MAX_OWN_ADDRESSES:
            self._own_addresses.popitem(last=False)

    def __contains__(self, address: object) -> bool:
        return address in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[PeerEntry]:
        return iter(list(self._entries.values()))

    def connected(self) -> list[PeerEntry]:
        return [e for e in self._entries.values() if e.state is PeerState.CONNECTED]

    # -- dialling ----------------------------------------------------------------------------

    def due(self, now: float) -> list[str]:
        """Addresses to dial now, fewest failures first.

        Leaves out entries already connecting or connected, entries still waiting out their
        back-off, and addresses of a router we are already connected to by another address.
        Also forgives the failures of connections that have now been up `stable_after`.
        """
        busy_ids = set()
        for e in self._entries.values():
            if e.state is PeerState.CONNECTED or e.state is PeerState.CONNECTING:
                if e.router_id is not None:
                    busy_ids.add(e.router_id)
                if e.state is PeerState.CONNECTED:
                    self._settle(e, now)
        ready = [
            e
            for e in self._entries.values()
            if (e.state is PeerState.IDLE or e.state is PeerState.POISONED)
            and e.next_attempt <= now
            and (e.router_id is None or e.router_id not in busy_ids)
        ]
        ready.sort(key=lambda e: (e.failures, e.next_attempt))
        return [e.address for e in ready]

    def next_due(self) -> float | None:
        """The earliest `next_attempt` of an idle or poisoned entry (when to call `due` again)."""
        times = [
            e.next_attempt
            for e in self._entries.values()
            if e.state is PeerState.IDLE or e.state is PeerState.POISONED
        ]
        return min(times) if times else None

    def record_attempt(self, address: str, now: float) -> None:
        """We are dialling *address*."""
        entry = self._entries.get(address)
        if entry is not None:
            entry.state = PeerState.CONNECTING

    def record_success(self, address: str, now: float, *, router_id: str | None = None) -> None:
        """A connection with *address* is up (we dialled it, or it dialled us). Failures are
        forgiven only once it has stayed up `stable_after` seconds (see the module doc)."""
        entry = self._entries.get(address)
        if entry is None:
            return
        if router_id is not None:
            if router_id == self.own_id:
                self.record_self(address)
                return
            entry.router_id = router_id
        entry.state = PeerState.CONNECTED
        entry.connected_since = now
        self._useful(entry, now)

    def record_failure(self, address: str, now: float, *, cap: float | None = None) -> float | None:
        """Dialling *address* failed, or its connection broke: poison it — or forget it, if it
        is not configured and has been of no use for `forget_after` seconds. *cap*: the next
        attempt is at most this many seconds away (a client just after losing its router).

        Returns the monotonic time of the next attempt; None if the address is unknown, or
        now forgotten.
        """
        entry = self._entries.get(address)
        if entry is None:
            return None
        if entry.source is not Source.CONFIGURED and now - entry.last_useful >= self.forget_after:
            del self._entries[address]
            return None
        self._settle(entry, now)
        entry.failures += 1
        entry.state = PeerState.POISONED
        entry.connected_since = None
        delay = self.retry_delay(entry.failures)
        entry.next_attempt = now + (delay if cap is None else min(delay, cap))
        return entry.next_attempt

    def record_closed(self, address: str, now: float) -> None:
        """We closed the connection with *address* on purpose (a duplicate link, shutdown of
        that link): no penalty. It is due again after `retry_base`."""
        entry = self._entries.get(address)
        if entry is None:
            return
        self._settle(entry, now)
        entry.state = PeerState.POISONED if entry.failures else PeerState.IDLE
        entry.connected_since = None
        entry.next_attempt = max(entry.next_attempt, now + self.retry_base)

    def retry_delay(self, failures: int) -> float:
        """Seconds to wait after the *failures*-th failure in a row (jitter applied)."""
        delay = min(self.retry_base * 2.0 ** min(failures - 1, 62), self.retry_max)
        if self.jitter:
            delay *= 1.0 - self.jitter * self._rng.random()
        return delay

    # -- persistence (see aa.mesh.topology) --------------------------------------------------

    def restore(self, entry: PeerEntry) -> bool:
        """Put back an entry read from disk, unless its address is already known or the table
        is full (what we learnt since start is fresher). Its state becomes idle, or poisoned if
        it has failures. Returns whether it was put back."""
        if entry.address in self._entries or entry.address in self._own_addresses:
            return False
        if len(self._entries) >= self.max_entries:
            return False
        entry.state = PeerState.POISONED if entry.failures else PeerState.IDLE
        entry.connected_since = None
        self._entries[entry.address] = entry
        # Restored entries are hearsay: queue them at the front, first to be evicted.
        self._entries.move_to_end(entry.address, last=False)
        return True

    # -- inside ------------------------------------------------------------------------------

    def _settle(self, entry: PeerEntry, now: float) -> None:
        if entry.connected_since is not None and now - entry.connected_since >= self.stable_after:
            entry.failures = 0

    def _useful(self, entry: PeerEntry, now: float) -> None:
        entry.last_useful = now
        self._entries.move_to_end(entry.address)

    def _evict_one(self) -> bool:
        for address, entry in self._entries.items():
            if entry.source is Source.CONFIGURED:
                continue
            if entry.state is PeerState.CONNECTED or entry.state is PeerState.CONNECTING:
                continue
            del self._entries[address]
            return True
        return False
