"""The router: its rooms composed, its life cycle, and the embedding program's API.

Embed it in any asyncio program::

    async with Router(RouterConfig(port=0)) as router:
        print(router.address)          # the real (host, port), bound before start() returns
        sub = router.subscribe("Temperature > 100", print)
        router.publish({"Temperature": 101})

An event's way (docs/architecture.md draws it): a client's `Publish` reaches its
`ClientSession`, which keeps what its user may publish and hands that here (`accept_publish`,
of the session's seam `aa.router.seams.SessionHost`): the store screens its policies, the
dispatcher stamps, matches and sinks it and the links flood it (`aa.router.dispatch`),
and the ack rule acknowledges it once durable and flooded (`aa.router.acks`). A peer's flood
reaches the links room, which dispatches each event once through the same dispatcher.

The rooms get only what they use (`aa.router.seams`): the dispatcher, the control-message
API of the links, the pattern engine's matchers, the store for the ack rule. This class is
the one place that knows them all.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, cast

from aa.mesh import (
    Event,
    FloodRules,
    IdGenerator,
    PatternSpec,
    PermissionDenied,
    StoreError,
    UsageError,
    check_values,
)
from aa.mesh.protocol import (
    Bye,
    CacheAck,
    CacheClear,
    CacheFetch,
    CacheKeepalive,
    CachePolicy,
    CacheRegister,
    CacheRemove,
    ForgetRouter,
    GetCached,
    GetCacheInfo,
    GetMesh,
    GetRouters,
    Hello,
    MeshInfo,
    Message,
    PeerHello,
    Quench,
    Routers,
    Unquench,
    Welcome,
)

from .acks import Acknowledgements
from .caches import ClientCacheService, MeshCache
from .config import RouterConfig
from .dispatch import DISPATCH_STEP, Dispatcher
from .eventlog import EventLog
from .links import MeshService, Wants
from .local import LocalSubscription
from .memory import prepare as prepare_trims
from .patterns import ErrorNotice, HostFacts, PatternEngine, SandboxLimits, scope_filter
from .quench import QuenchService
from .seams import DeliveryBatch, SessionLimits, Subscriber
from .security import Gate, Identity, PartialFrames, router_id_for
from .session import ClientSession
from .sinks import LocalSinks
from .store import StoreService, check_history, check_persistable

__all__ = ["Router", "Endpoint"]

log = logging.getLogger("aa.router")

#: Seconds between two looks at the revocation list's file: a revoked user's live
#: connections are cut within this (and a loop turn) of ``aa certs revoke``; one `stat`.
CRL_POLL_INTERVAL = 1.0


def is_loopback(host: str) -> bool:
    """Whether *host* (an address a router listens on) is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


class Endpoint(Protocol):
    """Something served alongside the router (the HTTP endpoint, for instance)."""

    async def start(self, router: Router) -> None: ...

    async def aclose(self) -> None: ...


class Router:
    """A broker, embeddable in any asyncio program. See the module docstring."""

    def __init__(
        self, config: RouterConfig | None = None, *, endpoints: Sequence[Endpoint] = ()
    ) -> None:
        self.config = config = config or RouterConfig()
        #: TLS, users, permissions (`aa.router.security`); raises UsageError for bad files.
        self.security = Gate(config.security)
        prefix = config.id_prefix
        if prefix is None and self.security.name is not None:
            prefix = router_id_for(self.security.name)  # peers check our id against our certificate
        ids = IdGenerator(prefix)
        #: This router's id: random per start of the process, unique in the mesh.
        self.id = ids.prefix
        self.name = config.name or "router"
        self.endpoints = list(endpoints)
        self.counters: Counter[str] = Counter()
        self.started_at: float | None = None
        self.sessions: set[ClientSession] = set()
        #: Bytes of unfinished frames held for all clients together (`aa.router.session`).
        self.partial_frames = PartialFrames()
        self._server: asyncio.Server | None = None
        self._address: tuple[str, int] | None = None
        self._crl_timer: asyncio.TimerHandle | None = None
        self._local_client = f"local:{self.id}"
        self.engine = PatternEngine(
            host=HostFacts(
                router_id=self.id,
                router_name=self.name,
                clock=lambda: datetime.now(UTC),
                peer_count=self.peer_count,
            ),
            limits=SandboxLimits(time_budget=config.pattern_time_budget),
            on_failure=self._pattern_failed,
            on_errors=self._pattern_erred,
            on_deliveries=self._worker_deliveries,
            workers=config.workers,
        )
        rules = FloodRules(self.id, initial_ttl=config.mesh.ttl)
        #: Stamping, matching, sinks and forwarding of each event (`aa.router.dispatch`).
        self.dispatcher = Dispatcher(
            ids=ids, rules=rules, engine=self.engine, counters=self.counters
        )
        self.dispatcher.after_step = self._flush_sinks
        #: Peer links, flooding, control messages, discovery (`aa.router.links`).
        self.mesh = MeshService(
            self,
            config.mesh,
            config.discovery_with_peers(),
            rules=rules,
            dispatch=self.dispatcher,
            new_id=self.dispatcher.new_id,
            data_dir=config.data_dir,
            shutdown_grace=config.shutdown_grace,
        )
        self.mesh.security = self.security  # mutual TLS on dialled links, ids bound to certificates
        self.dispatcher.forwarders.append(self.mesh.originated)
        cc = config.caches
        #: The mesh cache (None when `CacheConfig.mesh_cache` is off).
        self.mesh_cache = (
            MeshCache(max_events=cc.mesh_cache_events, max_bytes=cc.mesh_cache_bytes)
            if cc.mesh_cache
            else None
        )
        #: The event log, once started (None: off).
        self.event_log: EventLog | None = None
        self._sinks: LocalSinks | None = None
        #: The persistent store and history (`aa.router.store`).
        self.storage = StoreService(
            config.store,
            data_dir=config.data_dir,
            mesh_cache=self.mesh_cache,
            matcher=self.engine.matcher,
            matches_prototype=self.engine.matches_prototype,
            select=self.engine.select,
            dispatch=self.dispatcher,
            counters=self.counters,
            router_id=self.id,
            router_name=lambda: self.name,
            flush_cache=self._flush_sinks,
        )
        self.storage.sync.attach(self.mesh)
        self.mesh.on_link_up.append(self.storage.sync.link_up)
        #: When a client's publish is acknowledged (`aa.router.acks`).
        self.acks = Acknowledgements(self.mesh, stall_after=config.mesh.keepalive)
        self.mesh.on_drained = self.acks.release
        #: The mesh cache's requests and the client caches, kept in step across the mesh.
        self.caches = ClientCacheService(
            cc,
            controls=self.mesh,
            matcher=self.engine.matcher,
            sinks=self.dispatcher.sinks,
            mesh_cache=self.mesh_cache,
            flush_cache=self._flush_sinks,
        )
        if self.security.permissions.path is not None:  # caches see what their owner may
            self.caches.scope_of = lambda owner: self.security.scope_of(Identity(user=owner))
        #: Quench registrations and notifications across the mesh (`aa.router.quench`).
        self.quench = QuenchService(
            self.id,
            config.quench,
            engine=self.engine,
            controls=self.mesh,
        )
        # Interest routing: what this router wants, told again when subscriptions change.
        wants = Wants(self)
        self.mesh.interests.collect = wants
        self.mesh.interests.collect_listening = wants.listening
        self.quench.on_change.append(self.mesh.interests.changed)
        if config.mesh.routing == "interest":  # one mechanism: quench answers from summaries
            self.quench.use_summaries(self.mesh.interests)
        self.caches.on_change.append(self.mesh.interests.caches_changed)

    # -- life cycle -------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) clients and peers connect to; known once `start()` returned."""
        if self._address is None:
            raise UsageError("the router has not been started")
        return self._address

    @property
    def endpoint(self) -> str:
        host, port = self.address
        return f"{host}:{port}"

    async def start(self) -> None:
        """Bind every socket, then return. Raises OSError if the port is taken."""
        loop = asyncio.get_running_loop()
        prepare_trims()  # its thread made now, not among thousands of caches' freed blocks
        await self._open_storage()  # raises StoreUnavailable before anything is bound
        try:
            if self.config.security.active:  # TLS and address ranges: our own accept loop
                self._server = cast(
                    asyncio.Server,
                    await self.security.serve(  # duck-types a Server
                        lambda: ClientSession(self),
                        self.config.host,
                        self.config.port,
                        self.counters,
                    ),
                )
            else:
                self._server = await loop.create_server(
                    lambda: ClientSession(self),
                    self.config.host,
                    self.config.port,
                    reuse_address=True,
                )
        except BaseException:
            await self._close_storage()
            raise
        await self.caches.start()
        await self.quench.start()
        sock = self._server.sockets[0]
        host, port = sock.getsockname()[:2]
        self._address = (host, port)
        if self.config.name is None:
            self.name = self.config.display_name(port)
        self.started_at = time.monotonic()
        try:
            await self.mesh.start(self._address)
        except BaseException:
            self._server.close()
            self._server = None
            await self.quench.aclose()
            await self.caches.aclose()
            await self._close_storage()
            raise
        for endpoint in self.endpoints:
            await endpoint.start(self)
        log.info("router %s (%s) listening on %s:%d", self.name, self.id, host, port)
        if self.open:
            log.warning(
                "listening on %s:%d without TLS: anyone who reaches this port may join the mesh "
                "and read and publish everything ('aa certs', --cert/--key/--ca)",
                host,
                port,
            )
        if self.config.security.crl is not None:
            self._crl_timer = loop.call_later(CRL_POLL_INTERVAL, self._poll_crl)

    async def _open_storage(self) -> None:
        await self.storage.start()
        store = self.storage.store
        try:
            self._sinks = await LocalSinks.open(
                self.config,
                self.id,
                persist=self.storage.persist if store else None,
                mesh_cache=self.mesh_cache,
            )
        except BaseException:
            await self.storage.aclose()
            raise
        self.event_log = self._sinks.event_log
        self.acks.use_store(self.storage if store is not None else None)
        sink = self._sinks.sink()
        if sink is not None:
            self.dispatcher.batch_sinks.append(sink)

    async def _close_storage(self) -> None:
        """Write what is queued (acks waiting for the store go out first), close the store
        and the event log."""
        self._flush_sinks()
        try:
            if self.acks.waiting_for_store():
                try:
                    async with asyncio.timeout(self.config.shutdown_grace):
                        await self.storage.flush()  # wakes the waiting acks first (same seq order)
                except (TimeoutError, StoreError):
                    pass
            await self.storage.aclose()
        finally:
            self.event_log = None
            if self._sinks is not None:
                await self._sinks.aclose()

    async def aclose(self) -> None:
        """Stop accepting, deliver what is in flight, say goodbye, close. Idempotent."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        if self._crl_timer is not None:
            self._crl_timer.cancel()
            self._crl_timer = None
        await self.mesh.aclose()
        self.acks.release(force=True)  # the links are flushed and closed: nothing waits on them
        for endpoint in reversed(self.endpoints):
            try:
                await endpoint.aclose()
            except Exception:
                log.exception("endpoint %r failed to close", endpoint)
        await self.quench.aclose()
        await self.caches.aclose()
        try:
            await self._close_storage()  # writes what is queued: waiting acks go before the byes
        except Exception:
            log.exception("the store failed to close")
        self.acks.close()
        await self.engine.aclose()  # the pattern workers
        self.dispatcher.flush()
        sessions = list(self.sessions)
        for s in sessions:
            s.send(Bye())
            s.close()
        waits = [s.closed for s in sessions]
        if waits:
            await asyncio.wait(waits, timeout=self.config.shutdown_grace)
            for s in sessions:
                if s.transport is not None and not s.closed.done():
                    s.transport.abort()
        await server.wait_closed()

    async def __aenter__(self) -> Router:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the embedding program's API --------------------------------------------------------

    def publish(
        self,
        values: Mapping[str, Any],
        *,
        type: str | None = None,
        meta: Mapping[str, Any] | None = None,
        id: str | None = None,
        client_id: str | None = None,
        address: str = "local",
        user: str | None = None,
        scope: str | None = None,
    ) -> Event | None:
        """Publish from inside this process; returns the stamped event, or None if *id* was
        already seen (a retried publish). *user* is stamped as `meta["user"]` (for the HTTP
        endpoint to pass a token's owner); *scope* is the id scope a proposed *id* must
        carry (`aa.mesh.id_scope`; the HTTP endpoint passes its client's). Raises
        `InvalidValue` for values outside the model, `InvalidPolicy` for a malformed store
        policy in *meta* (`aa.router.store`)."""
        event = Event(values=dict(values), type=type, meta=dict(meta or {}), id=id)
        if meta:
            check_persistable(event)
        stamped = self.dispatcher.accept(
            [event], client_id or self._local_client, address, user, scope
        )
        self.dispatcher.flush()
        return stamped[0] if stamped else None

    def subscribe(
        self,
        pattern: str | PatternSpec,
        callback: Callable[[Event], Any] | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        format: str = "expr",
        kernel: str = "python",
        history: Mapping[str, Any] | None = None,
        scope: tuple[str, ...] | None = None,
    ) -> LocalSubscription:
        """Subscribe from inside this process. With *history* (``{"since": datetime | None}``)
        the stored events the pattern matches come first, oldest first, marked historical,
        then the live ones (`aa.router.store.HistoryReplay`). *scope* (event type patterns,
        `aa.router.patterns.scope`) is what the pattern may see, for a caller acting for a
        user (the HTTP endpoint); None: every event. Raises `PatternError` for a refused
        pattern, `UsageError` for a bad *history*."""
        spec = (
            pattern
            if isinstance(pattern, PatternSpec)
            else PatternSpec(kernel=kernel, format=format, source=pattern)
        )
        sub = LocalSubscription(self, callback, client_id=self._local_client)
        if scope is not None and "*" not in scope:
            sub.scope = tuple(scope)
            sub.receives = scope_filter(sub.scope)  # history replay shows the pattern only these
        self.add_subscription(sub, spec, dict(params or {}), history)
        self.subscription_added(sub, history)
        return sub

    async def history(
        self,
        pattern: str | PatternSpec,
        *,
        since: datetime | None = None,
        limit: int | None = None,
        include_cache: bool = True,
        receives: Callable[[str | None], bool] | None = None,
    ) -> list[Event]:
        """Stored events *pattern* matches — and mesh-cached ones too with *include_cache* —
        with a time at or after *since* (an aware datetime), oldest first, each id once, at
        most *limit*, marked historical (`GET /events` serves this).

        >>> # await router.history("Temperature > 30", since=datetime.now(timezone.utc) -
        timedelta(hours=3))

        *receives* (a test of event types) limits what the pattern is shown to what the asking
        user may receive (the HTTP endpoint passes `Gate.receive_filter`).

        Raises `PatternError` for a refused pattern, `UsageError` for a bad argument,
        `StoreUnavailable` when the store cannot be read.
        """
        return await self.storage.history(
            pattern, since=since, limit=limit, include_cache=include_cache, receives=receives
        )

    @property
    def open(self) -> bool:
        """Listening off loopback without TLS: anyone who reaches the port is in."""
        return (
            self._address is not None
            and not self.security.config.tls
            and not is_loopback(self._address[0])
        )

    def reload_security(self) -> list[str]:
        """Read the permissions and the revocation list again (SIGHUP), then hold every live
        session and peer link to them: revoked or no longer admitted ones are cut, patterns
        no longer allowed stopped, each told why. A malformed file is refused and what was in
        force stays. Returns what happened, a line each."""
        gate = self.security
        said = []
        if gate.config.permissions is not None:
            said.append(gate.reload())
        crl = gate.reload_crl()
        if crl is not None:
            said.append(crl)
        self.recheck_sessions()
        return said

    def recheck_sessions(self) -> None:
        """Hold live sessions and peer links to the rules and revocations in force now."""
        gate = self.security
        for session in list(self.sessions):
            session.recheck()
        for link in list(self.mesh.links.values()):
            if link.transport is None:
                continue
            revoked = gate.certificate_refusal(gate.identity(link.transport))
            if revoked is not None:
                log.warning("cutting peer %s: %s", link.label, revoked, extra={"peer": link.label})
                link.fail("revoked", revoked)
        self.caches.rescope()
        for hook in gate.reloaded:
            hook()

    def _poll_crl(self) -> None:
        """Re-read the revocation list when its file changed; again in `CRL_POLL_INTERVAL`."""
        self._crl_timer = None
        if self._server is None:
            return
        try:
            if self.security.crl_changed():
                self.security.reload_crl()  # logs what it did
                self.recheck_sessions()
        finally:
            if self._server is not None:
                loop = asyncio.get_running_loop()
                self._crl_timer = loop.call_later(CRL_POLL_INTERVAL, self._poll_crl)

    def peer_count(self) -> int:
        """Peer routers this router has a link with."""
        return len(self.mesh.links)

    def alternatives(self) -> tuple[str, ...]:
        """Client endpoints of other routers, for clients to fail over to."""
        return self.mesh.alternatives()

    def mesh_info(self) -> dict[str, Any]:
        """The mesh as this router knows it: every router's peers, poison list and counters
        (layout: `aa.mesh.MeshInfo`; served by `aa mesh` and `GET /mesh`)."""
        return self.mesh.info()

    def summary(self) -> dict[str, Any]:
        """What the mesh picture says of this router (`aa.router.seams.RouterFacts`)."""
        counters = self.counters
        return {
            "uptime": time.monotonic() - self.started_at if self.started_at else 0.0,
            "clients": len(self.sessions),
            "dispatched": counters.get("dispatched", 0),
            "published": counters.get("published", 0),
            "client_duplicates": counters.get("duplicates", 0),
            "open": self.open,
            "permissions": self.security.rules_digest(),
            "crl": self.security.crl_number(),
        }

    def stats(self) -> dict[str, Any]:
        """Counters and sizes, for `aa mesh` and the monitor."""
        storage = self.storage.stats()
        if self.mesh_cache is not None:
            storage["mesh_cache"] = {"events": len(self.mesh_cache), "bytes": self.mesh_cache.bytes}
        if self.event_log is not None:
            e = self.event_log.stats()
            storage["event_log"] = {
                "rows": e.rows,
                "files": e.files,
                "dropped": e.dropped,
                "errors": e.errors,
                "deleted": e.deleted,
                "waiting": e.waiting,
            }
        return {
            "id": self.id,
            "name": self.name,
            "endpoint": self.endpoint if self._address else None,
            "uptime": time.monotonic() - self.started_at if self.started_at else 0.0,
            "clients": len(self.sessions),
            "subscriptions": len(self.engine),
            "patterns": self.engine.instance_count,
            "counters": dict(self.counters),
            "storage": {**storage, "client_caches": len(self.caches)},
            "workers": self.engine.workers.stats() if self.engine.workers is not None else None,
        }

    # -- what a client session asks (aa.router.session) -------------------------------------

    @property
    def limits(self) -> SessionLimits:
        """The bounds each client connection is held to (from the config)."""
        return self.config

    @property
    def deliveries(self) -> DeliveryBatch:
        """The batch client deliveries wait in until it is handled (the dispatcher)."""
        return self.dispatcher

    def tier(self, spec: PatternSpec) -> str:
        """The tier *spec* runs in (`PatternEngine.tier`)."""
        return self.engine.tier(spec)

    def accept_publish(
        self,
        session: ClientSession,
        seq: int,
        events: Sequence[Event],
        *,
        until: float | None = None,
        done: Callable[[], None] | None = None,
    ) -> None:
        """The *events* of a client's publish frame *seq* its user may publish: screen
        their store policies, dispatch and flood them, then acknowledge the frame when the
        rule allows (`aa.router.acks`). With *until* (`time.perf_counter()`), what is left
        when it passes is dispatched on later turns of the loop
        (`Dispatcher.accept_in_steps`); *done* is called after the last."""
        storage = self.storage
        events, persisted = storage.screen(session, events)  # bad store policies refused
        refused = storage.refused
        client_id, address, user = session.client_id or "?", session.address, session.identity.user

        def handled() -> None:
            self.acks.publish_handled(
                session, seq, persisted=persisted, refused=storage.refused - refused
            )
            if done is not None:
                done()

        if until is None or len(events) <= DISPATCH_STEP:
            try:
                self.dispatcher.accept(events, client_id, address, user, session.id_scope)
            finally:
                handled()
            return
        self.dispatcher.accept_in_steps(
            events,
            client_id,
            address,
            user,
            session.id_scope,
            until=until,
            going_on=lambda: session.is_open,
            then=handled,
        )

    def add_subscription(
        self,
        key: Hashable,
        spec: PatternSpec,
        params: Mapping[str, Any],
        history: Mapping[str, Any] | None,
    ) -> None:
        """Register *key*'s pattern. Raises `PatternError`, `UsageError` (bad params or
        history); nothing is registered then."""
        check_values(params, "params")
        check_history(history)
        self.engine.subscribe(key, spec, params)

    def subscription_added(
        self,
        key: Hashable,
        history: Mapping[str, Any] | None,
        away: tuple[float, Callable[[int, bool], None]] | None = None,
    ) -> None:
        """*key* was registered and told so: replay its history (or, back after *away*
        seconds without a router, count the stored events it missed), tell quenching."""
        self.storage.on_subscribe(key, history)
        if away is not None and history is None:
            self.storage.count_away(key, *away)
        self.quench.subscribed(key)

    def subscription_notes(
        self,
        spec: PatternSpec,
        params: Mapping[str, Any],
        history: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """What a subscriber is told of its pattern: its tier, and why it may never match
        (value names no event dispatched here has had, a bare name meant as text), or get
        no history (it asked for some from a router that keeps no store)."""
        try:
            warnings = self.engine.pattern_warnings(spec, self.dispatcher.names_seen, params)
        except Exception:  # advice must never fail a subscribe
            warnings = []
        if history is not None and (note := self.storage.no_store_note()) is not None:
            warnings.append(note)
        return {"tier": self.engine.tier(spec), "warnings": tuple(warnings)}

    def remove_subscription(self, key: Hashable) -> None:
        self.engine.unsubscribe(key)
        self.quench.unsubscribed(key)

    def update_subscription(self, key: Hashable, params: Mapping[str, Any]) -> None:
        check_values(params, "params")
        self.engine.update(key, params)
        self.quench.updated(key)

    def session_opened(self, session: ClientSession) -> None:
        self.sessions.add(session)
        if self.security.admission.opened(session):  # caps, hello deadline (security.admission)
            revoked = self.security.certificate_refusal(session.identity)
            if revoked is not None:  # refused right after the handshake, told why
                self.security.refusals.note(
                    session.host, f"refusing {session.address}: {revoked}", time.monotonic()
                )
                session.fail("revoked", revoked)

    def session_closed(self, session: ClientSession) -> None:
        self.sessions.discard(session)
        self.partial_frames.hold(session, 0)
        self.acks.session_closed(session)
        self.dispatcher.forget(session)
        subscriptions = list(session.subscriptions.values())
        for sub in subscriptions:
            self.engine.unsubscribe(sub)
        self.quench.session_closed(session, subscriptions)  # its subscriptions and registrations
        session.subscriptions.clear()

    def serve(self, session: ClientSession, msg: Message) -> bool:
        """Answer a frame *session* does not handle itself: its accepted hello (the
        welcome), questions about the mesh, quenching and cache requests (the session has
        held them to its user's permissions); before a hello, a tool asking about the mesh
        or a peer router calling (the links room takes the connection). False for a frame
        a client may not send, or not yet."""
        if session.client_id is None:
            match msg:
                case GetMesh():
                    # Asked before any hello: the gate answers as it would the hello, so a
                    # caller this router would not admit learns nothing of the mesh.
                    refusal = self.security.admit_client(session.identity, session.host)
                    if refusal is None:
                        refusal = self._mesh_refusal(session)
                    if refusal is not None:
                        session.fail("forbidden", refusal)
                    else:
                        session.send(MeshInfo(info=self.mesh.info()))
                    return True
                case PeerHello():
                    return self._handoff(session, msg)
            return False
        match msg:
            case Hello():
                session.send(
                    Welcome(
                        router_id=self.id,
                        router_name=self.name,
                        client_id=session.client_id,
                        alternatives=self.alternatives(),
                        id_scope=session.id_scope,
                    )
                )
            case GetRouters():
                session.send(Routers(addresses=self.alternatives()))
            case GetMesh():
                refusal = self._mesh_refusal(session)
                if refusal is not None:  # as GET /mesh: for users the permissions know
                    session.send(MeshInfo(info={"refused": refusal}))
                else:
                    session.send(MeshInfo(info=self.mesh_info()))
            case ForgetRouter():
                self._forget(session, msg)
            case Quench() | Unquench():
                self.quench.handle_request(session, msg)
            case (
                GetCached()
                | CacheRegister()
                | CacheFetch()
                | CacheAck()
                | CacheKeepalive()
                | CachePolicy()
                | CacheClear()
                | CacheRemove()
                | GetCacheInfo()
            ):
                identity = session.identity
                self.caches.handle_request(
                    session,
                    msg,
                    owner=identity.user,
                    receives=self.security.receive_filter(identity),
                )
            case _:
                return False
        return True

    def _mesh_refusal(self, session: ClientSession) -> str | None:
        """Why *session* may not see the mesh's picture (`Gate.require_covered`, as ``GET
        /mesh`` asks), or None."""
        try:
            self.security.require_covered(session.identity)
        except PermissionDenied as exc:
            return str(exc)
        return None

    def _forget(self, session: ClientSession, msg: ForgetRouter) -> None:
        """`aa mesh forget`: administrators only (`Permissions.admin_refusal`); the answer
        is the mesh picture with a ``forget`` map, refused or done."""
        gate = self.security
        result: dict[str, Any]
        user = session.identity.user
        refusal = gate.permissions.admin_refusal(user, session.host)
        if refusal is not None:
            refusal = f"user {user!r} is {refusal}"
            result = {"router": msg.router, "forgotten": [], "refused": refusal}
            gate.refusals.note(  # once a minute per source at most: a refusal costs no log flood
                session.host,
                f"refusing to forget router {msg.router!r} for {session.address}: {refusal}",
                time.monotonic(),
                logging.INFO,
            )
        else:
            result = self.mesh.forget(msg.router)
        session.send(MeshInfo(info={**self.mesh_info(), "forget": result}))

    def _handoff(self, session: ClientSession, msg: PeerHello) -> bool:
        """A peer router calls: the links room takes the connection (refused: told why)."""
        if not self.mesh.takes_peer(msg):
            return False
        refusal = self.security.admit_peer(session.identity, session.host, msg.router_id)
        if refusal is not None:  # mutual TLS, ids bound to certificates, --allow-peers
            self.security.refusals.note(
                session.host,
                f"refusing peer {msg.router_id} from {session.address}: {refusal}",
                time.monotonic(),
            )
            self.mesh.counters["refused_peers"] += 1
            session.fail("forbidden", refusal)
            return True
        transport, codec = session.detach()
        self.mesh.handoff(transport, codec, msg)
        return True

    # -- inside -----------------------------------------------------------------------------

    def _worker_deliveries(self, items: list[tuple[Hashable, Event]]) -> None:
        """Deliveries a pattern worker sent back: queue them, write them (one frame per client)."""
        for key, event in cast("list[tuple[Subscriber, Event]]", items):  # the router's keys
            key.deliver(event)
        self.dispatcher.flush()

    def _flush_sinks(self) -> None:
        if self._sinks is not None:
            self._sinks.flush()

    def _pattern_erred(self, keys: list[Hashable], notice: ErrorNotice) -> None:
        """A pattern raised (rate-limited by the engine): its subscribers are told."""
        self.counters["pattern_errors"] += notice.count
        log.debug("pattern of %s raised: %s", keys[0], notice)
        for key in keys:
            told = getattr(key, "pattern_erred", None)
            if told is not None:
                told(notice)

    def _pattern_failed(self, keys: list[Hashable], code: str, message: str) -> None:
        self.counters["patterns_stopped"] += 1
        log.warning("pattern stopped (%s): %s", code, message)
        for key in cast("list[Subscriber]", keys):  # the router's keys
            self.quench.unsubscribed(key)
            key.pattern_failed(code, message)
