"""Anti-entropy for the client caches, sans I/O: what two linked routers send each other so
that every router's copy of every client cache converges — same definition (pattern,
policy, timeout), same floor (acknowledgements), same ids — after kills, restarts and
partitions. `CacheSync.receive(peer, body, now)` takes a message and returns the messages to
send back to that peer; `digest(now)` makes the opening one. The service
(`aa.router.caches.service`) sends them as ttl-0 controls on the one link (topic
``client-cache-sync``), when a link comes up and every `CacheConfig.sync_interval`.

Why: client caches replicate by flooding (registration, keep-alives, acks) and by each router
taking the dispatched events that match; a router that was down (its caches are in memory:
a restart loses them all) or cut off while events were cached, or while a cache was created,
changed or removed, never catches up by flood alone.

The exchange (the digests and caps are `aa.router.store.antientropy`'s, shared with the store):

=========  ====================================================================================
``digest`` per cache: [client, version, floor, idle s, count, xor] (count and XOR of the ids
           its copy holds now), and the tombstones [client, version]; ``complete`` unless it
           is a sample (more than `MAX_DIGEST_CACHES`). The receiver answers ``defs`` for the
           caches a complete digest does not name, and:
           ``want`` for caches it lacks or holds an older version of; ``defs`` for those it
           holds newer; ``gone`` where its tombstone is newer; ``ids`` where versions are equal
           and floor or ids differ. Keep-alives merge (the later one wins) on the way.
``want``   clients → ``defs`` for those the receiver holds.
``defs``   full definitions (pattern, policy, timeout, floor, idle, version): a newer one
           replaces (a new pattern starts the cache afresh at the sender's floor); a new cache
           is answered with ``ids`` so its events come at once.
``gone``   remove (and remember the tombstone) where the version is not older.
``ids``    the sender's floor and the ids of its copy: the receiver raises its floor to it,
           sends ``events`` the sender lacks, and (when asked) its own ``ids`` back.
``events`` inserted at their place in the cache's order (`ClientCaches.insert`), unless
           already held, acknowledged, too old or past the count.
=========  ====================================================================================

Ordering concurrent changes: each definition carries a *version* (microseconds of the wall
clock at the router where the client changed it, at least one more than the version it
replaces, then that router's random tag to break ties). The highest version wins everywhere
(last writer wins): a client changes its own cache, through one router at a time, so real
concurrency is rare; when it happens (two changes closer than the clocks' skew) any
deterministic winner will do, and this one needs no coordination. Removal is a version too
(a tombstone, kept for the cache's timeout: by then any copy a partitioned router still holds
has lapsed, for no keep-alive came since). Floors only rise (acks are never undone), so the
higher floor wins. Lapse is each router's own, on the merged keep-alive (`idle` travels as
seconds, not a clock reading, so clock skew does not matter): a lapsed cache is not revived.

Bounds (a peer, or a stranger on an open mesh, may send anything): a digest past
`MAX_DIGEST_CACHES` entries, an id list past `MAX_IDS_PER_MESSAGE`, more than `DEFS_PER_MESSAGE`
definitions or `EVENTS_PER_MESSAGE` events, or a malformed message is refused whole
(`UsageError`); unknown caches are ignored; a peer's digest is answered at most once per
`DIGEST_MIN_GAP` and its ids for one cache at most once per `DIGEST_MIN_GAP`, so the events a
peer can make us send stay a bounded multiple of what we hold. Work per message is at most
one pass over the caches (digest) or over one cache (ids).
"""

from __future__ import annotations

import logging
import random
import secrets
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, cast

from aa.mesh import Event, PatternError, UsageError
from aa.mesh.protocol import event_from_wire, event_to_wire

from ..store import Exchanges, chunks, parse_digest, parse_ids
from .clientcaches import MAX_CLIENT_CACHES
from .compact import shrunk
from .grouplog import Mark, mark_of
from .tombstones import Tombstones

log = logging.getLogger("aa.router.caches")

if TYPE_CHECKING:
    from .service import ClientCacheService

__all__ = [
    "CacheSync",
    "CACHE_SYNC_TOPIC",
    "Version",
    "MAX_DIGEST_CACHES",
    "MAX_IDS_PER_MESSAGE",
    "ZERO",
    "parse_mark",
    "parse_version",
    "wire_mark",
]

#: Control topic of the client caches' anti-entropy (ttl 0, one link).
CACHE_SYNC_TOPIC: Final = "client-cache-sync"
#: Most caches in one digest message (also the most a peer may list in `want`): a router
#: with more sends a random sample of this many each time (all are covered in turn). Under the
#: codec's 10,000 items per list of a frame (`aa.router.session.MAX_FRAME_ITEMS`), which cuts
#: the link of a peer that sends more.
MAX_DIGEST_CACHES: Final = 5_000
#: Most ids in one `ids` message (the same frame cap). A cache holding more sends its newest
#: this many; the peer then sends a few events we hold already, which `insert` drops.
MAX_IDS_PER_MESSAGE: Final = 5_000
#: Definitions per `defs` message: patterns are up to a few KiB each.
DEFS_PER_MESSAGE: Final = 200
#: Events per `events` message: well under the frame cap.
EVENTS_PER_MESSAGE: Final = 500
#: Seconds: a peer's digest, and its ids for one cache, are answered at most once per this.
DIGEST_MIN_GAP: Final = 1.0
#: Most tombstones kept (a client that creates and removes caches without end): the oldest go.
MAX_TOMBSTONES: Final = MAX_CLIENT_CACHES

#: (µs of wall clock, tag of the router that made it): ordered, the highest wins.
Version = tuple[int, str]
ZERO: Final[Version] = (0, "")


def parse_version(v: Any) -> Version:
    if v is None:
        return ZERO
    if not isinstance(v, list) or len(v) != 2 or type(v[0]) is not int or type(v[1]) is not str:
        raise UsageError("a version is [int, str]")
    return (v[0], v[1])


def parse_mark(v: Any) -> Mark | None:
    if v is None:
        return None
    if (
        not isinstance(v, list)
        or len(v) != 2
        or type(v[0]) not in (int, float)
        or type(v[1]) is not str
    ):
        raise UsageError("a floor is [time, id] or null")
    return mark_of(float(v[0]), v[1])


def wire_mark(m: Mark | None) -> list[Any] | None:
    return None if m is None else [m[0], m[2]]


def _idle(v: Any) -> float:
    if type(v) not in (int, float) or not 0 <= v < 1e12:
        raise UsageError("idle is seconds ≥ 0")
    return float(v)


def _client(v: Any) -> str:
    if type(v) is not str or not v or len(v) > 1024:
        raise UsageError("a client id is a non-empty string")
    return v


def _list(body: Mapping[str, Any], name: str, cap: int) -> list[Any]:
    v = body.get(name)
    if v is None:
        return []
    if not isinstance(v, list) or len(v) > cap:
        raise UsageError(f"{name} is a list of at most {cap}")
    return v


class CacheSync:
    """One router's side of the client caches' anti-entropy (see the module docstring)."""

    def __init__(self, service: ClientCacheService) -> None:
        self._service = service
        self.tag = secrets.token_hex(4)
        #: Version of each cache this router holds.
        self.versions: dict[str, Version] = {}
        #: Removed caches (tombstones): client → the removal's version, until `now` passes the
        #: time it is forgotten at; kept apart, with no object per tombstone.
        self.gone = Tombstones()
        self._digests = Exchanges(timeout=DIGEST_MIN_GAP)  # used as a rate limit: never ended
        self._ids = Exchanges(timeout=DIGEST_MIN_GAP)
        self.counters: Counter[str] = Counter()
        #: Set by the service: has the events a peer sent for a cache whose pattern runs in a
        #: worker checked there (`RemoteMatcher.select`), then hands those taken to `repaired`.
        self.check_remote: Callable[[str, Any, list[Event]], None] | None = None

    @property
    def min_gap(self) -> float:
        """Seconds between two answers to a peer's digest (or ids for one cache)."""
        return self._digests.timeout

    @min_gap.setter
    def min_gap(self, seconds: float) -> None:  # tests move it instead of waiting
        self._digests.timeout = self._ids.timeout = seconds

    # -- versions (local changes and floods) -------------------------------------------------

    def bump(self, client_id: str, now: float) -> Version:
        """A local change of *client_id*'s cache: its new version."""
        old = max(self.versions.get(client_id, ZERO), self.tombstone(client_id) or ZERO)
        v = (max(int(now * 1e6), old[0] + 1), self.tag)
        self.versions[client_id] = v
        self._forget_tombstone(client_id)
        return v

    def tombstone(self, client_id: str) -> Version | None:
        """The version *client_id*'s cache was removed at, while its tombstone is kept."""
        return self.gone.get(client_id)

    def _forget_tombstone(self, client_id: str) -> None:
        self.gone.pop(client_id)

    def newer(self, client_id: str, version: Version) -> bool:
        """Whether *version* beats what this router knows of *client_id* (held or removed)."""
        tomb = self.tombstone(client_id)
        if tomb is not None and tomb >= version:
            return False
        return client_id not in self._service or version > self.versions.get(client_id, ZERO)

    def adopt(self, client_id: str, version: Version) -> None:
        self.versions[client_id] = max(version, self.versions.get(client_id, ZERO))
        self._forget_tombstone(client_id)

    def removed(self, client_id: str, version: Version, until: float) -> None:
        """*client_id*'s cache was removed at *version*: remember it until *until*."""
        self.lapsed(client_id)
        if len(self.gone) >= MAX_TOMBSTONES and client_id not in self.gone:
            oldest = self.gone.oldest()
            if oldest is not None:
                self.gone.pop(oldest)
        self.gone.put(client_id, version[0], version[1], until=until)

    def lapsed(self, client_id: str) -> None:
        if self.versions.pop(client_id, None) is not None:
            self.versions = shrunk(self.versions)

    def sweep(self, now: float) -> None:
        self.gone.expire(now)
        self._digests.prune(now)
        self._ids.prune(now)

    # -- the exchange ---------------------------------------------------------------------------

    def digest(self, now: float) -> dict[str, Any]:
        """The opening message: this router's digest (a sample past `MAX_DIGEST_CACHES`,
        drawn before anything is hashed)."""
        caches = self._service._caches
        held = [c for c in self.versions if c in caches]
        gone = [[c, [us, tag]] for c, (us, tag) in self.gone.items()]
        complete = len(held) <= MAX_DIGEST_CACHES and len(gone) <= MAX_DIGEST_CACHES
        if len(held) > MAX_DIGEST_CACHES:
            held = random.sample(held, MAX_DIGEST_CACHES)
        if len(gone) > MAX_DIGEST_CACHES:
            gone = random.sample(gone, MAX_DIGEST_CACHES)
        sums = caches.id_digests(held, now)
        rows = []
        for client_id in held:
            info = caches.info(client_id)
            count, xor = sums[client_id]
            rows.append(
                [
                    client_id,
                    list(self.versions[client_id]),
                    wire_mark(caches.floor(client_id)),
                    max(0.0, now - info.last_seen),
                    count,
                    f"{xor:016x}",
                ]
            )
        return {"op": "digest", "caches": rows, "gone": gone, "complete": complete}

    def receive(self, peer: str, body: Mapping[str, Any], now: float) -> list[dict[str, Any]]:
        """Take one message from *peer*; the messages to send it back. Raises `UsageError`
        for a malformed or oversized message (nothing of it applied)."""
        op = body.get("op")
        self.counters[f"received_{op}"] += 1
        if op == "digest":
            return self._on_digest(peer, body, now)
        if op == "want":
            wanted = [_client(c) for c in _list(body, "clients", MAX_DIGEST_CACHES)]
            return self._defs([c for c in wanted if c in self._service], now)
        if op == "defs":
            return self._on_defs(_list(body, "caches", DEFS_PER_MESSAGE), now)
        if op == "gone":
            for entry in _list(body, "caches", MAX_DIGEST_CACHES):
                if not isinstance(entry, list) or len(entry) != 2:
                    raise UsageError("a tombstone is [client, version]")
                self._on_gone(_client(entry[0]), parse_version(entry[1]), now)
            return []
        if op == "ids":
            return self._on_ids(peer, body, now)
        if op == "events":
            return self._on_events(body, now)
        raise UsageError(f"unknown op {op!r}")

    def _on_digest(self, peer: str, body: Mapping[str, Any], now: float) -> list[dict[str, Any]]:
        # Parse everything first: a bad entry refuses the whole message, nothing applied.
        extra: dict[str, tuple[Version, Mark | None, float]] = {}

        def key_of(fields: Any) -> str:
            client_id, version, floor, idle = fields
            entry = (parse_version(version), parse_mark(floor), _idle(idle))
            client = _client(client_id)
            extra[client] = entry
            return client

        theirs = parse_digest(body.get("caches"), key_of, max_entries=MAX_DIGEST_CACHES)
        tombs = [
            (_client(e[0]), parse_version(e[1]))
            for e in _list(body, "gone", MAX_DIGEST_CACHES)
            if isinstance(e, list) and len(e) == 2
        ]
        if not self._digests.begin(peer, now):
            self.counters["dropped_busy"] += 1
            return []
        for client_id, version in tombs:
            self._on_gone(client_id, version, now)
        caches = self._service._caches
        want: list[str] = []
        newer: list[str] = []
        gone: list[list[Any]] = []
        out: list[dict[str, Any]] = []
        same: list[str] = []  # versions and floors agree: compare what the copies hold
        for client_id in theirs:
            version, floor, idle = extra[client_id]
            tomb = self.tombstone(client_id)
            mine = self.versions.get(client_id) if client_id in caches else None
            if tomb is not None and tomb >= version:
                gone.append([client_id, list(tomb)])
            elif mine is None or mine < version:
                want.append(client_id)
            elif mine > version:
                newer.append(client_id)
            else:
                caches.keepalive(client_id, now - idle)
                if floor is not None:
                    caches.ack_mark(client_id, floor)
                if floor != caches.floor(client_id):
                    out += self._ids_for(client_id, now, reply=True)
                else:
                    same.append(client_id)
        mine_sums = caches.id_digests(same, now)  # each shared log hashed once
        for client_id in same:
            if mine_sums.get(client_id, (0, 0)) != theirs[client_id]:
                out += self._ids_for(client_id, now, reply=True)
        if body.get("complete") is True:  # caches the peer has never heard of: send them
            told = theirs.keys() | {c for c, _ in tombs}
            newer += [c for c in self.versions if c not in told and c in caches]
        if want:
            out.append({"op": "want", "clients": want})
        if gone:
            out.append({"op": "gone", "caches": gone})
        return out + self._defs(newer, now)

    def _defs(self, clients: list[str], now: float) -> list[dict[str, Any]]:
        service, caches = self._service, self._service._caches
        rows = []
        for client_id in clients:
            info = caches.info(client_id)
            rows.append(
                {
                    **service._registration(client_id),
                    "client": client_id,
                    "version": list(self.versions.get(client_id, ZERO)),
                    "floor": wire_mark(caches.floor(client_id)),
                    "idle": max(0.0, now - info.last_seen),
                }
            )
        return [{"op": "defs", "caches": list(part)} for part in chunks(rows, DEFS_PER_MESSAGE)]

    def _on_defs(self, rows: list[Any], now: float) -> list[dict[str, Any]]:
        parsed = []
        for row in rows:
            if not isinstance(row, dict):
                raise UsageError("a definition is a map")
            parsed.append(
                (
                    _client(row.get("client")),
                    parse_version(row.get("version")),
                    parse_mark(row.get("floor")),
                    _idle(row.get("idle")),
                    row,
                )
            )
        out: list[dict[str, Any]] = []
        caches = self._service._caches
        for client_id, version, floor, idle, row in parsed:
            if not self.newer(client_id, version):
                if client_id in caches and self.versions.get(client_id) == version:
                    # The same cache reached us by another way meanwhile (a flood, a third
                    # router): compare contents with this peer too.
                    caches.keepalive(client_id, now - idle)
                    if floor is not None:
                        caches.ack_mark(client_id, floor)
                    out += self._ids_for(client_id, now, reply=True)
                continue
            timeout = row.get("timeout")
            if type(timeout) in (int, float) and idle > cast(float, timeout):
                continue  # lapsed where it came from: not revived here
            try:
                self._service._apply_registration(client_id, row, floor=floor, seen=now - idle)
            except (UsageError, PatternError, TypeError, ValueError) as exc:
                self.counters["bad_defs"] += 1
                log.info("ignoring a synced definition of %r's cache: %s", client_id, exc)
                continue
            self.adopt(client_id, version)
            self.counters["defs_applied"] += 1
            out += self._ids_for(client_id, now, reply=True)
        return out

    def _on_gone(self, client_id: str, version: Version, now: float) -> None:
        if client_id in self._service and self.versions.get(client_id, ZERO) > version:
            return
        tomb = self.tombstone(client_id)
        if tomb is not None and tomb >= version:
            return
        timeout = (
            self._service._caches.info(client_id).timeout if client_id in self._service else 0.0
        )
        self._service._remove(client_id)
        self.removed(client_id, version, now + max(timeout, DIGEST_MIN_GAP * 60))
        self.counters["removed"] += 1

    def _ids_for(self, client_id: str, now: float, *, reply: bool) -> list[dict[str, Any]]:
        caches = self._service._caches
        ids = [e.id for e in caches.view(client_id, now) if e.id][-MAX_IDS_PER_MESSAGE:]
        return [
            {
                "op": "ids",
                "client": client_id,
                "floor": wire_mark(caches.floor(client_id)),
                "ids": ids,
                "reply": reply,
            }
        ]

    def _on_ids(self, peer: str, body: Mapping[str, Any], now: float) -> list[dict[str, Any]]:
        caches = self._service._caches
        client_id = _client(body.get("client"))
        floor = parse_mark(body.get("floor"))
        theirs = set(parse_ids(body.get("ids"), max_ids=MAX_IDS_PER_MESSAGE))
        if client_id not in caches:
            self.counters["unknown_cache"] += 1
            return []
        if not self._ids.begin(f"{peer}\0{client_id}\0{body.get('reply') is True}", now):
            self.counters["dropped_busy"] += 1
            return []
        if floor is not None:
            caches.ack_mark(client_id, floor)
        missing = [e for e in caches.view(client_id, now) if e.id not in theirs]
        out = [
            {"op": "events", "client": client_id, "events": [event_to_wire(e) for e in part]}
            for part in chunks(missing, EVENTS_PER_MESSAGE)
        ]
        if body.get("reply") is True:
            out += self._ids_for(client_id, now, reply=False)
        return out

    def _on_events(self, body: Mapping[str, Any], now: float) -> list[dict[str, Any]]:
        caches = self._service._caches
        client_id = _client(body.get("client"))
        wires = _list(body, "events", EVENTS_PER_MESSAGE)
        events: list[Event] = [event_from_wire(w) for w in wires]
        if client_id not in caches:
            self.counters["unknown_cache"] += 1
            return []
        matcher = caches.matcher_of(client_id)
        if getattr(matcher, "remote", False):  # its pattern is code: never run here
            if self.check_remote is not None and events:
                self.counters["events_checking"] += len(events)
                self.check_remote(client_id, matcher, events)
            return []
        for event in events:
            if caches.insert(client_id, event, now):
                self.counters["events_repaired"] += 1
        return []

    def repaired(self, client_id: str, events: list[Event], now: float) -> int:
        """*events* a peer sent for *client_id*'s cache that its pattern, run in a worker,
        took: into the cache (`check_remote`). How many were new."""
        caches = self._service._caches
        kept = 0
        for event in events:
            if client_id in caches and caches.insert(client_id, event, now, checked=True):
                kept += 1
        self.counters["events_repaired"] += kept
        return kept
