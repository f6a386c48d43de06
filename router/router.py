"""The router: client sessions, dispatch, and the hooks the mesh and stores attach to.

Embed it in any asyncio program::

    async with Router(RouterConfig(port=0)) as router:
        print(router.address)          # the real (host, port), bound before start() returns
        sub = router.subscribe("Temperature > 100", print)
        router.publish({"Temperature": 101})

An event's way (DESIGN.md): stamp metadata → local dispatch (pattern engine, then the sinks:
store, caches, event log) → flood to peer routers. Dispatch is synchronous inside the event
loop: a batch of events read from one socket is dispatched whole, then every client that got
deliveries is written to once (`_flush_dirty`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from datetime import datetime, timezone
from typing import Any, Callable, Hashable, Mapping, Protocol, Sequence, cast

from aa.mesh import Event, IdGenerator, PatternSpec, UsageError, check_values
from aa.mesh import META_ADDRESS, META_CLIENT, META_PATH, META_ROUTER, META_TIME, META_TTL, ROUTER_META_KEYS
from aa.mesh import SeenIds
from aa.mesh.protocol import Message, Publish

from .caching import ClientCacheService
from .config import RouterConfig
from .history import check_history
from .local import LocalSubscription
from .mesh import MeshService
from .patterns import HostFacts, PatternEngine, SandboxLimits
from .quench import QuenchService
from .security import Gate, router_id_for
from .session import ClientSession
from .storage import StorageService, check_persistable

__all__ = ["Router", "Endpoint"]

#: The user who published an event (Å §4.6): aa.mesh.event.META_USER, which aa.mesh does not
#: export yet (the lead's; see the security report).
META_USER = "user"

log = logging.getLogger("aa.router")


class Endpoint(Protocol):
    """Something served alongside the router (the HTTP endpoint, for instance)."""

    async def start(self, router: "Router") -> None: ...

    async def aclose(self) -> None: ...


class Router:
    """A broker, embeddable in any asyncio program. See the module docstring."""

    def __init__(self, config: RouterConfig | None = None, *, endpoints: Sequence[Endpoint] = ()) -> None:
        self.config = config or RouterConfig()
        #: TLS, users, permissions (`aa.router.security`); raises UsageError for bad files.
        self.security = Gate(self.config.security)
        prefix = self.config.id_prefix
        if prefix is None and self.security.name is not None:
            prefix = router_id_for(self.security.name)  # peers check our id against our certificate
        self._ids = IdGenerator(prefix)
        #: This router's id: random per start of the process, unique in the mesh.
        self.id = self._ids.prefix
        self.name = self.config.name or "router"
        self.endpoints = list(endpoints)
        self.counters: Counter[str] = Counter()
        self.started_at: float | None = None
        self.sessions: set[ClientSession] = set()
        self._dirty_sessions: list[ClientSession] = []
        self._server: asyncio.Server | None = None
        self._address: tuple[str, int] | None = None
        self._seen = SeenIds()
        self._local_client = f"local:{self.id}"
        self.engine = PatternEngine(
            host=HostFacts(
                router_id=self.id,
                router_name=self.name,
                clock=lambda: datetime.now(timezone.utc),
                peer_count=self.peer_count,
            ),
            limits=SandboxLimits(time_budget=self.config.pattern_time_budget),
            on_failure=self._pattern_failed,
        )
        #: Called with each event dispatched here (store, caches, event log attach here).
        self.sinks: list[Callable[[Event], None]] = []
        #: Called with each event to pass on to peer routers (the mesh attaches here).
        self.forwarders: list[Callable[[Event], None]] = []
        #: Called when a TCP connection's first frame is not a client hello: a peer router.
        self.handoffs: list[Callable[[ClientSession, Message], bool]] = []
        #: Called after a subscription is registered (history replay attaches here).
        self.on_subscribe: list[Callable[[Hashable, Mapping[str, Any] | None], None]] = []
        #: Peer links, flooding, control messages, discovery (attaches to forwarders/handoffs).
        self.mesh = MeshService(self)
        #: The persistent store, the mesh cache, the event log (`aa.router.storage`).
        self.storage = StorageService(self)
        #: Client caches, kept in step across the mesh (`aa.router.caching`).
        self.caches = ClientCacheService(self)
        #: Quench registrations and notifications across the mesh (`aa.router.quench`).
        self.quench = QuenchService(self)

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
        await self.storage.start()  # raises StoreUnavailable before anything is bound
        try:
            if self.config.security.active:  # TLS and address ranges: our own accept loop
                self._server = cast(asyncio.Server, await self.security.serve(  # duck-types a Server
                    lambda: ClientSession(self), self.config.host, self.config.port, self.counters))
            else:
                self._server = await loop.create_server(
                    lambda: ClientSession(self), self.config.host, self.config.port, reuse_address=True
                )
        except BaseException:
            await self.storage.aclose()
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
            await self.mesh.start()
        except BaseException:
            self._server.close()
            self._server = None
            await self.quench.aclose()
            await self.caches.aclose()
            await self.storage.aclose()
            raise
        for endpoint in self.endpoints:
            await endpoint.start(self)
        log.info("router %s (%s) listening on %s:%d", self.name, self.id, host, port)

    async def aclose(self) -> None:
        """Stop accepting, deliver what is in flight, say goodbye, close. Idempotent."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        await self.mesh.aclose()
        for endpoint in reversed(self.endpoints):
            try:
                await endpoint.aclose()
            except Exception:
                log.exception("endpoint %r failed to close", endpoint)
        await self.quench.aclose()
        await self.caches.aclose()
        try:
            await self.storage.aclose()  # writes what is queued: waiting acks go before the byes
        except Exception:
            log.exception("the store failed to close")
        self._flush_dirty()
        from aa.mesh.protocol import Bye

        sessions = list(self.sessions)
        for s in sessions:
            s.send(Bye())
            s.close()
        waits = [s.closed for s in sessions]
        if waits:
            done, pending = await asyncio.wait(waits, timeout=self.config.shutdown_grace)
            for s in sessions:
                if s.transport is not None and not s.closed.done():
                    s.transport.abort()
        await server.wait_closed()

    async def __aenter__(self) -> "Router":
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
    ) -> Event | None:
        """Publish from inside this process; returns the stamped event, or None if *id* was
        already seen (a retried publish). *user* is stamped as `meta["user"]` (the HTTP endpoint
        passes a token's owner). Raises `InvalidValue` for values outside the model,
        `InvalidPolicy` for a malformed store policy in *meta* (`aa.router.policy`)."""
        event = Event(values=dict(values), type=type, meta=dict(meta or {}), id=id)
        if meta:
            check_persistable(event)
        stamped = self._accept([event], client_id or self._local_client, address, user)
        self._flush_dirty()
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
    ) -> LocalSubscription:
        """Subscribe from inside this process. With *history* (``{"since": datetime | None}``)
        the stored events the pattern matches come first, oldest first, marked historical,
        then the live ones (`aa.router.history`). Raises `PatternError` for a refused
        pattern, `UsageError` for a bad *history*."""
        spec = pattern if isinstance(pattern, PatternSpec) else PatternSpec(kernel=kernel, format=format, source=pattern)
        sub = LocalSubscription(self, callback)
        self._subscribe(sub, spec, dict(params or {}), history)
        self._after_subscribe(sub, history)
        return sub

    async def history(
        self,
        pattern: str | PatternSpec,
        *,
        since: datetime | None = None,
        limit: int | None = None,
        include_cache: bool = True,
    ) -> list[Event]:
        """Stored events *pattern* matches — and mesh-cached ones too with *include_cache* —
        with a time at or after *since* (an aware datetime), oldest first, each id once, at
        most *limit*, marked historical (`GET /events` serves this).

        >>> # await router.history("Temperature > 30", since=datetime.now(timezone.utc) - timedelta(hours=3))

        Raises `PatternError` for a refused pattern, `UsageError` for a bad argument,
        `StoreUnavailable` when the store cannot be read.
        """
        return await self.storage.history(pattern, since=since, limit=limit, include_cache=include_cache)

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

    def stats(self) -> dict[str, Any]:
        """Counters and sizes, for `aa mesh` and the monitor."""
        return {
            "id": self.id,
            "name": self.name,
            "endpoint": self.endpoint if self._address else None,
            "uptime": time.monotonic() - self.started_at if self.started_at else 0.0,
            "clients": len(self.sessions),
            "subscriptions": len(self.engine),
            "patterns": self.engine.instance_count,
            "counters": dict(self.counters),
            "storage": {**self.storage.stats(), "client_caches": len(self.caches)},
        }

    # -- dispatch ---------------------------------------------------------------------------

    def _accept(self, events: Sequence[Event], client_id: str, address: str, user: str | None = None) -> list[Event]:
        """Stamp events from a client (Å §4.2, and its user, §4.6), drop retried ones,
        dispatch and flood them."""
        now = time.monotonic()
        stamp_time = datetime.now(timezone.utc)  # one clock read per batch, not per event
        originate = self.mesh.rules.originate  # shares self._seen with the mesh's floods
        out = []
        for ev in events:
            eid = ev.id
            if eid is None:
                eid = self._ids()
            hop = originate(eid, now)
            if hop is None:
                self.counters["duplicates"] += 1  # a retried publish: already in the mesh
                continue
            meta = ev.meta
            if meta:
                meta = {k: v for k, v in meta.items() if k not in ROUTER_META_KEYS}
                meta.update({META_TIME: stamp_time, META_CLIENT: client_id, META_ADDRESS: address,
                             META_ROUTER: self.id, META_TTL: hop.ttl, META_PATH: hop.path})
            else:
                meta = {META_TIME: stamp_time, META_CLIENT: client_id, META_ADDRESS: address,
                        META_ROUTER: self.id, META_TTL: hop.ttl, META_PATH: hop.path}
            if user is not None:
                meta[META_USER] = user
            stamped = Event.trusted(ev.values, ev.type, meta, eid)
            self.dispatch(stamped)
            for forward in self.forwarders:
                forward(stamped)
            out.append(stamped)
        self.counters["published"] += len(out)
        return out

    def dispatch(self, event: Event) -> None:
        """Deliver *event* to local subscribers and sinks (once per router per event)."""
        for key, ev in self.engine.match(event):
            key.deliver(ev)  # type: ignore[attr-defined]
        for sink in self.sinks:
            try:
                sink(event)
            except Exception:
                log.exception("event sink %r failed", sink)
        self.counters["dispatched"] += 1

    def _publish_from(self, session: ClientSession, msg: Publish) -> None:
        storage = self.storage
        events = session.permitted(msg.events)  # what the user may not publish is refused
        events, persisted = storage.screen(session, events)  # bad store policies refused
        refused = storage.refused
        try:
            self._accept(events, session.client_id or "?", session.address, session.identity.user)
        finally:
            # The ack follows the floods out, and a persisted event's commit (aa.router.storage).
            storage.ack_publish(session, msg.seq, persisted, refused)

    def _flush_dirty(self) -> None:
        dirty = self._dirty_sessions
        if dirty:
            self._dirty_sessions = []
            for s in dirty:
                s.flush()

    # -- subscriptions ----------------------------------------------------------------------

    def _subscribe(self, key: Hashable, spec: PatternSpec, params: Mapping[str, Any], history: Any) -> None:
        check_values(params, "params")
        check_history(history)
        self.engine.subscribe(key, spec, params)

    def _after_subscribe(self, key: Hashable, history: Mapping[str, Any] | None) -> None:
        for hook in self.on_subscribe:
            hook(key, history)

    def _unsubscribe(self, key: Hashable) -> None:
        self.engine.unsubscribe(key)
        self.quench.unsubscribed(key)

    def _update(self, key: Hashable, params: Mapping[str, Any]) -> None:
        check_values(params, "params")
        self.engine.update(key, params)
        self.quench.updated(key)

    def _pattern_failed(self, keys: list[Hashable], code: str, message: str) -> None:
        self.counters["patterns_stopped"] += 1
        log.warning("pattern stopped (%s): %s", code, message)
        for key in keys:
            self.quench.unsubscribed(key)
            key.pattern_failed(code, message)  # type: ignore[attr-defined]

    # -- sessions ---------------------------------------------------------------------------

    def _session_opened(self, session: ClientSession) -> None:
        self.sessions.add(session)

    def _session_closed(self, session: ClientSession) -> None:
        self.sessions.discard(session)
        self.storage.session_closed(session)
        if session in self._dirty_sessions:
            self._dirty_sessions.remove(session)
        for sub in list(session.subscriptions.values()):
            self.engine.unsubscribe(sub)
        self.quench.session_closed(session)  # its subscriptions and its registrations
        session.subscriptions.clear()

    def _handoff(self, session: ClientSession, msg: Message) -> bool:
        return any(h(session, msg) for h in self.handoffs)
