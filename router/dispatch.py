"""Dispatch of one event: stamp it, deliver it to local subscribers and sinks, pass it on.

An event's way through one router::

    client's Publish ──► accept: stamp (id, time, client, address, router, ttl, path;
    │                    Å §4.2), drop a retried id (FloodRules.originate)
    peer's Flood ───────► (links room: FloodRules.hop / first, once per router per id)
                         │
                         ▼
                    dispatch: the pattern engine's matches ──► each subscriber's queue
                              the sinks (store, mesh cache, client caches, event log)
                         │
                         ▼
    accept only ───► forwarders (the links room floods it to every peer)
                         │
    end of batch ──► flush: every client with queued deliveries is written to once

Dispatch is synchronous inside the event loop: a batch of events read from one socket is
dispatched whole, then `flush` writes one frame per client that got deliveries, so N events
cost one system call per client, not N. A large publish is the exception (`accept_in_steps`):
it is dispatched `DISPATCH_STEP` events at a time for `DISPATCH_BUDGET` seconds per turn of
the loop, so the other clients are served between (a 1,000-event frame of 1.5 KB events
takes ~18 ms to dispatch).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol, cast

from aa.mesh import (
    MAX_ID_LENGTH,
    META_ADDRESS,
    META_CLIENT,
    META_PATH,
    META_ROUTER,
    META_TIME,
    META_TTL,
    META_USER,
    ROUTER_META_KEYS,
    Event,
    FloodRules,
    IdGenerator,
    SeenIds,
    load_pyx,
)
from aa.mesh.protocol import FloodGroup, pack, pack_with_meta

from .patterns import PatternEngine
from .seams import BatchSink, Sink, Subscriber

__all__ = [
    "Dispatcher",
    "Writable",
    "MAX_NAMES_SEEN",
    "DispatchTimes",
    "DISPATCH_BUCKETS",
    "SAMPLE_EVERY",
]

#: Value names a router remembers for its warnings at subscribe, in names: the names of a
#: mesh's event types, not its values (a publisher that puts values in names is capped).
MAX_NAMES_SEEN = 10_000
#: Events of a large publish dispatched between two looks at the clock (`accept_in_steps`).
DISPATCH_STEP = 64
#: Seconds of the loop a large publish is dispatched for per turn, the rest on the next.
DISPATCH_BUDGET = 0.004

log = logging.getLogger("aa.router")

_HERE = Path(__file__).resolve().parent

#: The setter of `Event.packed` (a slot of a frozen dataclass), for the compiled stamp.
_set_packed: Callable[[Event, bytes], None] = vars(Event)["packed"].__set__


#: The compiled stamping loop (`_stamp.pyx`), or None: `Dispatcher._stamp` runs instead.
_compiled_stamp: Callable[..., tuple[list[Event], list[Event], int]] | None = getattr(
    load_pyx(__package__ or "aa.router", _HERE, "_stamp"), "stamp", None
)

# -- how long the router holds an event ------------------------------------------------------
#
# ``aa_dispatch_seconds`` at ``GET /metrics``: the time from the dispatch of a batch of events
# to the write of its deliveries. The event path must not pay for metrics, so one batch in
# `SAMPLE_EVERY` (a client's publish frame, or one event of a peer's flood) is timed with two
# clock reads, into a histogram of plain counts the scraper reads when it asks. It measures
# the synchronous part: matching, the sinks, the writes of every subscriber's delivery frame.
# Deliveries of patterns run in worker processes come back later and are not in it.

#: Upper bounds of the histogram's buckets, in seconds: from a small batch of predicate
#: matches (tens of microseconds) to a stalled loop (a second); +Inf follows.
DISPATCH_BUCKETS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
#: Batches (or a peer's events) dispatched per one timed: at 10,000 events/s in batches of
#: ten, sixty samples a second, plenty for quantiles over a minute.
SAMPLE_EVERY: Final = 16


class DispatchTimes:
    """Counts per bucket (not cumulative; the last is +Inf), their sum and their number."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...] = DISPATCH_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it) per bucket, ending with +Inf."""
        out = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


def scoped_id(own: str, proposed: str) -> str:
    """The id an event published with id *proposed* under the prefix *own* ("scope-") travels
    under: *proposed* if it carries the prefix, else prefixed, within `MAX_ID_LENGTH` (a long
    id is hashed, which keeps it the same for every retry)."""
    if proposed.startswith(own):
        return proposed
    eid = own + proposed
    if len(eid) > MAX_ID_LENGTH:
        eid = own + hashlib.blake2b(proposed.encode(), digest_size=16).hexdigest()
    return eid


class Writable(Protocol):
    """A client connection with deliveries queued during a batch (`ClientSession`)."""

    def flush(self) -> None: ...


class Dispatcher:
    """Dispatch of events on one router (see the module docstring).

    It owns the router's id generator and its flood rules (whose seen-id set serves client
    publishes and peers' floods alike, so an event a client re-publishes after a fail-over
    is recognised wherever the mesh has carried it).
    """

    def __init__(
        self, *, ids: IdGenerator, rules: FloodRules, engine: PatternEngine, counters: Counter[str]
    ) -> None:
        self.ids = ids
        self.rules = rules
        self.engine = engine
        #: `engine.match`: a router's subscriber keys are `Subscriber`s.
        self._match = cast(Callable[[Event], list[tuple[Subscriber, Event]]], engine.match)
        self.counters = counters
        #: Called with each event dispatched here (the client caches attach here).
        self.sinks: list[Sink] = []
        #: Called with the events dispatched here, a batch at a time, in order (the router's
        #: own sinks: store, mesh cache, event log; `aa.router.sinks`).
        self.batch_sinks: list[BatchSink] = []
        #: Called with the events this router accepted from a client, a batch at a time: their
        #: floods (links room).
        self.forwarders: list[Callable[[Sequence[Event]], None]] = []
        self._dirty: list[Writable] = []
        #: Called after each slice of a stepped publish: the sinks' own flush (mesh cache,
        #: event log), so their encoding counts in the step's budget (it doubled the step).
        self.after_step: Callable[[], None] = lambda: None
        #: Value names of the events dispatched here (at most `MAX_NAMES_SEEN`): a pattern
        #: that reads a name none of them had is warned about at subscribe.
        self.names_seen: set[str] = set()
        #: Sampled times from dispatch to the write of the deliveries (`DispatchTimes`).
        self.timing = DispatchTimes()
        self._sample_in = SAMPLE_EVERY
        self._sampled: float | None = None  # perf_counter() at the timed batch's start

    def new_id(self) -> str:
        """A fresh id, unique in the mesh (for events and control messages alike)."""
        return self.ids()

    def accept(
        self,
        events: Sequence[Event],
        client_id: str,
        address: str,
        user: str | None = None,
        scope: str | None = None,
    ) -> list[Event]:
        """Stamp events from a client (Å §4.2; and *user*, the user its certificate names or
        "anonymous", Å §4.6), drop retried ones, dispatch and forward them.
        Returns the stamped events (a retried one is left out).

        *scope* is the publisher's id scope (`aa.mesh.id_scope`): an id it proposes that
        does not carry it travels under it (``scope-id``, or a hash of a long id), so an
        id can only ever be a duplicate of one the same publisher sent. Without that, a
        client that publishes the next ids of another publisher (ids show their prefix and
        counter) made the mesh drop that publisher's real events as duplicates."""
        self._sample_in -= 1
        if not self._sample_in:  # one batch in SAMPLE_EVERY is timed until its flush
            self._sample_in = SAMPLE_EVERY
            if self._sampled is None:
                self._sampled = time.perf_counter()
        now = time.monotonic()
        stamp_time = datetime.now(UTC)  # one clock read per batch, not per event
        # The stamp every event of the batch shares, in the order the keys go on the wire;
        # each event's copy gets its own ttl and path from `originate`.
        shared: dict[str, Any] = {
            META_TIME: stamp_time,
            META_CLIENT: client_id,
            META_ADDRESS: address,
            META_ROUTER: self.rules.router_id,
            META_TTL: None,
            META_PATH: None,
        }
        if user is not None:
            shared[META_USER] = user
        own = None if scope is None else scope + "-"
        if _compiled_stamp is not None and type(self.rules).originate is FloodRules.originate:
            out, alike, duplicates = self._stamp_compiled(events, shared, own, now)
        else:
            out, alike, duplicates = self._stamp(events, shared, own, now)
        if duplicates:
            self.counters["duplicates"] += duplicates  # retried publishes: already in the mesh
        if alike:  # the same meta on each: packed once for all of them
            try:
                pack_with_meta(alike, pack(alike[0].meta), events)
            except (TypeError, ValueError, OverflowError):
                pass  # never for a stamp; each event is packed on its own when asked
        # The batch is stamped (its duplicates dropped) before any of it is dispatched: each
        # event still reaches the subscribers, then the sinks, then the forwarders in order.
        if out:
            self._dispatch_batch(out)
            for forward in self.forwarders:
                forward(out)
        counters = self.counters
        counters["published"] += len(out)
        counters["dispatched"] += len(out)
        return out

    def _stamp_compiled(
        self, events: Sequence[Event], shared: dict[str, Any], own: str | None, now: float
    ) -> tuple[list[Event], list[Event], int]:
        """`_stamp`, by the compiled loop (`_stamp.pyx`), which does `FloodRules.originate`'s
        work itself: for the usual flood rules only (and the seen-id check's, for the plain
        `SeenIds`). It also gives each stamped event whose source kept its bytes the bytes
        `pack_with_meta` would, and leaves it out of *alike*."""
        assert _compiled_stamp is not None
        rules = self.rules
        return _compiled_stamp(
            events,
            shared,
            own,
            self.ids,
            scoped_id,
            rules.seen.check,
            now,
            rules.initial_ttl,
            rules.router_id,
            Event.trusted,
            ROUTER_META_KEYS,
            META_TTL,
            META_PATH,
            pack,
            _set_packed,
            rules.seen if type(rules.seen) is SeenIds else None,
        )

    def _stamp(
        self, events: Sequence[Event], shared: dict[str, Any], own: str | None, now: float
    ) -> tuple[list[Event], list[Event], int]:
        """The stamped *events* in order (retried ones left out), those of them whose meta is
        the stamp *shared* alone with the same hop, and the number of retries: the reference
        of the compiled `_stamp.stamp`, which does the same for the usual flood rules."""
        originate = self.rules.originate
        trusted = Event.trusted
        new_id = self.ids
        out: list[Event] = []
        append = out.append
        alike: list[Event] = []
        first_hop = None
        duplicates = 0
        for ev in events:
            eid = ev.id
            if eid is None:
                eid = new_id()
            elif own is not None:
                eid = scoped_id(own, eid)
            hop = originate(eid, now)
            if hop is None:
                duplicates += 1
                continue
            meta: dict[str, Any] = ev.meta
            if meta:
                meta = {k: v for k, v in meta.items() if k not in ROUTER_META_KEYS}
                meta.update(shared)  # a publisher's own "user" was dropped with ROUTER_META_KEYS
                meta[META_TTL] = hop[0]
                meta[META_PATH] = hop[1]
                append(trusted(ev.values, ev.type, meta, eid))
                continue
            meta = shared.copy()
            meta[META_TTL] = hop[0]
            meta[META_PATH] = hop[1]
            stamped = trusted(ev.values, ev.type, meta, eid)
            append(stamped)
            if not alike:
                first_hop = hop
                alike.append(stamped)
            elif hop == first_hop:
                alike.append(stamped)
        return out, alike, duplicates

    def accept_in_steps(
        self,
        events: Sequence[Event],
        client_id: str,
        address: str,
        user: str | None,
        scope: str | None,
        *,
        until: float,
        going_on: Callable[[], bool],
        then: Callable[[], None],
    ) -> None:
        """`accept` *events* `DISPATCH_STEP` at a time until `time.perf_counter()` passes
        *until*, the rest on later turns of the loop, `DISPATCH_BUDGET` seconds each, for as
        long as *going_on()* (the publisher's connection is open); *then* once done."""
        start = 0
        try:
            while start < len(events):
                self.accept(events[start : start + DISPATCH_STEP], client_id, address, user, scope)
                self.after_step()
                start += DISPATCH_STEP
                if time.perf_counter() >= until:
                    break
            self.flush()
            if start < len(events) and going_on():
                rest = events[start:]
                asyncio.get_running_loop().call_soon(
                    lambda: self.accept_in_steps(
                        rest,
                        client_id,
                        address,
                        user,
                        scope,
                        until=time.perf_counter() + DISPATCH_BUDGET,
                        going_on=going_on,
                        then=then,
                    )
                )
                return
        except Exception:  # never for events the codec checked; the frame is still acked
            log.exception(
                "dispatching a publish of %s failed", client_id, extra={"client_id": client_id}
            )
        then()

    def dispatch(self, event: Event) -> None:
        """Deliver *event* to local subscribers and sinks (once per router per event)."""
        self._sample()
        self._dispatch(event)
        self.counters["dispatched"] += 1

    def dispatch_many(self, events: list[Event], received: FloodGroup | None = None) -> None:
        """`dispatch` each of *events* (fresh here, from a peer), in order: all their
        deliveries, then the sinks, given them at once (and *received*, the group they came
        in when they are all of its events: `aa.router.seams.BatchSink`)."""
        if not events:
            return
        self._sample()
        self._dispatch_batch(events, received)
        self.counters["dispatched"] += len(events)

    def _sample(self) -> None:
        """Every `SAMPLE_EVERY` calls, note when this batch's dispatching began."""
        self._sample_in -= 1
        if not self._sample_in:
            self._sample_in = SAMPLE_EVERY
            if self._sampled is None:
                self._sampled = time.perf_counter()

    def _dispatch(self, event: Event) -> None:
        names = self.names_seen
        if len(names) < MAX_NAMES_SEEN:
            names.update(event.values)
        for key, ev in self._match(event):
            key.deliver(ev)
        for sink in self.sinks:
            try:
                sink(event)
            except Exception:
                log.exception("event sink %r failed", sink)
        for many in self.batch_sinks:
            try:
                many((event,), None)
            except Exception:
                log.exception("event sink %r failed", many)

    def _dispatch_batch(self, events: list[Event], received: FloodGroup | None = None) -> None:
        """`_dispatch` of each of *events*: all their deliveries, then the sinks, each sink
        given the events in order."""
        names = self.names_seen
        if len(names) < MAX_NAMES_SEEN:
            for event in events:
                names.update(event.values)
                if len(names) >= MAX_NAMES_SEEN:
                    break
        self.engine.deliver_each(events)
        for sink in self.sinks:
            for event in events:
                try:
                    sink(event)
                except Exception:
                    log.exception("event sink %r failed", sink)
        for many in self.batch_sinks:
            try:
                many(events, received)
            except Exception:
                log.exception("event sink %r failed", many)

    def queued(self, client: Writable) -> None:
        """*client* queued deliveries during this batch: write to it at `flush`."""
        self._dirty.append(client)

    def forget(self, client: Writable) -> None:
        """*client* closed: nothing more to write to it."""
        if client in self._dirty:
            self._dirty.remove(client)

    def flush(self) -> None:
        """The batch is handled: write every client's queued deliveries now."""
        dirty = self._dirty
        if dirty:
            self._dirty = []
            for client in dirty:
                client.flush()
            if self._sampled is not None:
                self.timing.observe(time.perf_counter() - self._sampled)
        self._sampled = None  # a batch that delivered nothing is not timed
