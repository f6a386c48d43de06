"""Anti-entropy for the persistent store: two linked routers find what one keeps and the
other lacks, and send it, so every store converges once the mesh is connected again.

Why: the store is replicated by the flood (every router keeps what it dispatches), and
nothing repairs a flood that did not reach a router — one that was down, or cut off by a
partition, lacks what was published meanwhile, for good.

How, between a router A and each of its peers B, when their link comes up and every
`StoreConfig.sync_interval` seconds after:

1. A sends B a *digest* of its store: per (type, hour of the event's time) bucket, the
   number of events and the XOR of a 64-bit hash of each id. Small (one entry per bucket),
   and equal buckets — nearly all of them, when two stores agree but for the last minutes —
   end the exchange there.
2. B compares it with its own: for the buckets that differ (or that one side lacks), B sends
   A the ids it keeps there (`ids`, at most `MAX_SYNC_IDS` per message). More than that are
   compared a slice at a time (`antientropy.slices_for`: the ids whose hash is j modulo k,
   on both sides), the next slice at each follow-up.
3. A sends B the events B lacks in those buckets (`events`, `SYNC_EVENTS_PER_MESSAGE` per
   message), and its own ids for them (`ids`, marked as a reply so the exchange ends), from
   which B sends A what A lacks.

Received events are stored with their own store policy (`persist_policy`), never
dispatched: they are history, not live events. A sync message is heeded only from the link
it came on (ttl 0, a path of one router: the link's peer, which the relay checks is the hop
that sent it), and its events pass the checks a flooded event passes (well formed, an id,
a policy the store can keep). On an open mesh any peer may flood any event (docs/security.md),
and sync grants nothing more: in particular a repaired copy never
displaces a live event — it is stored *as repaired* and the live event of its id, when the
flood brings it, replaces it (`aa.router.store.sql`), so a copy sent ahead under an id
predicted from a publisher's last one cannot make that publisher's events vanish. The store ignores
an id it has already, so a repair that races a late flood copy stores nothing twice. Expiry runs on
each router's clock and count limits keep the newest of a type on each side: an event one side has
already expired comes back and goes again at the next sweep — the stores agree on what they keep.

Why bucketed digests and not a Merkle tree or JetStream's replicated log: routers of a mesh
are peers with no leader and no shared sequence, stores hold thousands to a million events,
and divergence is recent (what a kill or a partition missed). One level of buckets costs one
scan of the store's keys per exchange, and sends ids only for the buckets that differ.
The digests, comparisons and caps are `aa.router.store.antientropy`'s (sans I/O, shared with
the client caches' sync): a digest of more than `MAX_BUCKETS` entries, an id list past
`MAX_SYNC_IDS` or an events message past `SYNC_EVENTS_PER_MESSAGE` is refused whole, and each
peer (keyed by the link, not by what the message claims) has one exchange under way at a
time, at most `MAX_SCANS` exchanges run at once across all peers, and a digest is computed
off the loop and reused for `DIGEST_REUSE` seconds, so a digest request costs a comparison
of buckets, not a scan of the store.
Messages travel as control messages on the one link between the two routers (ttl 0: they go
no further), from peers the mesh admits (with a CA, only the CA's routers: `aa.router.security`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from aa.mesh import AaError, Control, Event, StoreError, UsageError
from aa.mesh.protocol import event_from_wire, event_to_wire

from . import antientropy
from .antientropy import (
    Exchanges,
    chunks,
    id_parts,
    in_slice,
    parse_digest,
    parse_id_parts,
    parse_slice,
    slices_for,
)
from .eventstore import EventStore

if TYPE_CHECKING:
    from .service import StoreService

__all__ = ["StoreSync", "SYNC_TOPIC", "digest_of", "MAX_SYNC_IDS", "SYNC_IDS_PART"]

log = logging.getLogger("aa.router.store")

#: Control topic of anti-entropy messages.
SYNC_TOPIC: Final = "store-sync"
#: Most ids in one `ids` message (≤ 12 MiB of 64-character ids, under the frame cap), in
#: lists of at most `SYNC_IDS_PART` (a peer link decodes 65,536 items per list,
#: `MAX_PEER_FRAME_ITEMS`). A bucket with more is compared a slice of its ids at a time, a
#: round of messages each, so large slices let stores agree in few rounds.
MAX_SYNC_IDS: Final = 180_000
SYNC_IDS_PART: Final = 60_000
#: Events per `events` message: bounds a message well under the frame cap.
SYNC_EVENTS_PER_MESSAGE: Final = 500
#: Width of a digest bucket, in microseconds of event time (an hour).
BUCKET_US: Final = 3_600_000_000
#: Exchanges (each a scan of the store's keys) under way at once across all peers: a mesh of
#: strangers saying peer-hello gets this many scans, not one per connection.
MAX_SCANS: Final = 2
#: Seconds a computed digest of this store is reused for further requests (a digest costs a
#: scan of every key; stores that differ converge by `ids`, which scan only when they differ).
DIGEST_REUSE: Final = 2.0
#: Seconds the store's keys, once read, serve the exchanges that follow (`StoreSync._keys`).
KEYS_REUSE: Final = 1.0
#: Follow-up exchanges started at once (not at the next interval) with one peer per
#: interval, after an exchange that moved events or compared one slice of a bucket (plus one
#: per slice): stores converge in a few round trips, and two stores that cannot agree (an
#: event one side expires) stop here.
MAX_FOLLOW_UPS: Final = 10
#: Most buckets in one digest (types × hours): past it, the newest are sent (the same frame cap).
MAX_BUCKETS: Final = 5_000

Bucket = tuple[str | None, int]


class Peers(Protocol):
    """The links, as anti-entropy uses them (`aa.router.links.MeshService`)."""

    def peer_ids(self) -> list[str]: ...

    def send_control(self, peer_id: str, topic: str, body: Mapping[str, Any]) -> bool: ...

    def on_control(self, topic: str, callback: Callable[[Control], None]) -> Callable[[], None]: ...


def digest_of(
    keys: list[tuple[str, str | None, int]], hash: Callable[[str], int] = antientropy.id_hash
) -> dict[Bucket, tuple[int, int]]:
    """Per (type, hour) bucket: (count, XOR of the ids' hashes)."""
    return antientropy.ids_digest(
        (((etype, time_us // BUCKET_US), eid) for eid, etype, time_us in keys), hash
    )


def _bucket(fields: Any) -> Bucket:
    t, h = fields
    if (t is not None and type(t) is not str) or type(h) is not int:
        raise UsageError("a store bucket is [type or null, hour]")
    return (t, h)


def _buckets(raw: Any) -> set[Bucket]:
    if not isinstance(raw, list) or len(raw) > MAX_BUCKETS:
        raise UsageError(f"a list of at most {MAX_BUCKETS} buckets")
    return {_bucket(b) for b in raw}


async def store_keys(store: EventStore) -> list[tuple[str, str | None, int]]:
    """(id, type, time in µs) of every event stored or queued and not expired now."""
    from .sql import read_keys

    now_us = store.now_us()
    rows = await store.read(read_keys, now_us=now_us)
    seen = {i for i, _, _ in rows}
    for r in store.queued():
        eid = r.event.id
        if eid is not None and eid not in seen and (r.expires_us is None or r.expires_us > now_us):
            seen.add(eid)
            rows.append((eid, r.event.type, r.time_us))
    return rows


async def store_fetch(store: EventStore, ids: list[str]) -> list[Event]:
    """The stored (or queued) events with these *ids*."""
    from .sql import read_by_ids

    wanted = set(ids)
    queued = {r.event.id: r.event for r in store.queued() if r.event.id in wanted}
    return await store.read(read_by_ids, [i for i in ids if i not in queued]) + list(
        queued.values()
    )


class StoreSync:
    """Anti-entropy between this router's store and its peers' (see the module docstring)."""

    def __init__(self, storage: StoreService, router_id: str, *, interval: float) -> None:
        self._storage = storage
        self.router_id = router_id
        self.interval = interval
        self._peers: Peers | None = None
        self._task: asyncio.Task[None] | None = None
        self._jobs: set[asyncio.Task[None]] = set()
        # Peers with an exchange under way: each reads the store's keys (a scan), so a peer
        # (or a stranger on an open mesh) that sends digests or ids without end gets one scan
        # at a time, the rest dropped, not a scan per message.
        self._busy = Exchanges()
        self._scans = 0
        self._digest_cache: tuple[float, dict[Bucket, tuple[int, int]]] | None = None
        self._digest_lock = asyncio.Lock()
        self._keys_cache: tuple[float, list[tuple[str, str | None, int]]] | None = None
        self._keys_lock = asyncio.Lock()
        self._hashes = antientropy.IdHashes()
        self._follow_ups: dict[str, int] = defaultdict(int)
        # The slice of a big bucket compared next (`_ids_in`), from a random start: both ends
        # of a link start exchanges, and two on one slice at once send its events twice.
        self._slice = random.randrange(antientropy.MAX_SLICES)
        self.counters: dict[str, int] = defaultdict(int)

    def attach(self, peers: Peers) -> None:
        """Exchange with *peers*' routers (call once, before `start`)."""
        self._peers = peers
        peers.on_control(SYNC_TOPIC, self._on_control)

    async def start(self) -> None:
        if self._peers is not None and self._storage.store is not None and self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="aa-store-sync")

    async def aclose(self) -> None:
        tasks = [t for t in (self._task, *self._jobs) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None

    def link_up(self, peer_id: str) -> None:
        """A link with *peer_id* came up: compare stores now."""
        self._spawn(self._send_digest(peer_id))

    # -- inside -----------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._peers is not None
        while True:
            await asyncio.sleep(self.interval)
            self._follow_ups.clear()
            for peer_id in self._peers.peer_ids():
                await self._send_digest(peer_id)

    def _spawn(self, coro: Any) -> None:
        if self._peers is None or self._storage.store is None:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    def _send(self, peer_id: str, body: dict[str, Any]) -> None:
        assert self._peers is not None
        if self._peers.send_control(peer_id, SYNC_TOPIC, body):
            self.counters[f"sent_{body['op']}"] += 1

    async def _keys(self, store: EventStore) -> list[tuple[str, str | None, int]]:
        """`store_keys`, read at most once per `KEYS_REUSE` seconds: the exchanges of one
        round (a digest, a slice's ids both ways) each read them, and a scan of a large store
        is the bulk of a round. A list a second old costs at most an event sent twice (the
        store ignores it) or one found missing a round later."""
        async with self._keys_lock:
            cached = self._keys_cache
            if cached is not None and time.monotonic() - cached[0] < KEYS_REUSE:
                return cached[1]
            keys = await store_keys(store)
            self._keys_cache = (time.monotonic(), keys)
            return keys

    async def _digest(self) -> dict[Bucket, tuple[int, int]]:
        store = self._storage.store
        if store is None:
            return {}
        async with self._digest_lock:  # concurrent requests share one scan
            cached = self._digest_cache
            if cached is not None and time.monotonic() - cached[0] < DIGEST_REUSE:
                return cached[1]
            keys = await self._keys(store)
            digest = await asyncio.to_thread(
                digest_of, keys, self._hashes
            )  # hashing every id: off the loop
            self._digest_cache = (time.monotonic(), digest)
            return digest

    async def _send_digest(self, peer_id: str) -> None:
        try:
            digest = await self._digest()
        except StoreError as exc:
            log.warning("store sync with %s skipped: %s", peer_id, exc)
            return
        newest = dict(sorted(digest.items(), key=lambda kv: kv[0][1], reverse=True)[:MAX_BUCKETS])
        self._send(peer_id, {"op": "digest", "buckets": antientropy.digest_entries(newest, list)})

    def _on_control(self, control: Control) -> None:
        if control.to != self.router_id or len(control.path) != 1 or control.ttl != 0:
            self.counters["refused_not_direct"] += 1  # sync is between neighbours only
            return
        # The relay checked that the last hop is the link's peer: with one hop, the origin.
        peer_id = control.path[0]
        if self._peers is None or peer_id not in self._peers.peer_ids():
            self.counters["refused_not_linked"] += 1
            return
        body = control.body
        op = body.get("op")
        self.counters[f"received_{str(op)}"] += 1
        try:
            if op in ("digest", "ids"):
                # Parsed (and refused past the caps) before any work is scheduled.
                # The work is a factory, not a coroutine: one never started (busy, or the
                # router stopping) must leave nothing half-made behind.
                if op == "digest":
                    work = functools.partial(
                        self._on_digest,
                        peer_id,
                        parse_digest(body.get("buckets"), _bucket, max_entries=MAX_BUCKETS),
                    )
                else:
                    work = functools.partial(
                        self._on_ids,
                        peer_id,
                        _buckets(body.get("buckets")),
                        bool(body.get("reply")),
                        parse_id_parts(body.get("ids"), max_ids=MAX_SYNC_IDS, part=SYNC_IDS_PART),
                        parse_slice(body.get("slice")),
                    )
                if self._peers is None or self._storage.store is None:
                    return
                if self._scans >= MAX_SCANS or not self._busy.begin(peer_id, time.monotonic()):
                    self.counters["dropped_busy"] += 1
                    return
                self._scans += 1
                self._spawn(self._one_at_a_time(peer_id, work))
            elif op == "events":
                self._on_events(body)
        except (AaError, TypeError, ValueError) as exc:  # a malformed event is a MalformedFrame
            self.counters["refused"] += 1
            log.warning("ignoring a malformed store-sync message from %s: %s", peer_id, exc)

    async def _one_at_a_time(self, peer_id: str, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        finally:
            self._scans -= 1
            self._busy.end(peer_id)

    async def _on_digest(self, peer_id: str, theirs: dict[Bucket, tuple[int, int]]) -> None:
        mine = await self._digest()
        differ = antientropy.differing(mine, theirs)
        if differ:
            await self._send_ids(peer_id, differ, reply=True)

    async def _ids_in(
        self, buckets: set[Bucket], part: tuple[int, int] | None
    ) -> tuple[list[str], tuple[int, int]]:
        """Our ids in *buckets*, in slice *part* (None: sliced to fit `MAX_SYNC_IDS`, the
        next slice for each call), and the slice."""
        store = self._storage.store
        assert store is not None
        ids = [eid for eid, t, us in await self._keys(store) if (t, us // BUCKET_US) in buckets]
        if part is None:
            k = slices_for(len(ids), MAX_SYNC_IDS)
            self._slice += 1
            part = (k, self._slice % k)
        if part[0] > 1:
            ids = await asyncio.to_thread(
                in_slice, ids, *part, self._hashes
            )  # hashing: off the loop
        return ids, part

    async def _send_ids(
        self,
        peer_id: str,
        buckets: set[Bucket],
        *,
        reply: bool,
        part: tuple[int, int] | None = None,
    ) -> None:
        if self._storage.store is None:
            return
        ids, (k, j) = await self._ids_in(buckets, part)
        self._send(
            peer_id,
            {
                "op": "ids",
                "reply": reply,
                "buckets": [list(b) for b in sorted(buckets, key=str)],
                "ids": id_parts(ids[:MAX_SYNC_IDS], SYNC_IDS_PART),
                "slice": [k, j],
            },
        )

    async def _on_ids(
        self,
        peer_id: str,
        buckets: set[Bucket],
        reply: bool,
        their_ids: list[str],
        part: tuple[int, int],
    ) -> None:
        store = self._storage.store
        if store is None:
            return
        theirs = set(their_ids)
        mine, _ = await self._ids_in(buckets, part)
        missing = [eid for eid in mine if eid not in theirs]
        for some in chunks(missing, SYNC_EVENTS_PER_MESSAGE):
            events = await store_fetch(store, list(some))
            self._send(peer_id, {"op": "events", "events": [event_to_wire(e) for e in events]})
            self.counters["events_sent"] += len(events)
        if reply:
            await self._send_ids(peer_id, buckets, reply=False, part=part)
        elif (missing or part[0] > 1 or len(their_ids) >= MAX_SYNC_IDS) and self._follow_ups[
            peer_id
        ] < MAX_FOLLOW_UPS + part[0]:
            # The exchange moved events or saw only part of a bucket: compare again now
            # rather than at the next interval (their events sent here are already queued).
            self._follow_ups[peer_id] += 1
            self.counters["follow_ups"] += 1
            self._spawn(self._send_digest(peer_id))

    def _on_events(self, body: Mapping[str, Any]) -> None:
        kept = 0
        wires = body.get("events") or ()
        if not isinstance(wires, list) or len(wires) > SYNC_EVENTS_PER_MESSAGE:
            raise UsageError(f"at most {SYNC_EVENTS_PER_MESSAGE} events a message")
        for wire in wires:
            event: Event = event_from_wire(wire)
            if self._storage.keep(event, repaired=True):
                kept += 1
        self.counters["events_repaired"] += kept
        if kept:
            self._digest_cache = self._keys_cache = None  # the store changed: read afresh next time
