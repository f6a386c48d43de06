"""The router's place in the mesh (Å §4.1): its peer links, their life cycle, and the
housekeeping that keeps the mesh. One `MeshService` per `Router` (`router.mesh`).

The flood itself — events and control messages in and out, and the rules that make each
router dispatch each event once — is `aa.router.links.relay`; which routers to dial and the
topology file are `aa.router.links.dialer`; one connection is `aa.router.links.peerlink`.
This module composes them and owns the set of links.

Links coming and going
----------------------
Two routers that dial each other at once end up with two links; both keep the one dialled
by the router with the smaller id and retire the other with a goodbye in each direction,
which loses no event (`aa.router.links.peerlink`). Idle links carry pings; a link silent
for `MeshConfig.link_timeout` is broken (a pulled cable closes nothing by itself). Every
`MeshConfig.info_interval` the router floods its summary (`aa.router.links.meshview`) and
tells its peers the routers it knows.

Acknowledgements of client publishes wait for the links' bytes to reach the kernel: that
rule is `aa.router.acks`, which reads the links' write marks through `marks` and `unsent`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from aa.mesh import (
    Beacon,
    Control,
    Discovery,
    DiscoveryConfig,
    Event,
    FloodRules,
    KnownRouter,
    PeerHello,
    PeerRouters,
    Source,
    format_endpoint,
    is_unspecified,
    parse_endpoint,
)
from aa.mesh.protocol import MESH_PROTOCOL_VERSION, FloodGroup, MeshInfo, Ping

from ..seams import Dispatch, RouterFacts
from .config import MeshConfig
from .dialer import Dialer, fill_host
from .interests import InterestService
from .meshview import ROUTER_INFO_TOPIC, MeshView
from .peerlink import PeerLink
from .relay import ControlCallback, Relay

__all__ = ["MeshService", "MAX_PEER_LINKS", "MAX_ALTERNATIVES"]

log = logging.getLogger("aa.router.links")

#: Most links with peer routers at once, in links. Å meshes are tens of routers; every link
#: costs a copy of every event, so a router refuses more peers than that.
MAX_PEER_LINKS: Final = 128
#: Client endpoints given to a client that asks for alternatives, in endpoints.
MAX_ALTERNATIVES: Final = 32
#: Shortest gap between two router-info floods, in seconds: a link coming up asks for one
#: out of turn (so `aa mesh` shows it soon), and twenty links coming up at once make one.
INFO_MIN_GAP: Final = 1.0
#: Shortest sleep of the housekeeping loop, in seconds (never spin).
_MIN_TICK: Final = 0.005


class MeshService:
    """The peer links of one router and everything that flows on them.

    Other rooms use the control-message API::

        cancel = router.mesh.on_control("quench.prototype", handle)   # handle(control)
        router.mesh.flood_control("quench.prototype", {"pattern": "..."}, to=None)

    Controls are flooded like events (same de-duplication, ttl and path) and reach every
    router once; the origin's own callbacks are not called. `to`, when given, names the one
    client or router the control is for: it still travels everywhere, and the callback of the
    router that holds that client acts on it.
    """

    def __init__(
        self,
        facts: RouterFacts,
        config: MeshConfig,
        discovery: DiscoveryConfig,
        *,
        rules: FloodRules,
        dispatch: Dispatch,
        new_id: Callable[[], str],
        data_dir: Any = None,
        shutdown_grace: float = 5.0,
    ) -> None:
        self.facts = facts
        self.id = facts.id
        self.config = config
        self.discovery_config = discovery
        self._dispatch = dispatch
        self._data_dir = data_dir
        self._shutdown_grace = shutdown_grace
        #: Links in use, by peer router id (one per peer).
        self.links: dict[str, PeerLink] = {}
        self.counters: Counter[str] = Counter()
        self.relay = Relay(
            rules, dispatch=dispatch, new_id=new_id, links=self._in_use, counters=self.counters
        )
        self.rules = rules
        self.dialer = Dialer(
            self.id, config, discovery, connect=self._connect, linked=self._linked, poke=self._poke
        )
        self.table = self.dialer.table
        self.view = MeshView(self)
        #: Who wants what, and where an event goes (`aa.router.links.interests`).
        self.interests = InterestService(self)
        self.relay.interests = self.interests
        self.discovery: Discovery | None = None
        #: Our mesh endpoint as we tell it ("0.0.0.0:port" when listening on every address:
        #: receivers put the address they see in its place).
        self.advertised = "0.0.0.0:0"
        #: TLS and peer admission (`aa.router.security.Gate`), set by the router: dialled
        #: links use its context and must show the certificate their id claims. None: plain.
        self.security: Any = None
        #: Called when links may have written what acks wait for, or went away.
        self.on_drained: Callable[[], None] = lambda: None
        #: Called with a peer's router id when a link with it comes up (store sync).
        self.on_link_up: list[Callable[[str], None]] = []
        self._link_list: list[PeerLink] = []
        self._all_links: set[PeerLink] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._next_info = 0.0
        self._last_info = -INFO_MIN_GAP
        self._closing = False
        self.relay.on_control(ROUTER_INFO_TOPIC, self.view.on_info)

    # -- life cycle -------------------------------------------------------------------------

    async def start(self, address: tuple[str, int]) -> None:
        """Read the topology file, start discovery and the housekeeping loop, for a router
        listening on *address*. Returns once discovery's sockets are bound; raises
        `OSError` if one cannot be."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        host, port = address
        self.advertised = format_endpoint(host, port)
        if not is_unspecified(host):
            self.table.record_self(self.advertised)
        await self.dialer.load(self._data_dir)
        config = self.discovery_config
        beacon = None
        if config.enabled:
            name = self.facts.name[:128]
            beacon = Beacon(
                router_id=self.id, name=name, peer=self.advertised, client=self.advertised
            )
        self.discovery = Discovery(config, on_found=self.dialer.found, beacon=beacon)
        await self.discovery.start()
        self._task = self._loop.create_task(self._run(), name=f"aa-mesh-{self.id}")

    async def aclose(self) -> None:
        """Say goodbye to every peer (what is queued goes first), stop discovery, save the
        topology. Idempotent."""
        if self._closing or self._loop is None:
            return
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.interests.close()
        await self.dialer.cancel_dials()
        if self.discovery is not None:
            await self.discovery.aclose()
        links = list(self._all_links)
        for link in links:
            link.retire()
        waits = [link.closed for link in links if not link.closed.done()]
        if waits:
            await asyncio.wait(waits, timeout=min(self._shutdown_grace, self.config.link_timeout))
            for link in links:
                if not link.closed.done():
                    link.abort()
        await self.dialer.close()

    # -- the public face --------------------------------------------------------------------

    def add_peer(self, address: str) -> None:
        """Dial the router at *address* ("host:port") from now on, as if configured. Raises
        `InvalidValue` for a malformed address."""
        self.table.add(address, source=Source.CONFIGURED, now=time.monotonic())
        self._poke()

    def forget(self, router: str) -> dict[str, Any]:
        """Forget the router *router* names — its id, its name, or an address of it: drop it
        from the peer table (and so from the topology file, saved at once) and from the
        picture of the mesh. A router linked with this one now is not forgotten (it would be
        heard of again at once): stop it first. Returns the ``forget`` map of the answer
        (`aa.mesh.protocol.ForgetRouter`)."""
        out: dict[str, Any] = {"router": router, "forgotten": [], "refused": None}
        # Every id the reference may mean: itself, the id behind a name, behind an address.
        ids = {router}
        for link in self.links.values():
            if link.remote is not None and link.remote.name == router and link.remote_id:
                ids.add(link.remote_id)
        named = self.view.names().get(router)
        if named is not None:
            ids.add(named)
        ids.update(e.router_id for e in self.table if e.address == router and e.router_id)
        if self.id in ids or router in (self.facts.name, self.advertised):
            out["refused"] = f"{router} is this router: it cannot forget itself"
            return out
        if any(rid in self.links for rid in ids) or any(
            link.address == router for link in self.links.values()
        ):
            out["refused"] = f"{router} is linked with this router now: stop it first"
            return out
        forgotten: dict[str, dict[str, Any]] = {}
        for key in sorted(ids):
            for e in self.dialer.forget(key):
                forgotten[e.address] = {"id": e.router_id, "name": None, "address": e.address}
        for rid in sorted(ids):
            body = self.view.summary_of(rid)
            if not self.view.forget(rid):
                continue
            same = [f for f in forgotten.values() if f["id"] == rid]
            for f in same:
                f["name"] = body.get("name")
            if not same:
                forgotten[rid] = {"id": rid, "name": body.get("name"), "address": body.get("peer")}
        out["forgotten"] = list(forgotten.values())
        if forgotten:
            log.info("forgot router %s: %s", router, ", ".join(sorted(forgotten)))
        return out

    def peer_ids(self) -> list[str]:
        """Ids of the routers we have a link with."""
        return list(self.links)

    def on_control(self, topic: str, callback: ControlCallback) -> Callable[[], None]:
        """See `Relay.on_control`."""
        return self.relay.on_control(topic, callback)

    def flood_control(
        self, topic: str, body: Mapping[str, Any] | None = None, *, to: str | None = None
    ) -> str:
        """See `Relay.flood_control`."""
        return self.relay.flood_control(topic, body, to=to)

    def send_control(self, peer_id: str, topic: str, body: Mapping[str, Any]) -> bool:
        """Send a control message to the peer *peer_id* only (ttl 0: it goes no further);
        False without a link to it. Raises `InvalidValue` for a body outside the model."""
        link = self.links.get(peer_id)
        if link is None:
            return False
        msg = Control(
            id=self.relay.new_id(), ttl=0, path=(self.id,), topic=topic, body=dict(body), to=peer_id
        )
        link.send(msg)
        self.counters["controls_out"] += 1
        return True

    def originated(self, events: Sequence[Event]) -> None:
        """A client's events stamped here: flood them (a forwarder of dispatch)."""
        self.relay.originated(events)

    def flush(self) -> None:
        """Write every link's queued floods now."""
        self.relay.flush()

    def alternatives(self) -> tuple[str, ...]:
        """Client endpoints of other routers: our peers first, then the rest of the mesh."""
        return self.view.alternatives(MAX_ALTERNATIVES)

    def info(self) -> dict[str, Any]:
        """The mesh as this router knows it (see `aa.mesh.MeshInfo`)."""
        return self.view.info()

    # -- what the ack rule reads (aa.router.acks) -------------------------------------------

    def marks(self, *, all_links: bool) -> Sequence[tuple[PeerLink, int]]:
        """(link, bytes written so far) for every link in use, or only those with bytes
        still ours to send."""
        if all_links:
            return [(link, link.written) for link in self._link_list]
        return [(link, link.written) for link in self._link_list if link.unsent(link.written)]

    @staticmethod
    def unsent(link: PeerLink, mark: int) -> bool:
        """Whether some of the first *mark* bytes written on *link* are still ours to send."""
        return link.unsent(mark)

    def cut(self, link: PeerLink, reason: str) -> None:
        """Break *link* because *reason*: it is lost (poisoned, dialled again later with
        growing back-off) and what waited on it goes on."""
        if link.state == "closed":
            return
        self.counters["links_cut"] += 1
        log.warning(
            "cutting the link with peer %s: %s", link.label, reason, extra={"peer": link.label}
        )
        link.abort()

    # -- what a link tells us (aa.router.links.peerlink) ------------------------------------

    def batch_done(self) -> None:
        """A link handled what it read: write what the batch queued for clients and peers."""
        self._dispatch.flush()
        self.relay.flush()

    def receive_flood(self, link: PeerLink, groups: Sequence[FloodGroup]) -> None:
        self.relay.receive_flood(link, groups)

    def receive_control(self, link: PeerLink, msg: Control) -> None:
        self.relay.receive_control(link, msg)

    def learn(self, link: PeerLink, routers: Sequence[KnownRouter]) -> None:
        self.dialer.learn(routers, link.remote_id, link.remote_host)

    def takes_peer(self, hello: PeerHello) -> bool:
        """Whether a peer router that called (its first frame is *hello*) is taken in."""
        if self._closing:
            return False
        if len(self._all_links) >= MAX_PEER_LINKS:
            log.warning("refusing peer %s: already %d links", hello.router_id, MAX_PEER_LINKS)
            return False
        return True

    def handoff(self, transport: Any, codec: Any, hello: PeerHello) -> None:
        """Take over a connection whose first frame was *hello* (`takes_peer` said yes):
        from now on it is a `PeerLink`."""
        msg = hello
        link = PeerLink(self, address=None, outgoing=False, codec=codec)
        transport.set_protocol(link)
        link.connection_made(transport)
        self._all_links.add(link)
        link.send(self._hello())
        self.link_up(link, msg)
        # Frames that came in the same read as the hello are in the codec already.
        asyncio.get_running_loop().call_soon(link.process)

    def link_up(self, link: PeerLink, hello: PeerHello) -> None:
        now = time.monotonic()
        rid = hello.router_id
        if rid == self.id:
            # We dialled ourselves (an address of ours we did not know): never again.
            if link.outgoing and link.address:
                self.table.record_self(link.address)
            link.close()
            link.settle(False)
            return
        if hello.protocol != MESH_PROTOCOL_VERSION:
            log.warning(
                "peer %s speaks mesh protocol %d, we speak %d: closing",
                rid,
                hello.protocol,
                MESH_PROTOCOL_VERSION,
            )
            link.fail("protocol", f"mesh protocol {MESH_PROTOCOL_VERSION} only")
            return
        gate = self.security
        if gate is not None and link.outgoing and link.transport is not None:
            refusal = gate.admit_peer(gate.identity(link.transport), None, rid)
            if refusal is not None:  # the router we dialled is not who it says
                log.warning("refusing peer %s at %s: %s", rid, link.address, refusal)
                if link.address is not None:
                    gate.guard.refused(link.address, now)
                link.fail("forbidden", refusal)
                link.settle(False)
                return
        squatter = self._claims_live_id(link, rid, now)
        if squatter is not None:
            if gate is not None:
                gate.refusals.note(link.remote_host or "?", squatter, now)
            else:
                log.warning("%s", squatter)
            self.counters["refused_duplicate_ids"] += 1
            link.fail("duplicate-id", squatter)
            link.settle(False)
            return
        host = link.remote_host
        link.mark_up(
            hello,
            now,
            address=None
            if link.outgoing
            else (fill_host(hello.peer, host) if hello.peer else None),
            client_endpoint=fill_host(hello.client, host) if hello.client else None,
        )
        if not link.outgoing and link.address is not None:
            self.dialer.add(link.address, Source.TOLD, now, rid)
        if link.address is not None:
            self.table.record_success(link.address, now, router_id=rid)
            if gate is not None:
                gate.guard.succeeded(link.address)
        self.dialer.learn(hello.routers, rid, host)
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
                link.settle(False)
                return
        self.links[rid] = link
        self._link_list.append(link)
        link.settle(True)
        self.interests.links_changed()  # before any event is relayed on the new link
        self.interests.hand_over(rid)  # the summaries we hold, so its side need not wait
        log.info(
            "peer %s up (%s %s)",
            link.label,
            "dialled" if link.outgoing else "from",
            link.address or link.remote_host,
            extra={"peer": link.label},
        )
        self._info_soon(now)
        self.dialer.save_soon()
        for hook in self.on_link_up:
            hook(rid)

    def _claims_live_id(self, link: PeerLink, rid: str, now: float) -> str | None:
        """Why *link*, whose hello claims router id *rid*, may not take the place of the live
        link with that id, or None. Without mutual TLS anyone may claim any id, and letting
        the newcomer win cut the real neighbour's link (events in flight on it were lost): a
        live link (heard within the link timeout) that is older than one keep-alive interval
        is never displaced; the newcomer is refused until the old link's keep-alive proves it
        dead. Two honest routers that dial each other at once bring their links up within a
        round trip of each other, so they still settle by the rule in `link_up`. With mutual
        TLS the id is bound to the certificate, and the same rule holds for the same router."""
        existing = self.links.get(rid)
        gate = self.security
        if existing is None or existing is link or (gate is not None and gate.mutual):
            return None
        cfg = self.config
        if existing.state != "up" or existing.since is None:
            return None
        if now - existing.since < cfg.keepalive or now - existing.last_heard >= self._timeout(
            existing
        ):
            return None
        return (
            f"refusing peer {rid} from {link.address or link.remote_host}: that router id has "
            "a live link here (retry once it is gone)"
        )

    def link_lost(self, link: PeerLink, previous: str, exc: Exception | None) -> None:
        self._all_links.discard(link)
        if self._closing:
            return
        now = time.monotonic()
        rid = link.remote_id
        if rid is not None and self.links.get(rid) is link:
            self._unregister(link)
            self.interests.links_changed()
            if link.address is not None:
                if link.clean:
                    self.table.record_closed(link.address, now)
                    log.info("peer %s left", link.label, extra={"peer": link.label})
                else:
                    retry = self.table.record_failure(link.address, now)
                    wait = f"; next attempt in {retry - now:.1f} s" if retry is not None else ""
                    log.info(
                        "peer %s lost (%s)%s",
                        link.label,
                        exc or "connection closed",
                        wait,
                        extra={"peer": link.label},
                    )
            self.dialer.save_soon()
            self._poke()
        elif previous not in ("hello",) and link.address is not None:
            winner = self.links.get(rid) if rid is not None else None
            if winner is None or winner.address != link.address:
                self.table.record_closed(link.address, now)
        self.on_drained()

    # -- inside -----------------------------------------------------------------------------

    def _in_use(self) -> list[PeerLink]:
        return self._link_list

    def _linked(self) -> Mapping[str, PeerLink]:
        return self.links

    def _hello(self) -> PeerHello:
        return PeerHello(
            router_id=self.id,
            name=self.facts.name[:128],
            peer=self.advertised,
            client=self.advertised,
            routers=tuple(self.dialer.known_routers(self._link_list)),
            keepalive=self.config.keepalive,
            detours=True,
        )

    async def _connect(self, address: str) -> None:
        """Dial *address*; return once the link is the one in use for its peer (or a
        duplicate); raise for a refusal, a timeout or a bad hello."""
        assert self._loop is not None
        link: PeerLink | None = None
        gate = self.security
        tls = gate.dial_tls if gate is not None else None
        try:
            host, port = parse_endpoint(address)
            if gate is not None and not gate.may_dial(address, host, time.monotonic()):
                raise ConnectionRefusedError(
                    "refused its handshake lately, or not in --allow-peers"
                )
            async with asyncio.timeout(self.config.connect_timeout):
                try:
                    _, link = await self._loop.create_connection(
                        lambda: PeerLink(self, address=address, outgoing=True),
                        host,
                        port,
                        ssl=tls,
                        server_hostname=host if tls is not None else None,
                    )
                except ssl.SSLError:  # another CA, expired, no TLS: one handshake per back-off
                    if gate is not None:
                        gate.guard.refused(address, time.monotonic())
                    raise
                self._all_links.add(link)
                link.send(self._hello())
                await link.ready
        except BaseException:
            if link is not None:
                link.abort()
            raise

    def _info_soon(self, now: float) -> None:
        at = max(now, self._last_info + min(INFO_MIN_GAP, self.config.info_interval))
        if at < self._next_info:
            self._next_info = at
            self._poke()

    def _unregister(self, link: PeerLink) -> None:
        if link.remote_id is not None and self.links.get(link.remote_id) is link:
            del self.links[link.remote_id]
            self._link_list.remove(link)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        cfg = self.config
        dialer = self.dialer
        keepalive_every = max(cfg.keepalive / 2, _MIN_TICK)
        now = time.monotonic()
        next_keepalive = now + keepalive_every
        self._next_info = now + cfg.info_interval
        next_expire = self._next_info
        next_save = now + cfg.save_interval
        while True:
            now = time.monotonic()
            dialer.dial_due(now)
            if now >= next_keepalive:
                self._keepalive(now)
                next_keepalive = now + keepalive_every
            if now >= self._next_info:  # a flood over every link: stretched in a big mesh
                self._send_info(now)
                self._next_info = now + self.interests.repeat_interval()
            if now >= next_expire:
                self._tell_routers()
                self.view.expire(now)
                self.rules.seen.expire(now)
                self.relay.control_rules.seen.expire(now)
                next_expire = now + cfg.info_interval
            next_interest = self.interests.tick(now)
            save_at = dialer.save_at
            if dialer.keeps_topology and (
                now >= next_save or (save_at is not None and now >= save_at)
            ):
                dialer.spawn_save()
                next_save = now + cfg.save_interval
            wake = min(next_keepalive, self._next_info, next_expire, next_interest)
            if dialer.keeps_topology:
                wake = min(wake, next_save, dialer.save_at if dialer.save_at is not None else wake)
            dial_at = dialer.next_dial(now)
            if dial_at is not None:
                wake = min(wake, dial_at)
            self._wake.clear()
            try:
                async with asyncio.timeout(max(wake - time.monotonic(), _MIN_TICK)):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _timeout(self, link: PeerLink) -> float:
        """Seconds of silence after which *link* is dead: three keep-alives, the peer's (its
        hello says them) where they are longer than this router's."""
        theirs = link.remote.keepalive if link.remote is not None else None
        return (
            self.config.link_timeout if theirs is None else 3 * max(self.config.keepalive, theirs)
        )

    def _keepalive(self, now: float) -> None:
        cfg = self.config
        for link in list(self._all_links):
            if now - link.last_heard >= self._timeout(link):
                if link.state == "up":
                    log.info(
                        "peer %s silent for %.1f s: link broken",
                        link.label,
                        now - link.last_heard,
                        extra={"peer": link.label},
                    )
                link.abort()
            elif link.state == "up" and now - link.last_sent >= cfg.keepalive:
                link.send(Ping())

    def _send_info(self, now: float) -> None:
        self._last_info = now
        if self._link_list:
            self.flood_control(ROUTER_INFO_TOPIC, self.view.summary())

    def _tell_routers(self) -> None:
        if self._link_list:
            msg = PeerRouters(routers=tuple(self.dialer.known_routers(self._link_list)))
            for link in self._link_list:
                link.send(msg)

    def mesh_info_message(self) -> MeshInfo:
        """The answer to a `GetMesh` (from a tool or a peer)."""
        return MeshInfo(info=self.info())
