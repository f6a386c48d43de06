"""Client caches across the mesh (Å §4.5): `router.caches`, one `ClientCacheService` per router.

A client registers a pattern and an expiry policy under its client id; every router of the
mesh keeps that cache (`aa.router.caches.clientcaches` is one router's copy), so a client that comes
back through another router finds its events there. This module keeps the copies in step.

What floods (control topic ``client-cache``, body ``{"op", "client", ...}``)
----------------------------------------------------------------------------
==============  =========================================================================
op              effect on every other router
==============  =========================================================================
``register``    create or update the cache: ``pattern``, ``max_age`` (s), ``max_count``,
                ``timeout`` (s)
``keepalive``   push the cache's removal back; carries the registration too, so a router
                that joined the mesh later (or missed it) creates the cache, empty
``ack``         drop the cache's events up to event id ``upto`` (ids hold mesh-wide;
                cursors are per router)
``policy``      new ``max_age`` / ``max_count``
``clear``       empty the cache, keep it registered
``remove``      remove the cache
==============  =========================================================================

Expiry is never flooded: each router removes a cache whose keep-alive lapsed on its own
clock (a sweep every `CacheConfig.sweep_interval`). Routers agree because the keep-alives
flood: a live client's keep-alive reaches every router well within the timeout. A client
keeping alive very often (a phone polling over HTTP) is not flooded each time: one flood per
quarter timeout per cache is enough for every router to see it alive, and bounds the mesh
traffic a chatty client causes.

A keep-alive that overtakes a removal on another path through the mesh can bring a removed
cache back, empty, on some routers; with no keep-alive after it, it lapses there in turn.

Acks by id are exact when every router took the client's events in the same order, which
is so for events from one publisher (one path through the mesh is FIFO) and nearly so
otherwise: two publishers' events racing through different routers may be taken in another
order at another router, where an ack by id then drops what that router took up to that
event. Fetching more than was acknowledged is always safe; the client de-duplicates by id.

Matching: each distinct pattern is compiled once into a `PatternEngine.matcher` shared by
every cache with that pattern, evaluated once per event for all of them; and patterns of the
form ``Name == constant`` — most client caches: "my device's events" — are not evaluated at
all but looked up (`aa.router.caches.cacheindex`), so 1,000 caches cost a dictionary lookup per
event plus one evaluation per distinct pattern of any other form. The caches' sink is
attached to dispatch only while at least one cache exists.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from datetime import timedelta
from datetime import datetime
from typing import Any, Awaitable, Callable, Final, Hashable

from aa.mesh import Control, Event, InvalidPolicy, PatternError, PatternSpec, UnknownCache, UsageError
from aa.mesh.protocol import Error, Message
from aa.mesh.protocol import (
    CacheAck,
    CacheClear,
    CacheDone,
    CacheEvents,
    CacheFetch,
    CacheKeepalive,
    CachePolicy,
    CacheRegister,
    CacheRemove,
    GetCacheInfo,
    GetCached,
    Cached,
)

from ..seams import ClientPort, Controls, Sink
from ..store import ExpiryPolicy, as_spec, check_since, mark_historical, send_paged
from .cacheconfig import CacheConfig
from .cacheindex import CacheIndex
from .clientcaches import CacheInfo, ClientCaches, Fetched
from .meshcache import MeshCache

__all__ = ["ClientCacheService", "CACHE_TOPIC", "KEEPALIVE_FLOOD_FRACTION"]

log = logging.getLogger("aa.router.caches")

#: Control topic of client-cache floods.
CACHE_TOPIC: Final = "client-cache"
#: Bytes of unread answers (and deliveries) a client may have waiting before its next cache
#: request is refused with "busy": a few answer pages.
MAX_ANSWER_BACKLOG: Final = 4 * 1024 * 1024
#: A cache's keep-alive is flooded at most once per this fraction of its timeout.
KEEPALIVE_FLOOD_FRACTION: Final = 0.25


def _policy_body(policy: ExpiryPolicy) -> dict[str, Any]:
    return {
        "max_age": None if policy.max_age is None else policy.max_age.total_seconds(),
        "max_count": policy.max_count,
    }


async def _marked(select: Callable[[list[Event]], Awaitable[list[Event]]], events: list[Event], limit: int | None) -> list[Event]:
    """The *events* a worker's pattern accepts (`select`), the first *limit*, marked historical."""
    return [mark_historical(e) for e in (await select(events))[:limit]]


def _policy_from(body: dict[str, Any]) -> ExpiryPolicy:
    age = body.get("max_age")
    return ExpiryPolicy(max_age=None if age is None else timedelta(seconds=float(age)), max_count=body.get("max_count"))


class ClientCacheService:
    """Every client cache of one router, kept in step with the mesh. See the module
    docstring. All methods are synchronous and flood what must flood.

    >>> # router.caches.register("phone-7", PatternSpec(source="Alarm"), ExpiryPolicy(max_count=50), 3600)
    >>> # got = router.caches.fetch("phone-7", limit=10); router.caches.ack("phone-7", got.cursor)
    """

    def __init__(
        self,
        cfg: CacheConfig,
        *,
        controls: Controls,
        matcher: Callable[[PatternSpec], Callable[[Event], bool]],
        sinks: list[Sink],
        mesh_cache: MeshCache | None = None,
        flush_cache: Callable[[], None] = lambda: None,
    ) -> None:
        self._config = cfg
        self._controls = controls
        self._matcher = matcher
        self._sinks = sinks
        #: The mesh cache (None when it is off), answered by `cached` and `GetCached`.
        self.mesh_cache = mesh_cache
        self._flush_cache = flush_cache
        self._caches = ClientCaches(max_caches=cfg.max_client_caches, max_events_per_cache=cfg.max_events_per_cache)
        self.counters: Counter[str] = Counter()
        self._specs: dict[str, PatternSpec] = {}  # client id → its pattern
        self._matchers: dict[Hashable, list[Any]] = {}  # spec key → [matcher, caches using it]
        self._index = CacheIndex()  # which of those patterns take an event
        self._flooded: dict[str, float] = {}  # client id → when its keep-alive last flooded
        self._sink_on = False
        self._task: asyncio.Task[None] | None = None
        self._queries: set[asyncio.Task[None]] = set()  # GetCached answers awaiting a worker
        self._asking: set[ClientPort] = set()  # clients with one of those
        self._clock: Callable[[], float] = time.monotonic
        controls.on_control(CACHE_TOPIC, self._on_control)

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sweep_loop(), name="aa-cache-sweep")

    async def aclose(self) -> None:
        for query in list(self._queries):
            query.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _sweep_loop(self) -> None:
        interval = self._config.sweep_interval
        while True:
            await asyncio.sleep(interval)
            self.sweep()

    def sweep(self, now: float | None = None) -> list[str]:
        """Remove caches whose keep-alive lapsed (on this router's clock) and drop aged
        events now; the removed clients' ids."""
        gone = self._caches.expire(self._clock() if now is None else now)
        for client_id in gone:
            self._forget(client_id)
        if gone:
            self.counters["lapsed"] += len(gone)
            self._update_sink()
        return gone

    # -- the public API ---------------------------------------------------------------------

    def register(self, client_id: str, pattern: PatternSpec | str, policy: ExpiryPolicy, timeout: float) -> None:
        """Keep the events *pattern* matches for *client_id* under *policy*, on every router,
        until no keep-alive came for *timeout* seconds. Registering again with the same
        pattern changes policy and timeout and keeps the events; another pattern starts an
        empty cache. Raises `PatternError` for a refused pattern, `InvalidPolicy`,
        `UsageError` (bad timeout, this router's cache limit)."""
        spec = pattern if isinstance(pattern, PatternSpec) else PatternSpec(source=pattern)
        if not isinstance(policy, ExpiryPolicy):
            raise InvalidPolicy("a client cache needs an ExpiryPolicy")
        self._register(client_id, spec, policy, timeout)
        self._flooded[client_id] = self._clock()
        self._flood("register", client_id, **self._registration(client_id))

    def keepalive(self, client_id: str) -> bool:
        """The client is alive: push its cache's removal back, here and (at most every
        quarter timeout) everywhere. False when there is no such cache here."""
        now = self._clock()
        if not self._caches.keepalive(client_id, now):
            return False
        info = self._caches.info(client_id)
        if now - self._flooded.get(client_id, -1e18) >= info.timeout * KEEPALIVE_FLOOD_FRACTION:
            self._flooded[client_id] = now
            self._flood("keepalive", client_id, **self._registration(client_id))
        return True

    def fetch(self, client_id: str, *, after: int | None = None, limit: int | None = None) -> Fetched:
        """The cache's events, oldest first: after this router's cursor *after* (None: all
        not yet acknowledged), at most *limit*. Removes nothing. Raises `UnknownCache`."""
        return self._caches.fetch(client_id, now=self._clock(), after=after, limit=limit)

    def ack(self, client_id: str, upto: int | str) -> int:
        """Drop every event up to and including *upto* (a cursor from `fetch`, or an event
        id) here and, by event id, everywhere; the cache's new floor. Raises `UnknownCache`."""
        upto_id = upto if type(upto) is str else self._id_at(client_id, upto)  # type: ignore[arg-type]
        floor = self._caches.ack(client_id, upto)
        if upto_id is not None:
            self._flood("ack", client_id, upto=upto_id)
        return floor

    def set_policy(self, client_id: str, policy: ExpiryPolicy) -> None:
        """Change the cache's expiry policy everywhere (it applies to the events kept too).
        Raises `UnknownCache`, `InvalidPolicy`."""
        if not isinstance(policy, ExpiryPolicy):
            raise InvalidPolicy("a client cache needs an ExpiryPolicy")
        self._caches.set_policy(client_id, policy)
        self._flood("policy", client_id, **_policy_body(policy))

    def clear(self, client_id: str) -> None:
        """Empty the cache everywhere; it stays registered. Raises `UnknownCache`."""
        self._caches.clear(client_id)
        self._flood("clear", client_id)

    def remove(self, client_id: str) -> bool:
        """Remove the cache everywhere; False when this router had none."""
        removed = self._remove(client_id)
        self._flood("remove", client_id)
        return removed

    def info(self, client_id: str) -> CacheInfo:
        """What the cache is. Raises `UnknownCache`."""
        return self._caches.info(client_id)

    def pattern(self, client_id: str) -> PatternSpec:
        """The cache's pattern. Raises `UnknownCache`."""
        spec = self._specs.get(client_id)
        if spec is None:
            raise UnknownCache(f"no event cache is registered for client {client_id!r}")
        return spec

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._caches

    def __len__(self) -> int:
        return len(self._caches)

    # -- local state ------------------------------------------------------------------------

    def _register(self, client_id: str, spec: PatternSpec, policy: ExpiryPolicy, timeout: float) -> None:
        key = (spec.kernel, spec.format, spec.source)
        entry = self._matchers.get(key)
        matcher = entry[0] if entry is not None else self._matcher(spec)
        old = self._specs.get(client_id)
        self._caches.register(client_id, matcher, policy, timeout, self._clock(), key=key)
        if entry is None:
            entry = self._matchers[key] = [matcher, 0]
            self._index.add(key, spec, matcher)
            if getattr(matcher, "remote", False):  # pattern code: runs in a worker, answers later
                matcher.start(lambda ev, k=key: self._caches.offer(ev, self._clock(), keys=[k]), client_id)  # type: ignore[union-attr]
            if getattr(matcher, "remote", False):  # pattern code: runs in a worker, answers later
                matcher.start(lambda ev, k=key: self._caches.offer(ev, self._clock(), keys=[k]), client_id)  # type: ignore[union-attr]
        old_key = None if old is None else (old.kernel, old.format, old.source)
        if old_key != key:
            entry[1] += 1
            if old_key is not None:
                self._release(old_key)
        self._specs[client_id] = spec
        self._update_sink()

    def _remove(self, client_id: str) -> bool:
        removed = self._caches.remove(client_id)
        self._forget(client_id)
        self._update_sink()
        return removed

    def _forget(self, client_id: str) -> None:
        spec = self._specs.pop(client_id, None)
        self._flooded.pop(client_id, None)
        if spec is not None:
            self._release((spec.kernel, spec.format, spec.source))

    def _release(self, key: Hashable) -> None:
        entry = self._matchers.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del self._matchers[key]
                self._index.remove(key)
                getattr(entry[0], "close", lambda: None)()  # a worker's matcher leaves its worker
                getattr(entry[0], "close", lambda: None)()  # a worker's matcher leaves its worker

    def _registration(self, client_id: str) -> dict[str, Any]:
        info = self._caches.info(client_id)
        return {"pattern": self._specs[client_id].to_wire(), "timeout": info.timeout, **_policy_body(info.policy)}

    def _id_at(self, client_id: str, cursor: int) -> str | None:
        """Id of the newest event of the cache with a cursor ≤ *cursor* (to flood an ack)."""
        now = self._clock()
        everything = self._caches.fetch(client_id, now=now).events
        newer = self._caches.fetch(client_id, now=now, after=cursor).events
        i = len(everything) - len(newer) - 1
        return everything[i].id if i >= 0 else None

    def _update_sink(self) -> None:
        want = len(self._caches) > 0
        if want != self._sink_on:
            sinks = self._sinks
            if want:
                sinks.append(self._offer)
            elif self._offer in sinks:
                sinks.remove(self._offer)
            self._sink_on = want

    def _offer(self, event: Event) -> None:
        keys = self._index.match(event)
        if keys:
            self._caches.offer(event, self._clock(), keys=keys)

    # -- the mesh ---------------------------------------------------------------------------

    def _flood(self, op: str, client_id: str, **body: Any) -> None:
        self._controls.flood_control(CACHE_TOPIC, {"op": op, "client": client_id, **body})
        self.counters[f"flooded_{op}"] += 1

    def _on_control(self, control: Control) -> None:
        body = control.body
        op, client_id = body.get("op"), body.get("client")
        self.counters[f"received_{op}"] += 1
        try:
            if type(client_id) is not str or not client_id:
                raise UsageError("no client id")
            if op == "register" or (op == "keepalive" and client_id not in self._caches):
                spec = PatternSpec.from_wire(body.get("pattern"))
                self._register(client_id, spec, _policy_from(body), body.get("timeout"))  # type: ignore[arg-type]
            elif op == "keepalive":
                self._caches.keepalive(client_id, self._clock())
            elif op == "ack":
                upto = body.get("upto")
                if type(upto) is not str:
                    raise UsageError("an ack floods an event id")
                self._caches.ack(client_id, upto)
            elif op == "policy":
                self._caches.set_policy(client_id, _policy_from(body))
            elif op == "clear":
                self._caches.clear(client_id)
            elif op == "remove":
                self._remove(client_id)
            else:
                raise UsageError(f"unknown op {op!r}")
        except UnknownCache:
            pass  # lapsed or never reached us: the client's next keep-alive re-creates it
        except (UsageError, PatternError, TypeError, ValueError) as exc:
            self.counters["bad_controls"] += 1
            log.info("ignoring a %r cache control for %r from the mesh: %s", op, client_id, exc)

    # -- requests from TCP clients ----------------------------------------------------------

    def cached(
        self, pattern: str | PatternSpec, *, since: datetime | None = None, limit: int | None = None
    ) -> list[Event] | Awaitable[list[Event]]:
        """Mesh-cached events *pattern* matches (time at or after *since*), oldest first, at
        most *limit*; marked historical. For pattern code, which runs only in a worker, an
        awaitable of them. Raises `PatternError`, `UsageError`."""
        since = check_since(since)
        if self.mesh_cache is None:
            return []
        match = self._matcher(as_spec(pattern))
        self._flush_cache()
        select = getattr(match, "select", None)
        if select is not None:
            return _marked(select, self.mesh_cache.query(None, since=since), limit)
        return [mark_historical(e) for e in self.mesh_cache.query(match, since=since, limit=limit)]

    @property
    def pattern_count(self) -> int:
        """Distinct patterns among the client caches (each compiled and matched once)."""
        return len(self._matchers)

    @property
    def attached(self) -> bool:
        """Whether the caches take dispatched events (only while a cache exists)."""
        return self._sink_on

    def handle_request(self, session: ClientPort, msg: Message) -> None:
        """A storage request of *session*'s client: the mesh cache (`GetCached`), or its own
        client cache (the session's id)."""
        req: int = msg.req  # type: ignore[attr-defined]
        if session.backlog > MAX_ANSWER_BACKLOG:
            # A client that asks and does not read must not make us hold its answers: each
            # is up to thousands of events (the issue: 199 unread answers, 2.3 GB).
            self.counters["busy"] += 1
            session.send(Error(code="busy", message="read the answers already sent before asking again", ref=req))
            return
        if type(msg) is GetCached:
            try:
                events = self.cached(msg.pattern, since=msg.since, limit=msg.limit)  # type: ignore[attr-defined]
                if not isinstance(events, list):  # pattern code: answered once its worker did
                    self._answer_later(session, req, events)
                    return
            except UsageError as exc:
                session.send(Error(code=getattr(exc, "code", "bad-request"), message=str(exc), ref=req))
                return
            except Exception as exc:  # PatternError (a RemoteError) carries its code
                session.send(Error(code=getattr(exc, "code", "error"), message=str(exc), ref=req))
                return
            send_paged(session, events, lambda chunk, partial: Cached(req=req, events=chunk, partial=partial))
            return
        client_id = session.client_id or "?"
        kind = type(msg)
        try:
            if kind is CacheRegister:
                policy = ExpiryPolicy.parse(max_age=msg.max_age, max_count=msg.max_count)  # type: ignore[attr-defined]
                self.register(client_id, msg.pattern, policy, msg.timeout)  # type: ignore[attr-defined]
            elif kind is CacheKeepalive:
                if not self.keepalive(client_id):
                    raise UnknownCache(f"no event cache is registered for client {client_id!r}")
            elif kind is CacheFetch:
                self.keepalive(client_id)
                got = self.fetch(client_id, after=msg.after, limit=msg.limit)  # type: ignore[attr-defined]
                self._send_events(session, req, got)
                return
            elif kind is CacheAck:
                self.keepalive(client_id)
                self.ack(client_id, msg.upto)  # type: ignore[attr-defined]
            elif kind is CachePolicy:
                policy = ExpiryPolicy.parse(max_age=msg.max_age, max_count=msg.max_count)  # type: ignore[attr-defined]
                self.keepalive(client_id)
                self.set_policy(client_id, policy)
            elif kind is CacheClear:
                self.keepalive(client_id)
                self.clear(client_id)
            elif kind is CacheRemove:
                session.send(CacheDone(req=req, info={"client_id": client_id, "removed": self.remove(client_id)}))
                return
            elif kind is GetCacheInfo:
                self.keepalive(client_id)
            else:
                raise UsageError(f"not a cache request: {msg.kind!r}")
            session.send(CacheDone(req=req, info=self._info_map(client_id)))
        except InvalidPolicy as exc:
            session.send(Error(code="invalid-policy", message=str(exc), ref=req))
        except UnknownCache as exc:
            session.send(Error(code="unknown-cache", message=str(exc), ref=req))
        except PatternError as exc:
            session.send(Error(code=exc.code, message=str(exc), ref=req))
        except UsageError as exc:
            session.send(Error(code="bad-request", message=str(exc), ref=req))

    def _answer_later(self, session: ClientPort, req: int, events: Awaitable[list[Event]]) -> None:
        """Answer a `GetCached` once the pattern's worker has: one such query per client at
        a time (another is refused "busy"), the router's loop going on meanwhile."""
        if session in self._asking:
            self.counters["busy"] += 1
            session.send(Error(code="busy", message="one query of pattern code at a time", ref=req))
            if asyncio.iscoroutine(events):
                events.close()
            return

        async def answer() -> None:
            try:
                got = await events
            except Exception as exc:
                session.send(Error(code=getattr(exc, "code", "error"), message=str(exc), ref=req))
                return
            finally:
                self._asking.discard(session)
            send_paged(session, got, lambda chunk, partial: Cached(req=req, events=chunk, partial=partial))

        self._asking.add(session)
        task = asyncio.get_running_loop().create_task(answer())
        self._queries.add(task)
        task.add_done_callback(self._queries.discard)

    def _info_map(self, client_id: str) -> dict[str, Any]:
        info = self._caches.info(client_id)
        return {"client_id": client_id, "timeout": info.timeout, "size": info.size,
                "pattern": self._specs[client_id].source, **_policy_body(info.policy)}  # fmt: skip

    def _send_events(self, session: ClientPort, req: int, got: Fetched) -> None:
        send_paged(session, got.events, lambda chunk, partial: CacheEvents(
            req=req, events=chunk, cursor=got.cursor, more=got.more, partial=partial))  # fmt: skip
