"""The flood: events and control messages in and out over the peer links.

How an event crosses the mesh
-----------------------------
Events travel in flood groups (`aa.mesh.protocol.FloodGroup`: a ttl, a path, the events'
ids, and the events packed once into an opaque blob; the form and why are in
`aa.mesh.protocol.peering`).

A client's event is stamped by its router (`aa.router.dispatch`, with
`FloodRules.originate`: ttl and a path holding this router), dispatched locally, and queued
once for the whole mesh (`originated`). When the batch is handled (`flush`), the events
queued since the last flush are packed into one blob, in groups of at most
`MAX_GROUP_EVENTS`, and every link queues the same group object: N peers cost one
encoding, not N.

A peer's `Flood` frame is read by its `PeerLink` (the codec checks each group's header) and
handed to `receive_flood`, which works per group, in this order — the order is the point —
and applies every rule through `aa.mesh.FloodRules`, the implementation the simulated-mesh
tests prove:

1. `FloodRules.hop`: a path holding this router means the copy went round a cycle: all of
   it is a duplicate (rule 2). Otherwise the hop is worked out, once for the group (ttl - 1,
   and the path with this router appended: rule 3).
2. `FloodRules.all_seen`: if every id was met before, the group is dropped *without
   unpacking its blob* (rule 1): where flood fronts meet (two in a ring, n-1 per router in
   a full mesh) most copies end here, for the price of a set lookup per id.
3. The blob is unpacked and checked (`FloodGroup.decode`: well-formed events whose ids are
   exactly the header's; if not, the frame is malformed and the link closed, as for any
   bad frame). Only then is each id recorded (`FloodRules.first`): an event whose id is
   already there (or twice in the group) is a duplicate; the others are fresh, dispatched
   with a meta map carrying the hop's ttl and path (the blob's are stale after the first
   hop). Checking before recording means a bad blob marks nothing seen, so the same events
   arriving intact by another route are not lost.
4. `FloodRules.forward_to`: fresh events are forwarded, while the ttl lasts, to every link
   whose router is not on the new path and that is not the link they came on. If the whole
   group was fresh, that is the *same blob bytes* under the new header: relaying encodes
   nothing. If some were duplicates here (copies racing on a cyclic mesh), only the fresh
   ones are re-encoded into a new blob: rare, and never the common case of a line or a
   ring's two arcs.

Exactly-once dispatch rests on step 3 alone: an event is dispatched only by the
`FloodRules.first` that records its id, so at most once per router, whatever groups, splits
and routes its copies take. Queued groups are written as one `Flood` frame per link once
the batch that produced them is handled, so a router relays thousands of events per system
call. Control messages take the same rules one message at a time (`receive_control`), over
a seen set of their own (`FloodRules.for_controls`), so a flood of them stays bounded apart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from aa.mesh import Control, Detours, Event, FloodRules, UsageError, detour_targets
from aa.mesh.protocol import MAX_GROUP_EVENTS, FloodGroup

from ..seams import Dispatch

if TYPE_CHECKING:
    from .interests import InterestService
    from .peerlink import PeerLink

__all__ = ["Relay", "ControlCallback"]

log = logging.getLogger("aa.router.links")

#: Called with each control message of a topic this router receives.
ControlCallback = Callable[[Control], None]

#: Seconds between two warnings about events dropped for a slow peer.
DROP_LOG_INTERVAL: Final = 60.0


class Relay:
    """The flood on one router's links (see the module docstring)."""

    def __init__(
        self,
        rules: FloodRules,
        *,
        dispatch: Dispatch,
        new_id: Callable[[], str],
        links: Callable[[], list[PeerLink]],
        counters: Counter[str],
    ) -> None:
        self.rules = rules
        #: The same rules over a seen set of control ids of its own, bounded apart.
        self.control_rules = rules.for_controls()
        self._dispatch = dispatch
        self.new_id = new_id
        self._links = links  # the links in use, one per peer
        self.counters = counters
        self._controls: dict[str, list[ControlCallback]] = {}
        #: Events this router originated since the last flush, packed once for all links.
        self._originated: list[Event] = []
        self._dirty: list[PeerLink] = []
        self._flush_scheduled = False
        self._last_drop_log = -DROP_LOG_INTERVAL
        #: Where events go under interest routing (None, or routing "flood": everywhere).
        self.interests: InterestService | None = None
        self._detours: Detours | None = None

    @property
    def detours(self) -> Detours:
        """The ways round congested links, over the interest view."""
        assert self.interests is not None
        if self._detours is None or self._detours.view is not self.interests.table.view:
            self._detours = Detours(self.interests.table.view)
        return self._detours

    # -- control messages -------------------------------------------------------------------

    def on_control(self, topic: str, callback: ControlCallback) -> Callable[[], None]:
        """Call *callback(control)* for each control message of *topic* this router receives
        (once per control, whatever the number of copies). Returns a function that undoes
        the registration. The callback runs in the event loop: keep it quick."""
        self._controls.setdefault(topic, []).append(callback)

        def cancel() -> None:
            callbacks = self._controls.get(topic, [])
            if callback in callbacks:
                callbacks.remove(callback)

        return cancel

    def flood_control(
        self, topic: str, body: Mapping[str, Any] | None = None, *, to: str | None = None
    ) -> str:
        """Send a control message to every router of the mesh; returns its id. Raises
        `InvalidValue` for a bad topic or a body outside the value model."""
        cid = self.new_id()
        hop = self.control_rules.originate(cid, time.monotonic())
        assert hop is not None  # a fresh id
        msg = Control(
            id=cid, ttl=hop.ttl, path=tuple(hop.path), topic=topic, body=dict(body or {}), to=to
        )
        links = self._links()
        for link in links:
            link.send(msg)
        self.counters["controls_out"] += len(links)
        return cid

    def receive_control(self, link: PeerLink, msg: Control) -> None:
        """A peer's control message: rules 1-3, the callbacks of its topic, then onwards."""
        self.counters["controls_in"] += 1
        if (
            not msg.path or msg.path[-1] != link.remote_id
        ):  # each hop appends itself: a forged origin
            self.counters["controls_refused"] += 1
            return
        hop = self.control_rules.receive(msg.id, msg.ttl, msg.path, time.monotonic())
        if hop is None:
            self.counters["control_duplicates"] += 1
            return
        for callback in list(self._controls.get(msg.topic, ())):
            try:
                callback(msg)
            except Exception:
                log.exception("control callback %r for %r failed", callback, msg.topic)
        by_id = {other.remote_id: other for other in self._links()}
        targets = self.control_rules.forward_to(
            hop, [rid for rid in by_id if rid is not None], link.remote_id
        )
        if targets:
            copy_ = msg.forwarded(hop.ttl, hop.path)
            for rid in targets:
                by_id[rid].send(copy_)
            self.counters["controls_out"] += len(targets)

    # -- outgoing events --------------------------------------------------------------------

    def originated(self, events: Sequence[Event]) -> None:
        """A client's events, stamped here (a forwarder of dispatch, given a batch): their
        path holds only this router, so every peer gets them. Queued once for the mesh and
        packed at the flush, into one blob every link shares."""
        if self._links():
            self._originated.extend(events)
            if not self._flush_scheduled:
                self._schedule_flush()

    def flush_originated(self) -> None:
        """Pack the events this router originated since the last flush and queue them on
        every link (the same groups for all). Links call it before a control frame, so a
        peer sees events and controls in the order we sent them."""
        if not self._originated:
            return
        events, self._originated = self._originated, []
        links = self._links()
        if not events or not links:
            return
        path = (self.rules.router_id,)  # what `FloodRules.originate` stamped on each of them
        ttl = self.rules.initial_ttl
        interests = self.interests
        if interests is not None and interests.routes:
            by_id = {link.remote_id: link for link in links if link.remote_id is not None}
            me = self.rules.router_id
            for chosen, to, part in self._route(events, me, None, list(by_id), None, None):
                self._queue(part, ttl, path, [by_id[rid] for rid in chosen], to)
            return
        self._queue(events, ttl, path, links)

    def _queue(
        self,
        events: list[Event],
        ttl: int,
        path: tuple[str, ...],
        links: list[PeerLink],
        to: tuple[str, ...] = (),
    ) -> None:
        """Pack *events* once and queue the groups on every one of *links*."""
        for start in range(0, len(events), MAX_GROUP_EVENTS):
            chunk = events[start : start + MAX_GROUP_EVENTS]
            try:
                group = FloodGroup.encode(chunk, ttl=ttl, path=path, to=to)
            except UsageError as exc:  # never for events a router accepted and stamped
                log.error("cannot flood %d events: %s", len(chunk), exc)
                continue
            for link in links:
                link.queue_group(group)

    def _route(
        self,
        events: list[Event],
        source: str,
        came_from: str | None,
        peers: list[str],
        hop: Any,
        flood_to: list[str] | None,
    ) -> list[tuple[tuple[str, ...], tuple[str, ...], list[Event]]]:
        """*events* split by the peers each goes to under interest routing: the peers the
        rule names (among *peers*, never one on the path), or where a flood goes
        (*flood_to*, or every one of *peers*) when the rule says flood. Each part is
        (peers, the routers a directed copy is for or (), events): an event for a congested
        link goes round it when it can (`aa.mesh.detour`)."""
        assert self.interests is not None
        now = time.monotonic()
        counters = self.counters
        per_event = self.interests.targets_many(source, came_from, events, now)
        if per_event is None:  # unsure: flood them all
            counters["interest_flooded"] += len(events)
            flooded = tuple(flood_to if flood_to is not None else peers)
            return [(flooded, (), events)] if flooded else []
        counters["interest_routed"] += len(events)
        path = hop.path if hop is not None else (self.rules.router_id,)
        parts: dict[tuple[tuple[str, ...], tuple[str, ...]], list[Event]] = {}
        # Events of a group mostly go the same way: the rule's answers are shared tuples,
        # each filtered (and its part found) once, not once per event.
        usable: dict[tuple[str, ...], tuple[str, ...]] = {}
        congested: set[str] | None = None  # asked once some event goes somewhere
        for ev, wanted in zip(events, per_event):
            if not wanted:
                continue  # no link wants it: the common case of local interest
            chosen = usable.get(wanted)
            if chosen is None:
                chosen = usable[wanted] = tuple([p for p in wanted if p in peers and p not in path])
            if congested is None:
                congested = self._congested(peers)
                if congested and not self._can_detour(path, congested):
                    congested = set()  # every event keeps its links: ask nothing per event
            if congested and not congested.isdisjoint(chosen):
                for key in self._detour(source, path, list(chosen), congested, ev):
                    parts.setdefault(key, []).append(ev)
            elif chosen:
                part = parts.get((chosen, ()))
                if part is None:
                    part = parts[(chosen, ())] = []
                part.append(ev)
        return [(to_peers, to, part) for (to_peers, to), part in parts.items()]

    # -- round congested links (`aa.mesh.detour`) --------------------------------------------

    def _congested(self, peers: list[str]) -> set[str]:
        """The *peers* whose links are congested now."""
        if not self.interests or not self.interests.config.congested_above:
            return set()
        return {
            link.remote_id
            for link in self._links()
            if link.remote_id in peers and link.congested and link.remote_id is not None
        }

    def _can_detour(self, path: tuple[str, ...], congested: set[str]) -> bool:
        """Whether a copy that came along *path* could go round any link at all: some
        neighbour of the view, off the path and not *congested*, reads directed copies. A
        directed copy's first hop is always such a neighbour (`Detours.first_hops` avoids
        the path and the congested links), so without one `_detour` keeps every link, and
        working out the routers each event is for would be lost time."""
        assert self.interests is not None
        me = self.rules.router_id
        return any(
            w != me and w not in path and w not in congested and self._reads_detours(w)
            for w in self.interests.table.view.graph().get(me, ())
        )

    def _reads_detours(self, rid: str) -> bool:
        return any(link.remote_id == rid and link.reads_detours for link in self._links())

    def _detour(
        self,
        source: str,
        path: tuple[str, ...],
        chosen: list[str],
        congested: set[str],
        ev: Event,
    ) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        """Where *ev* goes when some of the *chosen* peers are congested: each congested one
        is replaced by directed copies to the neighbours that reach the routers it was for
        (rules 1-2), when all of them can be reached so and read directed copies; else it
        keeps its link. A neighbour that also had the ordinary copy gets one directed copy."""
        assert self.interests is not None
        view = self.interests.table.view
        me = self.rules.router_id
        plain: list[str] = []
        directed: dict[str, list[str]] = {}
        for c in chosen:
            if c not in congested:
                plain.append(c)
                continue
            wanted = detour_targets(view, source, c, ev)
            hops = (
                self.detours.first_hops(me, wanted, blocked=path, avoid=congested)
                if wanted
                else None
            )
            if hops is None or not all(self._reads_detours(h) for h in hops):
                plain.append(c)
                continue
            self.counters["detoured"] += 1
            for h, ts in hops.items():
                directed.setdefault(h, []).extend(ts)
        keys: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
        rest = tuple(p for p in plain if p not in directed)
        if rest:
            keys.append((rest, ()))
        for h, ts in directed.items():
            keys.append(((h,), tuple(sorted(set(ts)))))
        return keys

    def _receive_directed(
        self,
        group: FloodGroup,
        hop: Any,
        came_from: str | None,
        by_id: dict[str, PeerLink],
        peers: list[str],
        now: float,
    ) -> int:
        """A directed copy (rules 3-5 of `aa.mesh.detour`): dispatch what is fresh here,
        send the rest of its targets on their way even if seen, and do what the ordinary
        copy would have; returns the duplicates. Unsure (view unsettled or incomplete), the
        fresh events are flooded as an ordinary copy."""
        rules = self.rules
        me = rules.router_id
        ids = group.ids
        self.counters["directed_in"] += len(ids)
        events = group.decode(ttl=hop.ttl, path=hop.path)  # checked before forwarded
        fresh: list[Event] = []
        dispatch = self._dispatch.dispatch
        for eid, ev in zip(ids, events):
            if rules.first(eid, now):
                dispatch(ev)
                fresh.append(ev)
        allowed = rules.forward_to(hop, peers, came_from)
        interests = self.interests
        table = interests.table if interests is not None else None
        rest = [t for t in group.to if t != me]
        hops: dict[str, list[str]] | None = None
        if table is not None and table.settled(now) and table.view.complete:
            if not rest:
                hops = {}
            else:
                congested = self._congested(peers)
                hops = self.detours.first_hops(me, rest, blocked=hop.path, avoid=congested)
                if hops is None and congested:
                    hops = self.detours.first_hops(me, rest, blocked=hop.path, avoid=())
        if hops is None or any(h not in allowed for h in hops):
            if fresh and allowed:  # unsure: flood what is new here
                out = FloodGroup.encode(fresh, ttl=hop.ttl, path=hop.path)
                for rid in allowed:
                    by_id[rid].queue_group(out)
            return len(ids) - len(fresh)
        for h, ts in hops.items():
            link = by_id[h]
            to = tuple(sorted(ts)) if link.reads_detours else ()
            link.queue_group(FloodGroup.trusted(hop.ttl, hop.path, ids, group.blob, to))
        assert table is not None
        source = hop.path[0]
        tree = table.view.tree(source)
        if fresh and tree is not None and me in tree.parent and not _above(tree.parent, me, rest):
            parent = tree.parent[me]
            for chosen, to, part in self._route(fresh, source, parent, peers, hop, allowed):
                out = FloodGroup.encode(part, ttl=hop.ttl, path=hop.path, to=to)
                for rid in chosen:
                    by_id[rid].queue_group(out)
        return len(ids) - len(fresh)

    def link_dirty(self, link: PeerLink) -> None:
        """*link* queued groups: write them at the next `flush`."""
        self._dirty.append(link)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Pack the events this router originated, then write every link's queued groups
        now (one frame per link)."""
        self._flush_scheduled = False
        if self._originated:
            self.flush_originated()
        dirty = self._dirty
        if dirty:
            self._dirty = []
            for link in dirty:
                link.flush()

    def dropped(self, link: PeerLink, n: int) -> None:
        """*n* events were not queued for *link*: its peer does not keep up."""
        self.counters["dropped_slow"] += n
        now = time.monotonic()
        if now - self._last_drop_log >= DROP_LOG_INTERVAL:
            self._last_drop_log = now
            log.warning(
                "peer %s does not keep up: %d events dropped for it (%d in all so far)",
                link.label,
                n,
                self.counters["dropped_slow"],
            )

    # -- incoming floods --------------------------------------------------------------------

    def receive_flood(self, link: PeerLink, groups: Sequence[FloodGroup]) -> None:
        """A peer's `Flood` frame (steps 1-4 of the module docstring). The hot path of a
        relaying router: no logging, no call per event that can be saved."""
        rules = self.rules
        hop_for = rules.hop
        all_seen = rules.all_seen
        first_many = rules.first_many
        forward_to = rules.forward_to
        dispatch_many = self._dispatch.dispatch_many
        came_from = link.remote_id
        by_id = {
            out.remote_id: out
            for out in self._links()
            if out is not link and out.remote_id is not None  # None: no hello yet, no events
        }
        peers = list(by_id)
        now = time.monotonic()
        routes = self.interests is not None and self.interests.routes
        n = dups = 0
        try:
            for group in groups:
                ids = group.ids
                k = len(ids)
                n += k
                hop = hop_for(group.ttl, group.path)  # step 1 (rules 2 and 3)
                if group.to and hop is not None:  # a directed copy: `aa.mesh.detour`
                    dups += self._receive_directed(group, hop, came_from, by_id, peers, now)
                    continue
                if hop is None or all_seen(ids):  # step 2 (rule 1, recording nothing)
                    dups += k
                    continue
                new_path = hop.path
                # Step 3: check the events (MalformedFrame closes the link; nothing was
                # recorded), then record and dispatch the fresh ones.
                events = group.decode(ttl=hop.ttl, path=new_path)
                fresh = [ev for ev, new in zip(events, first_many(ids, now)) if new]
                # The group under this hop: what the sinks may keep instead of encoding the
                # events again, and what goes on when it all goes one way.
                same = (
                    FloodGroup.trusted(hop.ttl, new_path, ids, group.blob)
                    if len(fresh) == k
                    else None
                )
                dispatch_many(fresh, same)  # decode checked: the ids are ev.id
                if len(fresh) != k:
                    dups += k - len(fresh)
                if not fresh:
                    continue
                targets = forward_to(hop, peers, came_from)  # step 4
                if not targets:
                    continue
                if routes:
                    parts = self._route(fresh, new_path[0], came_from, peers, hop, targets)
                    if len(parts) == 1 and len(parts[0][2]) == k and not parts[0][1]:
                        targets = list(parts[0][0])  # all of it, one way, undirected
                    else:
                        for chosen, to, part in parts:
                            out_group = FloodGroup.encode(part, ttl=hop.ttl, path=new_path, to=to)
                            for rid in chosen:
                                by_id[rid].queue_group(out_group)
                        continue
                if same is not None:
                    out_group = same
                else:
                    out_group = FloodGroup.encode(fresh, ttl=hop.ttl, path=new_path)
                for rid in targets:
                    by_id[rid].queue_group(out_group)
        finally:  # a malformed group ends the frame (and the link): count what came
            link.events_in += n
            counters = self.counters
            counters["events_in"] += n
            counters["frames_in"] += 1
            if dups:
                counters["duplicates"] += dups


def _above(parent: Mapping[str, str | None], me: str, targets: list[str]) -> bool:
    """Whether *me* is above one of *targets* in the tree of *parent*."""
    for t in targets:
        v = parent.get(t)
        while v is not None:
            if v == me:
                return True
            v = parent.get(v)
    return False
