"""`AsyncClient`: publish and subscribe from asyncio, riding out lost routers.

    async with AsyncClient("127.0.0.1:7447") as client:
        hot = await client.subscribe("Temperature > 100")   # first: events are not kept for later
        await client.publish({"Temperature": 101}, type="reading"); print((await hot.get()).values)

Publishing never talks to the network directly: events join an *outbox* and are sent in
batches; each stays there until a router acknowledged it, so a router lost mid-way costs
nothing — the events are resent to the next router under the same ids, and the mesh drops
the ones it had already seen. Subscriptions are registered again on every new router.
How it finds routers and fails over is told in `aa.client.dial`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aa.mesh import (
    AaTimeout,
    ConnectionClosed,
    ConnectionLost,
    Discovery,
    Event,
    IdGenerator,
    OutboxFull,
    PatternError,
    PatternSpec,
    PeerTable,
    PermissionDenied,
    RemoteError,
    RouterInfo,
    Source,
    UsageError,
    id_scope,
)
from aa.mesh.protocol import (
    Ack,
    Bye,
    Cached,
    CacheDone,
    CacheEvents,
    Deliver,
    Error,
    ForgetRouter,
    GetMesh,
    GetRouters,
    Hello,
    MeshInfo,
    Message,
    Missed,
    MissedAway,
    PatternFailed,
    PatternRaised,
    Ping,
    Pong,
    Quenched,
    QuenchNotice,
    Routers,
    Subscribed,
    Unsubscribe,
    Update,
    Updated,
    with_needs,
)

from .caching import CacheClient
from .config import DELIVERED_IDS_MAX, DELIVERED_IDS_MAX_AGE, ClientConfig
from .deliveries import delivered_ids, hand_over
from .dial import Refusals, first_of, open_router
from .link import Link
from .outbox import Outbox, packed_publish
from .quench import QuenchClient
from .subscription import Subscription

__all__ = ["AsyncClient"]

log = logging.getLogger("aa.client")


class AsyncClient(QuenchClient, CacheClient):
    """A client of the mesh. See the module docstring. Cache requests (`cached`,
    `cache_register`, `cache_fetch`, ...) are described in `aa.client.caching`.

    *routers* is an endpoint ("host:port") or a list of them, tried in order.
    """

    def __init__(
        self,
        routers: str | Sequence[str] | None = None,
        *,
        config: ClientConfig | None = None,
        client_id: str | None = None,
        name: str | None = None,
        on_error: Callable[[RemoteError], None] | None = None,
        on_disconnect: Callable[[str], None] | None = None,
        on_reconnect: Callable[[str], None] | None = None,
    ) -> None:
        #: Called with a router's error outside any request (a publish not kept); else logged.
        self.on_error = on_error
        #: Called with the router's endpoint when the connection to it is lost (the client
        #: reconnects by itself: fail-over), and when connected again after such a loss (the
        #: subscriptions are registered again; live events published meanwhile are not
        #: delivered unless a subscription asked for history). Else logged at info level.
        self.on_disconnect = on_disconnect
        self.on_reconnect = on_reconnect
        self._lost_at: float | None = None  # when the last connection was lost
        self._heard_at: float | None = None  # when the lost router was last heard from
        if config is None:
            if isinstance(routers, str):
                routers = [routers]
            config = ClientConfig(routers=tuple(routers or ()), client_id=client_id, name=name)
        self.config = config
        self.client_id = config.client_id or os.urandom(8).hex()
        # Our ids' proof (`aa.mesh.id_scope`), for life: a resent publish is known anywhere.
        self._secret = os.urandom(16).hex()
        self._ids = IdGenerator(id_scope(self._secret))
        #: The routers this client may connect to, with their poison back-off.
        self.peers = PeerTable(retry_base=config.retry_base, retry_max=config.retry_max)
        for endpoint in (*config.routers, *config.discovery.peers):
            self.peers.add(endpoint, source=Source.CONFIGURED, now=time.monotonic())
        self._discovery: Discovery | None = None
        self._wake = asyncio.Event()
        self._bye = False
        self._mesh_waiters: list[asyncio.Future[MeshInfo]] = []
        self._link: Link | None = None
        self._connected = asyncio.Event()
        self._closing = False
        self._runner: asyncio.Task[None] | None = None
        self._outbox = Outbox(config.max_outbox)
        self._delivered = delivered_ids(DELIVERED_IDS_MAX, DELIVERED_IDS_MAX_AGE)
        self._flush_scheduled = False
        self._subs: dict[int, Subscription] = {}
        self._next_sub = 1
        self._requests: dict[int, asyncio.Future[Subscribed | Updated]] = {}
        #: Router we are connected to: (router id, router name, endpoint), or None.
        self.router: tuple[str, str, str] | None = None
        self._last_error: str | None = None  # why the last connection attempt failed, for connect()
        self._refusals = Refusals(
            impatient=not config.wait_for_routers
        )  # routers that refused us for good, and why
        self._init_caching()
        self._init_quench()

    # -- connecting -------------------------------------------------------------------------

    async def connect(self, timeout: float | None = None) -> AsyncClient:
        """Connect to the first router that answers. Raises `AaTimeout` if none does in
        *timeout* seconds (default: the config's connect timeout × number of routers, plus a
        beacon interval when discovering), `RemoteError` (code "refused") at once when every
        router given refused us for a reason trying again will not change (`dial.Refusals`),
        `UsageError` if there is no router to try and discovery is off, `OSError` if discovery
        cannot bind its socket."""
        discovering = self.config.discovering
        if not len(self.peers) and not discovering:
            raise UsageError("no router endpoint given, and discovery is off")
        if discovering and self._discovery is None:
            discovery = Discovery(self.config.discovery, on_found=self._found)
            await discovery.start()  # OSError: nothing kept
            self._discovery = discovery
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name=f"aa-client-{self.client_id}")
        timeout = self.config.connect_wait(len(self.peers)) if timeout is None else timeout
        try:
            await self._until_connected(timeout)
        except TimeoutError:
            tried = ", ".join(e.address for e in self.peers) or "none found"
            last = (
                f"; last refusal: {self._last_error}" if self._last_error else ""
            )  # TLS, permissions
            raise AaTimeout(
                f"no router answered within {timeout:.1f} s (tried {tried}){last}"
            ) from None
        return self

    @property
    def known_routers(self) -> list[str]:
        """Endpoints of the routers this client knows (given, told, discovered)."""
        return [e.address for e in self.peers]

    @property
    def connected(self) -> bool:
        return self._link is not None and self._connected.is_set()

    async def wait_connected(self, timeout: float | None = None) -> None:
        try:
            await self._until_connected(timeout)
        except TimeoutError:
            raise AaTimeout("not reconnected in time") from None

    async def _until_connected(self, timeout: float | None) -> None:
        """Until connected (TimeoutError after *timeout*); `RemoteError` once every router we
        may try refused us for good (TLS only, no anonymous clients, ...)."""
        async with asyncio.timeout(timeout):
            await first_of(self._connected.wait(), self._refusals.everywhere.wait())
        if not self._connected.is_set():
            raise RemoteError(str(self._refusals), code="refused")

    async def _run(self) -> None:
        last_alternatives = 0.0
        peers = self.peers
        while not self._closing:
            now = time.monotonic()
            due = peers.due(now)
            if not due:
                # Every router is poisoned (or none is known yet): wait for the first to be
                # due again, or for discovery to report one.
                soonest = peers.next_due()
                delay = max(0.01, soonest - now) if soonest is not None else 3600.0
                self._wake.clear()
                try:
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            endpoint = due[0]
            peers.record_attempt(endpoint, now)
            try:
                link = await asyncio.wait_for(self._open(endpoint), self.config.connect_timeout)
            except (OSError, TimeoutError, RemoteError, ConnectionLost) as exc:
                self._last_error = f"{endpoint}: {exc}" if str(exc) else None  # told by connect()
                self._refusals.note(
                    endpoint, exc, () if self.config.discovering else self.known_routers
                )
                now = time.monotonic()
                fast = self._lost_at is not None and now - self._lost_at < (
                    self.config.retry_fast_period
                )
                retry = peers.record_failure(
                    endpoint, now, cap=self.config.retry_fast_max if fast else None
                )
                log.info(
                    "router %s unavailable: %s; %s",
                    endpoint,
                    exc or type(exc).__name__,
                    "forgotten"
                    if retry is None
                    else f"next attempt in {retry - time.monotonic():.1f} s",
                )
                continue
            peers.record_success(
                endpoint, time.monotonic(), router_id=self.router[0] if self.router else None
            )
            self._refusals.note(endpoint, None, ())
            self._bye = False
            self._link = link
            self._on_connected()
            if self._lost_at is not None:
                self._lost_at = None
                self._tell(self.on_reconnect, endpoint, "reconnected to %s")
            lost_wait = asyncio.ensure_future(link.lost)
            while not lost_wait.done():
                await asyncio.wait([lost_wait], timeout=self.config.alternatives_interval)
                if (
                    not lost_wait.done()
                    and time.monotonic() - last_alternatives >= self.config.alternatives_interval
                ):
                    last_alternatives = time.monotonic()
                    self._send(GetRouters())
            self._link = None
            self._connected.clear()
            self.router = None
            waiting: list[asyncio.Future[Any]] = [*self._requests.values(), *self._mesh_waiters]
            for fut in waiting:
                if not fut.done():
                    fut.set_exception(ConnectionLost("connection to the router was lost"))
            self._requests.clear()
            self._mesh_waiters.clear()
            if self._closing:
                return
            self._lost_at = now = time.monotonic()
            self._heard_at = link.heard
            self._tell(self.on_disconnect, endpoint, "disconnected from %s")
            if self._bye:
                peers.record_closed(endpoint, now)  # it said goodbye: no penalty
                log.info("router %s closed; failing over", endpoint)
            else:
                # Poisoned; a link that stayed up `stable_after` had its failures forgiven.
                peers.record_failure(endpoint, now, cap=self.config.retry_fast_max)
                log.info("lost router %s; failing over", endpoint)

    def _tell(self, callback: Callable[[str], None] | None, endpoint: str, text: str) -> None:
        if callback is None:
            log.info(text, endpoint)  # (a fail-over is the library's business, not an error)
            return
        try:
            callback(endpoint)
        except Exception:
            log.exception("client callback for %s failed", endpoint)

    def _found(self, info: RouterInfo) -> None:
        """Discovery heard a router (or reports a configured endpoint)."""
        endpoint = info.client or info.peer
        try:
            entry = self.peers.add(
                endpoint, source=info.source, now=time.monotonic(), router_id=info.router_id
            )
        except UsageError:
            return
        if entry is not None:
            self._wake.set()

    async def _open(self, endpoint: str) -> Link:
        hello = Hello(client_id=self.client_id, name=self.config.name, secret=self._secret)
        link, welcome = await open_router(
            endpoint, hello, self._on_message, self._schedule_flush, config=self.config
        )
        self.router = (welcome.router_id, welcome.router_name, endpoint)
        self._learn(welcome.alternatives)
        return link

    def _learn(self, endpoints: Sequence[str]) -> None:
        now = time.monotonic()
        for e in endpoints:
            try:
                self.peers.add(e, source=Source.TOLD, now=now)
            except UsageError:
                log.debug("router told an endpoint that is not one: %r", e)

    def _on_connected(self) -> None:
        # Resend what no router acknowledged, and what was acknowledged only moments ago,
        # first and under the same ids: a router that already has them drops them as
        # duplicates, so only what a dead router took with it is new (`aa.client.outbox`).
        now = time.monotonic()
        self._outbox.reconnected(now)
        # Back after a loss: each subscription says how long it was away, and a router with a
        # store tells it what it matched meanwhile (`MissedAway`).
        away = None if self._heard_at is None else max(0.0, now - self._heard_at)
        for sub in list(self._subs.values()):
            self._send(sub.subscribe_message(with_history=False, away=away))
        self._connected.set()
        self._caching_connected()
        self._quench_connected()
        self._schedule_flush()

    # -- messages from the router -----------------------------------------------------------

    def _on_message(self, msg: Message) -> None:
        # Class patterns are isinstance checks in order (no message kind has subclasses):
        # the event path's kinds first.
        match msg:
            case Deliver():
                self._deliver(msg)
            case Ack():
                self._acked(msg.seq)
            case Subscribed() | Updated():
                fut = self._requests.pop(msg.sub_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            case Error():
                self._on_error(msg)
            case Cached() | CacheEvents() | CacheDone():  # CACHE_ANSWERS
                self._storage_answer(msg)
            case Quenched() | QuenchNotice():  # QUENCH_ANSWERS
                self._quench_answer(msg)
            case PatternFailed():
                failed = self._subs.pop(msg.sub_id, None)
                if failed is not None:
                    failed.fail(PatternError(msg.message, code=msg.code))
            case PatternRaised():
                sub = self._subs.get(msg.sub_id)
                if sub is not None:
                    sub.pattern_raised(msg)
            case Missed():
                sub = self._subs.get(msg.sub_id)
                if sub is not None:
                    sub.missed_events(msg.count)
            case MissedAway():
                sub = self._subs.get(msg.sub_id)
                if sub is not None:
                    sub.missed_while_away(msg)
            case Routers():
                self._learn(msg.addresses)
            case Ping():
                self._send(Pong(token=msg.token))
            case MeshInfo():
                while self._mesh_waiters:
                    waiter = self._mesh_waiters.pop(0)
                    if not waiter.done():
                        waiter.set_result(msg)
                        break
            case Bye():
                self._bye = True
                if self._link is not None:
                    self._link.close()

    def _deliver(self, msg: Deliver) -> None:
        hand_over(msg.items, self._subs, self._delivered, time.monotonic())

    def _on_error(self, msg: Error) -> None:
        if self._storage_error(msg) or self._quench_error(msg):
            return
        if msg.ref is not None and msg.ref in self._requests:
            fut = self._requests.pop(msg.ref)
            if not fut.done():
                fut.set_exception(PatternError(msg.message, code=msg.code))
            return
        if msg.ref is not None and msg.ref in self._subs:  # a re-subscription was refused
            self._subs.pop(msg.ref).fail(PatternError(msg.message, code=msg.code))
            return
        if self.on_error is None:
            log.warning("router error %s: %s", msg.code, msg.message)
        else:
            self.on_error(RemoteError(msg.message, code=msg.code))

    # -- publishing -------------------------------------------------------------------------

    def publish_nowait(
        self,
        values: Mapping[str, Any],
        *,
        type: str | None = None,
        meta: Mapping[str, Any] | None = None,
        id: str | None = None,
    ) -> str:
        """Queue an event for publishing; returns its id. Raises `InvalidValue` for values
        outside the model or an event too large for a router (`check_fits`), `OutboxFull`
        when the outbox is at its cap."""
        eid = id or self._ids()
        data = packed_publish(values, type, meta, eid)
        if self._closing:
            raise ConnectionClosed("client is closed")
        if self._outbox.full:
            raise OutboxFull(f"{self.config.max_outbox} events wait for a router already")
        self._outbox.add_packed(data)
        self._schedule_flush()
        return eid

    def _publish_packed(self, pending: collections.deque[bytes]) -> None:
        """Queue events given as their bytes (`packed_publish`) from the left of *pending*,
        as many as the outbox has room for (the blocking `Client` hands over its caller's
        events so). Raises `ConnectionClosed` once closing."""
        if self._closing:
            raise ConnectionClosed("client is closed")
        if self._outbox.take(pending):
            self._schedule_flush()

    async def publish(
        self,
        values: Mapping[str, Any],
        *,
        type: str | None = None,
        meta: Mapping[str, Any] | None = None,
        id: str | None = None,
    ) -> str:
        """Queue an event for publishing, waiting while the outbox is full; returns its id.
        Use `flush()` to wait until routers acknowledged everything published."""
        await self.wait_for_room()
        return self.publish_nowait(values, type=type, meta=meta, id=id)

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until a router acknowledged every event published so far."""
        try:
            async with asyncio.timeout(timeout):
                await self._outbox.drained.wait()
        except TimeoutError:
            raise AaTimeout(f"{self.pending} events still unacknowledged") from None

    @property
    def pending(self) -> int:
        """Events published and not yet acknowledged by a router."""
        return self._outbox.pending

    async def wait_for_room(self) -> None:
        """Return once the outbox takes another event (at once if it does now)."""
        while self._outbox.full:
            self._outbox.room.clear()
            await self._outbox.room.wait()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self._link is not None:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_outbox)

    def _flush_outbox(self) -> None:
        self._flush_scheduled = False
        link = self._link
        outbox = self._outbox
        while link is not None and not link.paused:
            batch = outbox.next_batch()
            if batch is None:
                return
            seq, events = batch
            try:
                link.send_publish(seq, events)
            except ConnectionLost:
                return  # resent after reconnection

    def _acked(self, seq: int) -> None:
        self._outbox.acked(seq, time.monotonic())
        if self._outbox.waiting:
            self._schedule_flush()

    # -- subscribing ------------------------------------------------------------------------

    async def subscribe(
        self,
        pattern: str | PatternSpec,
        callback: Callable[[Event], Any] | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        format: str = "expr",
        kernel: str = "python",
        history: Mapping[str, Any] | None = None,
        needs: Sequence[str] = (),
        overflow: str = "notify",
        on_missed: Callable[[int], None] | None = None,
        on_error: Callable[[PatternRaised], None] | None = None,
        on_missed_away: Callable[[MissedAway], None] | None = None,
    ) -> Subscription:
        """Register a pattern; events go to *callback* (a function or coroutine function), or
        iterate the `Subscription`. *needs*: the value names the pattern needs, for quenching
        (`aa.mesh.protocol.quench_messages`). *overflow*: when this client reads too slowly,
        "notify" (events dropped, `on_missed(n)` told) or "disconnect". *on_error*: called
        with a `PatternRaised` when the pattern raises while running (at most once a second;
        without it, a warning is logged; `Subscription.errors` counts). *on_missed_away*:
        called with a `MissedAway` after a lost router, when the new one keeps a store: how
        many stored events the pattern matched while this client was away (without it, a
        warning is logged when there were any; `Subscription.missed_away` counts). Raises
        `PatternError` (the router's reason), `AaTimeout` if no router answers."""
        spec = (
            pattern
            if isinstance(pattern, PatternSpec)
            else PatternSpec(kernel=kernel, format=format, source=pattern)
        )
        spec = with_needs(
            spec, needs
        )  # declared needs: quench prototypes match on them (aa.mesh.protocol.quench_messages)
        sub_id = self._next_sub
        self._next_sub += 1
        sub = Subscription(
            self,
            sub_id,
            spec,
            dict(params or {}),
            callback,
            dict(history) if history else None,
            overflow=overflow,
            on_missed=on_missed,
            on_error=on_error,
            on_missed_away=on_missed_away,
        )
        self._subs[sub_id] = sub
        try:
            reply = await self._request(sub_id, sub.subscribe_message())
            assert isinstance(reply, Subscribed)  # the router answers a subscribe so
            sub.tier, sub.warnings = reply.tier, reply.warnings
        except BaseException:
            self._subs.pop(sub_id, None)
            sub.finish()
            raise
        return sub

    async def update_subscription(self, sub: Subscription, params: Mapping[str, Any]) -> None:
        if sub.closed:
            raise ConnectionClosed("subscription is closed")
        merged = {**sub.params, **params}
        await self._request(sub.id, Update(sub_id=sub.id, params=dict(params)))
        sub.params = merged

    async def remove_subscription(self, sub: Subscription) -> None:
        if self._subs.pop(sub.id, None) is not None and self.connected:
            self._send(Unsubscribe(sub_id=sub.id))

    async def unsubscribe(self, sub: Subscription) -> None:  # the same as sub.aclose()
        await sub.aclose()

    async def _request(self, sub_id: int, msg: Message) -> Subscribed | Updated:
        await self.wait_connected(self.config.request_timeout)
        fut: asyncio.Future[Subscribed | Updated] = asyncio.get_running_loop().create_future()
        self._requests[sub_id] = fut
        self._send(msg)
        try:
            async with asyncio.timeout(self.config.request_timeout):
                return await fut
        except TimeoutError:
            raise AaTimeout(f"router did not answer {msg.kind!r} in time") from None
        finally:
            self._requests.pop(sub_id, None)

    async def mesh_info(self, timeout: float | None = None) -> dict[str, Any]:
        """The mesh as the connected router knows it: every router, its peers, poison list
        and counters (layout: `aa.mesh.MeshInfo`). Raises `PermissionDenied` when the
        router's permissions do not cover this client's user; `AaTimeout`, `ConnectionLost`."""
        info = await self._ask_mesh(GetMesh(), timeout)
        refused = info.get("refused")
        if refused and "routers" not in info:
            raise PermissionDenied(str(refused))
        return info

    async def forget_router(self, router: str, timeout: float | None = None) -> dict[str, Any]:
        """Make the connected router forget *router* (an id, a name or a "host:port"): drop
        it from its peer table, its topology file and its picture of the mesh. Returns the
        routers forgotten, ``{"router", "forgotten": [{"id", "name", "address"}],
        "refused": None}`` (none forgotten: it knew of no such router). Raises
        `RemoteError` (code "refused") with the router's reason when it will not: the caller
        is no administrator, or the router is linked with it now; `InvalidValue` for an
        empty or overlong *router*; `AaTimeout`, `ConnectionLost`.

        >>> await client.forget_router("laptop-7")  # doctest: +SKIP
        """
        info = await self._ask_mesh(ForgetRouter(router=router), timeout)
        result = info.get("forget")
        if type(result) is not dict:
            raise RemoteError("the router does not know 'forget-router'", code="unsupported")
        if result.get("refused"):
            raise RemoteError(str(result["refused"]), code="refused")
        return result

    async def _ask_mesh(self, msg: GetMesh | ForgetRouter, timeout: float | None) -> dict[str, Any]:
        """Send *msg* and await the router's `MeshInfo` (answers come in the order asked)."""
        timeout = self.config.request_timeout if timeout is None else timeout
        await self.wait_connected(timeout)
        fut: asyncio.Future[MeshInfo] = asyncio.get_running_loop().create_future()
        self._mesh_waiters.append(fut)
        self._send(msg)
        try:
            async with asyncio.timeout(timeout):
                answer = await fut
        except TimeoutError:
            raise AaTimeout(f"router did not answer {msg.kind!r} in time") from None
        finally:
            if fut in self._mesh_waiters:
                self._mesh_waiters.remove(fut)
        return dict(answer.info)

    def _send(self, msg: Message) -> None:
        if self._link is not None:
            try:
                self._link.send(msg)
            except ConnectionLost:
                pass  # the run loop notices and fails over

    # -- closing ----------------------------------------------------------------------------

    async def aclose(self, timeout: float = 5.0) -> None:
        """Send what is in the outbox (waiting up to *timeout* s), then close."""
        if self._closing:
            return
        if self.connected and self.pending:
            try:
                await self.flush(timeout)
            except AaTimeout:
                log.warning("closing with %d unacknowledged events", self.pending)
        self._closing = True
        self._caching_close()
        self._quench_close()
        if self._discovery is not None:
            await self._discovery.aclose()
            self._discovery = None
        for sub in list(self._subs.values()):
            sub.finish()
        self._subs.clear()
        if self._link is not None:
            self._send(Bye())
            self._link.close()
        if self._runner is not None:
            self._runner.cancel()
            try:
                await self._runner
            except (asyncio.CancelledError, Exception):
                pass

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
