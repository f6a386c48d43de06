"""The router's place in the mesh (Å §4.1): peer links, flooding, control messages, discovery,
the poison list and the persisted topology. One `MeshService` per `Router` (`router.mesh`).

How an event crosses the mesh
-----------------------------
Events travel in flood groups (`aa.mesh.protocol.peering.FloodGroup`: a ttl, a path, the events' ids,
and the events packed once into an opaque blob; the form and why are in `aa.mesh.protocol.peering`).

A client's event is stamped by its router (`Router._accept`, with `FloodRules.originate`:
ttl and a path holding this router), dispatched locally, and queued once for the whole mesh
(`_forward_local`). When the batch is handled (`flush`), the events queued since the last
flush are packed into one blob, in groups of at most `MAX_GROUP_EVENTS`, and every link
queues the same group object: N peers cost one encoding, not N.

A peer's `Flood` frame is read by its `PeerLink` (the codec checks each group's header) and
handed to `_receive_flood`, which works per group, in this order — the order is the point:

1. A path holding this router means the copy went round a cycle: all of it is a
   duplicate (`aa.mesh.flood` rule 2).
2. The ids are looked up in the seen-id set (rule 1). If every one is there, the group is
   dropped *without unpacking its blob*: where flood fronts meet (two in a ring, n-1 per
   router in a full mesh) most copies end here, for the price of a set lookup per id.
3. Otherwise the hop is worked out, once for the group (ttl - 1, and the path with this
   router appended: rule 3), and the blob is unpacked and checked (`FloodGroup.decode`:
   well-formed events whose ids are exactly the header's; if not, the frame is malformed
   and the link closed, as for any bad frame). Only then are the ids recorded as seen, one
   by one: an event whose id is already there (or twice in the group) is a duplicate; the
   others are fresh, dispatched with a meta map carrying the hop's ttl and path (the
   blob's are stale after the first hop; see `aa.mesh.protocol.peering`). Checking before
   recording means a bad blob marks nothing seen, so the same events arriving intact by
   another route are not lost.
4. Fresh events are forwarded, while the ttl lasts, to every link whose router is not on
   the new path and that is not the link they came on (`FloodRules.forward_to`). If the
   whole group was fresh, that is the *same blob bytes* under the new header: relaying
   encodes nothing. If some were duplicates here (copies racing on a cyclic mesh), only
   the fresh ones are re-encoded into a new blob: rare, and never the common case of a
   line or a ring's two arcs.

Exactly-once dispatch rests on step 3 alone: an event is dispatched only by the
`SeenIds.check` that records its id, so at most once per router, whatever groups, splits and
routes its copies take; dropping a whole group in step 2 only ever drops ids already
recorded (the look-up there records nothing, and at worst treats an id that is about to age
out as still seen, as a check a moment earlier would have). Queued groups are written as one
`Flood` frame per link once the batch that produced them is handled, so a router relays
thousands of events per system call.

One seen-id set (`Router._seen`) serves client publishes and floods alike, so an event a
client re-publishes after a fail-over (same id, another router) is recognised wherever the
mesh has already carried it.

Acknowledgements. A client's `Publish` is acknowledged once its events are dispatched here
*and* their `Flood` frames have been handed to the operating system for every peer
(`ack_when_flooded`). A router killed after acknowledging therefore loses nothing that the
client will not resend: the events are in the kernel's socket buffers, which it sends on
after the process is gone (on loopback they are in the peer's receive buffer already). While
a peer's socket is congested, acks wait: the publisher's window of unacknowledged frames is
the mesh's backpressure.

Keeping the mesh
----------------
Routers found by discovery (beacons, zeroconf), configured (`RouterConfig.peers`), read from
the topology file, or told by other routers (hellos, `PeerRouters`) go into a `PeerTable`.
Every entry that is due is dialled, except told ones while discovery is off: a mesh wired by
hand keeps the shape it was given. A dial that fails, and a link that breaks, poison the
address: it is dialled again after exponentially growing intervals (`PeerTable`). Two routers
that dial each other at once end up with two links; both keep the one dialled by the router
with the smaller id and retire the other with a goodbye in each direction, which loses no
event (`aa.router.peerlink`). Idle links carry pings; a link silent for
`MeshConfig.link_timeout` is broken (a pulled cable closes nothing by itself).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import logging
import ssl
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from aa.mesh import (
    Beacon,
    Control,
    Discovery,
    Event,
    FloodRules,
    KnownRouter,
    PeerHello,
    PeerRouters,
    PeerTable,
    RouterInfo,
    Source,
    UsageError,
    format_endpoint,
    load_topology,
    parse_endpoint,
    save_topology,
)
from aa.mesh import is_unspecified
from aa.mesh import MAX_TTL
from aa.mesh.protocol import GetMesh, MeshInfo
from aa.mesh.protocol import PROTOCOL_VERSION, Message
from aa.mesh.protocol import MAX_GROUP_EVENTS, MAX_KNOWN_ROUTERS, MESH_PROTOCOL_VERSION, FloodGroup
from aa.mesh import PeerEntry, PeerState
from aa.mesh import TOPOLOGY_FILE

from .meshconfig import MeshConfig
from .meshinfo import ROUTER_INFO_TOPIC, MeshView
from .peerlink import PeerLink

if TYPE_CHECKING:
    from .router import Router
    from .session import ClientSession

__all__ = ["MeshService", "ControlCallback", "MAX_PEER_LINKS", "MAX_ALTERNATIVES"]

log = logging.getLogger("aa.router.mesh")

#: Called with each control message of a topic this router receives.
ControlCallback = Callable[[Control], None]

#: Most links with peer routers at once, in links. Å meshes are tens of routers; every link
#: costs a copy of every event, so a router refuses more peers than that.
MAX_PEER_LINKS: Final = 128
#: Dials in progress at once, in dials: bounds sockets and tasks when discovery reports many
#: routers together.
MAX_CONCURRENT_DIALS: Final = 16
#: Client endpoints given to a client that asks for alternatives, in endpoints.
MAX_ALTERNATIVES: Final = 32
#: Seconds between checks of held acknowledgements while a peer's socket is congested: the
#: added ack latency under load (deliveries are not delayed by it).
ACK_POLL_INTERVAL: Final = 0.002
#: Seconds between two warnings about events dropped for a slow peer.
DROP_LOG_INTERVAL: Final = 60.0
#: Seconds a save of the topology file is put off after a change, to write once for a burst
#: of changes (a router joining a mesh of twenty brings twenty links up).
SAVE_DELAY: Final = 1.0
#: Shortest gap between two router-info floods, in seconds: a link coming up asks for one
#: out of turn (so `aa mesh` shows it soon), and twenty links coming up at once make one.
INFO_MIN_GAP: Final = 1.0
#: Shortest sleep of the housekeeping loop, in seconds (never spin).
_MIN_TICK: Final = 0.005


class MeshService:
    """The peer links of one router and everything that flows on them.

    Other components use the control-message API::

        cancel = router.mesh.on_control("quench.prototype", handle)   # handle(control)
        router.mesh.flood_control("quench.prototype", {"pattern": "..."}, to=None)

    Controls are flooded like events (same de-duplication, ttl and path) and reach every
    router once; the origin's own callbacks are not called. `to`, when given, names the one
    client or router the control is for: it still travels everywhere, and the callback of the
    router that holds that client acts on it.
    """

    def __init__(self, router: "Router") -> None:
        self.router = router
        self.id = router.id
        self.config: MeshConfig = router.config.mesh
        cfg = self.config
        self.rules = FloodRules(router.id, seen=router._seen, initial_ttl=cfg.ttl)
        self.table = PeerTable(
            own_id=router.id,
            retry_base=cfg.retry_base,
            retry_max=cfg.retry_max,
            stable_after=cfg.stable_after,
            jitter=cfg.retry_jitter,
        )
        discovery = router.config.discovery
        self.discovery_config = dataclasses.replace(discovery, peers=discovery.peers + router.config.peers)
        #: Links in use, by peer router id (one per peer).
        self.links: dict[str, PeerLink] = {}
        self.counters: Counter[str] = Counter()
        self.view = MeshView(self)
        self.discovery: Discovery | None = None
        #: Our mesh endpoint as we tell it ("0.0.0.0:port" when listening on every address:
        #: receivers put the address they see in its place).
        self.advertised = "0.0.0.0:0"
        self._link_list: list[PeerLink] = []
        self._all_links: set[PeerLink] = set()
        self._dirty_links: list[PeerLink] = []
        #: Events this router originated since the last flush, packed once for all links.
        self._local: list[Event] = []
        self._flush_scheduled = False
        self._controls: dict[str, list[ControlCallback]] = {}
        self._held: deque[tuple["ClientSession", int, list[tuple[PeerLink, int]]]] = deque()
        self._ack_poll: asyncio.TimerHandle | None = None
        self._dialing: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._save_task: asyncio.Task[None] | None = None
        self._save_at: float | None = None
        self._topology_path: Path | None = None
        self._last_drop_log = -DROP_LOG_INTERVAL
        self._next_info = 0.0
        self._last_info = -INFO_MIN_GAP
        self._closing = False
        router.forwarders.append(self._forward_local)
        router.handoffs.append(self._handoff)
        self.on_control(ROUTER_INFO_TOPIC, self.view.on_info)

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the topology file, start discovery and the housekeeping loop. Returns once
        discovery's sockets are bound; raises `OSError` if one cannot be."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        host, port = self.router.address
        self.advertised = format_endpoint(host, port)
        if not is_unspecified(host):
            self.table.record_self(self.advertised)
        data_dir = self.router.config.data_dir
        if data_dir is not None:
            self._topology_path = Path(data_dir) / TOPOLOGY_FILE
            await asyncio.to_thread(Path(data_dir).mkdir, parents=True, exist_ok=True)
            n = await asyncio.to_thread(
                load_topology, self._topology_path, self.table, now=time.monotonic(), wall_now=time.time()
            )
            if n:
                log.info("read %d known routers from %s", n, self._topology_path)
        config = self.discovery_config
        beacon = None
        if config.enabled:
            beacon = Beacon(router_id=self.id, name=self.router.name[:128], peer=self.advertised, client=self.advertised)
        self.discovery = Discovery(config, on_found=self._found, beacon=beacon)
        await self.discovery.start()
        self._task = self._loop.create_task(self._run(), name=f"aa-mesh-{self.id}")

    async def aclose(self) -> None:
        """Say goodbye to every peer (what is queued goes first), stop discovery, save the
        topology. Idempotent."""
        if self._closing or self._loop is None:
            return
        self._closing = True
        tasks = [t for t in (self._task, *self._dialing.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.discovery is not None:
            await self.discovery.aclose()
        links = list(self._all_links)
        for link in links:
            link.retire()
        waits = [link.closed for link in links if not link.closed.done()]
        if waits:
            grace = min(self.router.config.shutdown_grace, self.config.link_timeout)
            await asyncio.wait(waits, timeout=grace)
            for link in links:
                if not link.closed.done():
                    link.abort()
        self._release_acks(force=True)  # the links are flushed and closed: nothing waits
        if self._ack_poll is not None:
            self._ack_poll.cancel()
            self._ack_poll = None
        if self._save_task is not None:
            await asyncio.gather(self._save_task, return_exceptions=True)
        if self._topology_path is not None:
            await self._save()

    # -- the public face --------------------------------------------------------------------

    def add_peer(self, address: str) -> None:
        """Dial the router at *address* ("host:port") from now on, as if configured. Raises
        `InvalidValue` for a malformed address."""
        self.table.add(address, source=Source.CONFIGURED, now=time.monotonic())
        self._poke()

    def peer_ids(self) -> list[str]:
        """Ids of the routers we have a link with."""
        return list(self.links)

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

    def flood_control(self, topic: str, body: Mapping[str, Any] | None = None, *, to: str | None = None) -> str:
        """Send a control message to every router of the mesh; returns its id. Raises
        `InvalidValue` for a bad topic or a body outside the value model."""
        cid = self.router._ids()
        hop = self.rules.originate(cid, time.monotonic())
        assert hop is not None  # a fresh id
        msg = Control(id=cid, ttl=hop.ttl, path=tuple(hop.path), topic=topic, body=dict(body or {}), to=to)
        for link in self._link_list:
            link.send(msg)
        self.counters["controls_out"] += len(self._link_list)
        return cid

    def alternatives(self) -> tuple[str, ...]:
        """Client endpoints of other routers: our peers first, then the rest of the mesh."""
        out: list[str] = []
        for link in self._link_list:
            if link.client_endpoint and link.client_endpoint not in out:
                out.append(link.client_endpoint)
        for endpoint in self.view.remote_clients():
            if endpoint not in out and endpoint != self.advertised:
                out.append(endpoint)
        return tuple(out[:MAX_ALTERNATIVES])

    def info(self) -> dict[str, Any]:
        """The mesh as this router knows it (see `aa.mesh.protocol.meshinfo.MeshInfo`)."""
        return self.view.info()

    # -- outgoing events --------------------------------------------------------------------

    def _forward_local(self, event: Event) -> None:
        # A client's event: its path holds only this router, so every peer gets it. Queued
        # once for the mesh and packed at the flush, into one blob every link shares.
        if self._link_list:
            self._local.append(event)
            if not self._flush_scheduled:
                self._schedule_flush()

    def _flush_local(self) -> None:
        """Pack the events this router originated since the last flush and queue them on
        every link (the same groups for all)."""
        events, self._local = self._local, []
        links = self._link_list
        if not events or not links:
            return
        rules = self.rules
        path = (self.id,)  # what `FloodRules.originate` stamped on each of them
        for start in range(0, len(events), MAX_GROUP_EVENTS):
            try:
                group = FloodGroup.encode(events[start:start + MAX_GROUP_EVENTS], ttl=rules.initial_ttl, path=path)
            except UsageError as exc:  # never for events a router accepted and stamped
                log.error("cannot flood %d events: %s", len(events[start:start + MAX_GROUP_EVENTS]), exc)
                continue
            for link in links:
                link.queue_group(group)

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Pack the events this router originated, then write every link's queued groups
        now (one frame per link)."""
        self._flush_scheduled = False
        if self._local:
            self._flush_local()
        dirty = self._dirty_links
        if dirty:
            self._dirty_links = []
            for link in dirty:
                link.flush()

    def _after_batch(self) -> None:
        self.router._flush_dirty()
        self.flush()

    def ack_when_flooded(self, session: "ClientSession", seq: int) -> None:
        """Acknowledge a client's publish once its events are in the kernel for every peer
        (see the module docstring). Acks leave in the order they were asked for."""
        self.flush()
        if self._held:
            waits = [(link, link.written) for link in self._link_list]
        else:
            waits = [(link, link.written) for link in self._link_list if link.unsent(link.written)]
            if not waits:
                session.ack(seq)
                return
        self._held.append((session, seq, waits))
        self._release_acks()
        self._arm_ack_poll()

    def _arm_ack_poll(self) -> None:
        # One timer at most: the transports tell nobody when their buffers drain.
        if self._held and self._ack_poll is None and self._loop is not None:
            self._ack_poll = self._loop.call_later(ACK_POLL_INTERVAL, self._on_ack_poll)

    def _on_ack_poll(self) -> None:
        self._ack_poll = None
        self._release_acks()
        self._arm_ack_poll()

    def _release_acks(self, force: bool = False) -> None:
        held = self._held
        while held:
            session, seq, waits = held[0]
            if not force and any(link.unsent(target) for link, target in waits):
                return
            held.popleft()
            session.ack(seq)

    def _dropped(self, link: PeerLink, n: int) -> None:
        self.counters["dropped_slow"] += n
        now = time.monotonic()
        if now - self._last_drop_log >= DROP_LOG_INTERVAL:
            self._last_drop_log = now
            log.warning(
                "peer %s does not keep up: %d events dropped for it (%d in all so far)",
                link.label, n, self.counters["dropped_slow"],
            )

    # -- incoming floods --------------------------------------------------------------------

    def _receive_flood(self, link: PeerLink, groups: Iterable[FloodGroup]) -> None:
        # The hot path of a relaying router (the steps and why they are safe are in the module
        # docstring): no logging, no call per event that can be saved. The forwarding targets
        # (`FloodRules.forward_to`: never back to the link it came on, never to a router on
        # the path) are worked out once per frame and filtered once per group by path.
        me = self.id
        seen = self.rules.seen
        check = seen.check
        dispatch = self.router.dispatch
        came_from = link.remote_id
        outs = [(out, out.remote_id) for out in self._link_list if out is not link and out.remote_id != came_from]
        now = time.monotonic()
        n = dups = 0
        try:
            for group in groups:
                ids = group.ids
                k = len(ids)
                n += k
                path = group.path
                if me in path:  # round a cycle back to us (rule 2)
                    dups += k
                    continue
                # Step 2: unread if every id was seen. `not in` records nothing; it stops at the
                # first fresh id, so a fresh group costs one look-up here.
                for eid in ids:
                    if eid not in seen:
                        break
                else:
                    dups += k
                    continue
                # The hop (rule 3), once per group, as `FloodRules.receive` works it out: a ttl
                # over the maximum is clamped; a spent one is still dispatched, not forwarded.
                ttl = group.ttl
                ttl = (ttl if ttl <= MAX_TTL else MAX_TTL) - 1
                if ttl < 0:
                    ttl = 0
                new_path = list(path)
                new_path.append(me)
                # Step 3: check the events (MalformedFrame closes the link; nothing was recorded),
                # then record and dispatch the fresh ones.
                events = group.decode(ttl=ttl, path=new_path)
                fresh: list[Event] = []
                for ev in events:
                    if check(ev.id, now):  # type: ignore[arg-type]  # decode checked: a str
                        dispatch(ev)
                        fresh.append(ev)
                if len(fresh) != k:
                    dups += k - len(fresh)
                # Step 4: forward, the same blob if nothing was dropped here.
                if ttl <= 0 or not fresh or not outs:
                    continue
                if len(fresh) == k:
                    out_group = FloodGroup.trusted(ttl, new_path, ids, group.blob)
                else:
                    out_group = FloodGroup.encode(fresh, ttl=ttl, path=new_path)
                for out, rid in outs:
                    if rid not in new_path:
                        out.queue_group(out_group)
        finally:  # a malformed group ends the frame (and the link): count what came
            counters = self.counters
            counters["events_in"] += n
            counters["frames_in"] += 1
            if dups:
                counters["duplicates"] += dups

    def _receive_control(self, link: PeerLink, msg: Control) -> None:
        self.counters["controls_in"] += 1
        hop = self.rules.receive(msg.id, msg.ttl, msg.path, time.monotonic())
        if hop is None:
            self.counters["control_duplicates"] += 1
            return
        for callback in list(self._controls.get(msg.topic, ())):
            try:
                callback(msg)
            except Exception:
                log.exception("control callback %r for %r failed", callback, msg.topic)
        targets = self.rules.forward_to(hop, list(self.links), link.remote_id)
        if targets:
            copy_ = msg.forwarded(hop.ttl, hop.path)
            for rid in targets:
                target = self.links.get(rid)
                if target is not None:
                    target.send(copy_)
            self.counters["controls_out"] += len(targets)

    # -- links coming and going -------------------------------------------------------------

    def _hello(self) -> PeerHello:
        return PeerHello(
            router_id=self.id,
            name=self.router.name[:128],
            peer=self.advertised,
            client=self.advertised,
            routers=tuple(self._known_routers()),
        )

    def _known_routers(self) -> list[KnownRouter]:
        """What we tell peers: the routers we are linked with, and those we heard of first
        hand (configured, discovered) and have not failed. Never hearsay: a dead address
        must not live on by being repeated."""
        out: list[KnownRouter] = []
        seen: set[str] = set()
        for link in self._link_list:
            if link.address and link.address not in seen:
                seen.add(link.address)
                out.append(KnownRouter(peer=link.address, router_id=link.remote_id, client=link.client_endpoint,
                                       name=link.remote.name if link.remote else None))
        for e in self.table:
            if len(out) >= MAX_KNOWN_ROUTERS:
                break
            if e.address in seen or e.state is PeerState.POISONED:
                continue
            if e.source is Source.CONFIGURED or e.source is Source.DISCOVERED:
                seen.add(e.address)
                out.append(KnownRouter(peer=e.address, router_id=e.router_id))
        return out[:MAX_KNOWN_ROUTERS]

    def _handoff(self, session: "ClientSession", msg: Message) -> bool:
        """A connection's first frame was not a client hello: a peer router calling, or a
        tool asking about the mesh."""
        if type(msg) is GetMesh:
            session.send(MeshInfo(info=self.info()))
            return True
        if type(msg) is not PeerHello or self._closing:
            return False
        if len(self._all_links) >= MAX_PEER_LINKS:
            log.warning("refusing peer %s: already %d links", msg.router_id, MAX_PEER_LINKS)  # type: ignore[attr-defined]
            return False
        refusal = self.router.security.admit_peer(session.identity, session.host, msg.router_id)  # type: ignore[attr-defined]
        if refusal is not None:  # mutual TLS, ids bound to certificates, --allow-peers
            log.warning("refusing peer %s from %s: %s", msg.router_id, session.address, refusal)  # type: ignore[attr-defined]
            self.counters["refused_peers"] += 1
            session.fail("forbidden", refusal)
            return True
        transport, codec = session.detach()
        link = PeerLink(self, address=None, outgoing=False, codec=codec)
        transport.set_protocol(link)
        link.connection_made(transport)
        self._all_links.add(link)
        link.send(self._hello())
        self._link_up(link, msg)  # type: ignore[arg-type]
        # Frames that came in the same read as the hello are in the codec already.
        if self._loop is not None:
            self._loop.call_soon(link.process)
        return True

    def _link_up(self, link: PeerLink, hello: PeerHello) -> None:
        now = time.monotonic()
        rid = hello.router_id
        if rid == self.id:
            # We dialled ourselves (an address of ours we did not know): never again.
            if link.outgoing and link.address:
                self.table.record_self(link.address)
            link.close()
            if not link.ready.done():
                link.ready.set_result(False)
            return
        if hello.protocol != MESH_PROTOCOL_VERSION:
            log.warning(
                "peer %s speaks mesh protocol %d, we speak %d: closing", rid, hello.protocol, MESH_PROTOCOL_VERSION
            )
            link.fail("protocol", f"mesh protocol {MESH_PROTOCOL_VERSION} only")
            return
        if link.outgoing and link.transport is not None:
            gate = self.router.security
            refusal = gate.admit_peer(gate.identity(link.transport), None, rid)
            if refusal is not None:  # the router we dialled is not who it says
                log.warning("refusing peer %s at %s: %s", rid, link.address, refusal)
                if link.address is not None:
                    gate.guard.refused(link.address, now)
                link.fail("forbidden", refusal)
                if not link.ready.done():
                    link.ready.set_result(False)
                return
        link.remote = hello
        link.remote_id = rid
        link.state = "up"
        link.since = now
        host = link.remote_host
        peer_address = _fill(hello.peer, host) if hello.peer else None
        if link.client_endpoint is None and hello.client:
            link.client_endpoint = _fill(hello.client, host)
        if not link.outgoing:
            link.address = peer_address
            if peer_address is not None:
                self._add(peer_address, Source.TOLD, now, rid)
        if link.address is not None:
            self.table.record_success(link.address, now, router_id=rid)
            self.router.security.guard.succeeded(link.address)
        self._learn(hello.routers, link)
        existing = self.links.get(rid)
        if existing is not None and existing is not link:
            # Two links with one router (we dialled each other at once): both sides keep the
            # one dialled by the smaller id, and retire the other.
            smaller = min(self.id, rid)
            dialer_new = self.id if link.outgoing else rid
            dialer_old = self.id if existing.outgoing else rid
            keep_new = dialer_new != dialer_old and dialer_new == smaller
            loser = existing if keep_new else link
            if keep_new:
                self._unregister(existing)
            loser.retire()
            if loser is link:
                if not link.ready.done():
                    link.ready.set_result(False)
                return
        self.links[rid] = link
        self._link_list.append(link)
        if not link.ready.done():
            link.ready.set_result(True)
        log.info(
            "peer %s up (%s %s)", link.label, "dialled" if link.outgoing else "from", link.address or link.remote_host
        )
        self._info_soon(now)
        self._save_soon()

    def _info_soon(self, now: float) -> None:
        at = max(now, self._last_info + min(INFO_MIN_GAP, self.config.info_interval))
        if at < self._next_info:
            self._next_info = at
            self._poke()

    def _unregister(self, link: PeerLink) -> None:
        if link.remote_id is not None and self.links.get(link.remote_id) is link:
            del self.links[link.remote_id]
            self._link_list.remove(link)

    def _link_lost(self, link: PeerLink, previous: str, exc: Exception | None) -> None:
        self._all_links.discard(link)
        if self._closing:
            return
        now = time.monotonic()
        rid = link.remote_id
        if rid is not None and self.links.get(rid) is link:
            self._unregister(link)
            if link.address is not None:
                if link.clean:
                    self.table.record_closed(link.address, now)
                    log.info("peer %s left", link.label)
                else:
                    retry = self.table.record_failure(link.address, now)
                    wait = f"; next attempt in {retry - now:.1f} s" if retry is not None else ""
                    log.info("peer %s lost (%s)%s", link.label, exc or "connection closed", wait)
            self._save_soon()
            self._poke()
        elif previous not in ("hello",) and link.address is not None:
            winner = self.links.get(rid) if rid is not None else None
            if winner is None or winner.address != link.address:
                self.table.record_closed(link.address, now)
        self._release_acks()

    # -- learning about routers -------------------------------------------------------------

    def _found(self, info: RouterInfo) -> None:
        """Discovery found a router (or reports a configured endpoint)."""
        if info.protocol is not None and info.protocol != PROTOCOL_VERSION:
            log.debug("ignoring router %s: protocol %s", info.router_id, info.protocol)
            return
        self._add(info.peer, info.source, time.monotonic(), info.router_id)

    def _learn(self, routers: Iterable[KnownRouter], link: PeerLink) -> None:
        """A peer told us routers it knows."""
        now = time.monotonic()
        for r in routers:
            # An unspecified host is filled with the teller's address only for the teller
            # itself: for anyone else it says nothing about where that router is.
            if r.router_id == link.remote_id:
                peer = _fill(r.peer, link.remote_host)
            elif is_unspecified(parse_endpoint(r.peer)[0]):
                continue
            else:
                peer = r.peer
            self._add(peer, Source.TOLD, now, r.router_id)

    def _add(self, address: str, source: Source, now: float, router_id: str | None) -> None:
        try:
            entry = self.table.add(address, source=source, now=now, router_id=router_id)
        except UsageError as exc:
            log.debug("ignoring router address %r: %s", address, exc)
            return
        if entry is not None and self._dialable(entry) and entry.next_attempt <= now:
            self._poke()

    def _dialable(self, entry: PeerEntry) -> bool:
        if entry.state is not PeerState.IDLE and entry.state is not PeerState.POISONED:
            return False
        if entry.source is Source.TOLD and not self.discovery_config.enabled:
            return False
        if entry.router_id is not None and entry.router_id in self.links:
            return False
        return entry.address not in self._dialing

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- dialling ---------------------------------------------------------------------------

    def _dial_due(self, now: float) -> None:
        for address in self.table.due(now):
            if len(self._dialing) >= MAX_CONCURRENT_DIALS:
                return
            entry = self.table.get(address)
            if entry is None or not self._dialable(entry):
                continue
            assert self._loop is not None
            task = self._loop.create_task(self._dial(address), name=f"aa-dial-{address}")
            self._dialing[address] = task
            task.add_done_callback(functools.partial(self._dial_done, address))

    def _dial_done(self, address: str, _task: "asyncio.Task[None]") -> None:
        self._dialing.pop(address, None)
        self._poke()

    def _next_dial(self, now: float) -> float | None:
        soonest = None
        for e in self.table:
            if e.next_attempt > now and self._dialable(e):
                soonest = e.next_attempt if soonest is None else min(soonest, e.next_attempt)
        return soonest

    async def _dial(self, address: str) -> None:
        assert self._loop is not None
        self.table.record_attempt(address, time.monotonic())
        link: PeerLink | None = None
        gate = self.router.security
        try:
            host, port = parse_endpoint(address)
            if not gate.may_dial(address, host, time.monotonic()):
                raise ConnectionRefusedError("refused its handshake lately, or not in --allow-peers")
            async with asyncio.timeout(self.config.connect_timeout):
                try:
                    _, link = await self._loop.create_connection(
                        lambda: PeerLink(self, address=address, outgoing=True), host, port, ssl=gate.dial_tls,
                        server_hostname=host if gate.dial_tls else None,
                    )
                except ssl.SSLError:  # another CA, expired, no TLS: one handshake per back-off
                    gate.guard.refused(address, time.monotonic())
                    raise
                self._all_links.add(link)
                link.send(self._hello())
                await link.ready
        except asyncio.CancelledError:
            if link is not None:
                link.abort()
            raise
        except Exception as exc:  # refused, unreachable, timed out, a bad hello: all poison
            if link is not None:
                link.abort()
            now = time.monotonic()
            retry = self.table.record_failure(address, now)
            wait = f"; next attempt in {retry - now:.1f} s" if retry is not None else ""
            log.info("peer %s unavailable: %s%s", address, exc or type(exc).__name__, wait)

    # -- housekeeping -----------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wake is not None
        cfg = self.config
        keepalive_every = max(cfg.keepalive / 2, _MIN_TICK)
        now = time.monotonic()
        next_keepalive = now + keepalive_every
        self._next_info = now + cfg.info_interval
        next_save = now + cfg.save_interval
        while True:
            now = time.monotonic()
            self._dial_due(now)
            if now >= next_keepalive:
                self._keepalive(now)
                next_keepalive = now + keepalive_every
            if now >= self._next_info:
                self._send_info(now)
                self._tell_routers()
                self.view.expire(now)
                self.rules.seen.expire(now)
                self._next_info = now + cfg.info_interval
            if self._topology_path is not None and (
                now >= next_save or (self._save_at is not None and now >= self._save_at)
            ):
                self._spawn_save()
                next_save = now + cfg.save_interval
            wake = min(next_keepalive, self._next_info)
            if self._topology_path is not None:
                wake = min(wake, next_save, self._save_at if self._save_at is not None else wake)
            dial_at = self._next_dial(now)
            if dial_at is not None:
                wake = min(wake, dial_at)
            self._wake.clear()
            try:
                async with asyncio.timeout(max(wake - time.monotonic(), _MIN_TICK)):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _keepalive(self, now: float) -> None:
        from aa.mesh.protocol import Ping

        cfg = self.config
        for link in list(self._all_links):
            if now - link.last_heard >= cfg.link_timeout:
                if link.state == "up":
                    log.info("peer %s silent for %.1f s: link broken", link.label, now - link.last_heard)
                link.abort()
            elif link.state == "up" and now - link.last_sent >= cfg.keepalive:
                link.send(Ping())

    def _send_info(self, now: float) -> None:
        self._last_info = now
        if self._link_list:
            self.flood_control(ROUTER_INFO_TOPIC, self.view.summary())

    def _tell_routers(self) -> None:
        if self._link_list:
            msg = PeerRouters(routers=tuple(self._known_routers()))
            for link in self._link_list:
                link.send(msg)

    def _save_soon(self) -> None:
        if self._topology_path is not None:
            at = time.monotonic() + SAVE_DELAY
            if self._save_at is None or at < self._save_at:
                self._save_at = at
                self._poke()

    def _spawn_save(self) -> None:
        self._save_at = None
        if self._save_task is None or self._save_task.done():
            assert self._loop is not None
            self._save_task = self._loop.create_task(self._save())

    async def _save(self) -> None:
        if self._topology_path is None:
            return
        # A copy taken in the loop: the file is written in a thread while links come and go.
        snapshot = copy.deepcopy(self.table)
        try:
            await asyncio.to_thread(
                save_topology, self._topology_path, snapshot, now=time.monotonic(), wall_now=time.time()
            )
        except OSError as exc:
            log.warning("cannot save the topology to %s: %s", self._topology_path, exc)


def _fill(endpoint: str, host: str | None) -> str:
    """*endpoint* with an unspecified host replaced by *host* (the address we see it at)."""
    h, port = parse_endpoint(endpoint)
    if is_unspecified(h) and host:
        return format_endpoint(host, port)
    return endpoint
