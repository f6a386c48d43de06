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

Every change carries the cache's *version* (``version``) and acks and clears its *floor*
(``mark``: a place in the cache's order), so a flood that arrives late or twice changes
nothing, and a router that missed floods catches up by anti-entropy
(`aa.router.caches.sync`: on link-up and every `CacheConfig.sync_interval`). Times are
wall-clock seconds: an event's age is its time stamp's.

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
all but looked up (`aa.router.caches.index`), so 1,000 caches cost a dictionary lookup per
event plus one evaluation per distinct pattern of any other form. The caches' sink is
attached to dispatch only while at least one cache exists.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final, Protocol, cast, runtime_checkable

from aa.mesh import (
    AaError,
    Control,
    Event,
    InvalidPolicy,
    PatternError,
    PatternSpec,
    UnknownCache,
    UsageError,
)
from aa.mesh.protocol import CacheRequest

from ..memory import give_back
from ..patterns import Matcher, admits
from ..seams import ClientPort, Controls, Sink
from ..store import ExpiryPolicy, as_spec, check_since, mark_historical
from .clientcaches import CacheInfo, ClientCaches, Fetched
from .compact import shrunk
from .config import CacheConfig
from .grouplog import Mark
from .index import CacheIndex
from .meshcache import MeshCache
from .requests import MAX_ANSWER_BACKLOG, _policy_body, handle_request, marked  # noqa: F401 (MAX_ANSWER_BACKLOG: its old home)
from .sync import (
    CACHE_SYNC_TOPIC,
    DIGEST_MIN_GAP,
    ZERO,
    CacheSync,
    parse_mark,
    parse_version,
    wire_mark,
)

__all__ = ["ClientCacheService", "CACHE_TOPIC", "KEEPALIVE_FLOOD_FRACTION"]

log = logging.getLogger("aa.router.caches")

#: Control topic of client-cache floods.
CACHE_TOPIC: Final = "client-cache"
#: A cache's keep-alive is flooded at most once per this fraction of its timeout.
KEEPALIVE_FLOOD_FRACTION: Final = 0.25
#: Caches removed (by their client, a peer's flood or a lapse) after which the heap is asked
#: to give its free pages back (`aa.router.memory.give_back`, itself at most once a second),
#: and whenever the last cache goes: a cache holds kilobytes, so a few hundred gone free
#: megabytes, while one at a time costs no heap walk.
TRIM_AFTER_REMOVALS: Final = 256
#: Seconds after such a trim when the heap is asked once more: the removals' own flood ids
#: (held by the control flood's de-duplication for one to one and a half minutes) pin a
#: page each among the freed caches until they are forgotten.
TRIM_AGAIN_AFTER: Final = 120.0


class MatcherFactory(Protocol):
    """What makes a cache's matcher (`PatternEngine.matcher`): pattern code runs only over
    the event types *scope* admits; a predicate answers for any type (`_offer` keeps what
    the scope admits)."""

    def __call__(
        self, spec: PatternSpec, *, scope: tuple[str, ...] | None = None
    ) -> Callable[[Event], bool]: ...


class _Standing(Protocol):
    """A matcher of pattern code (``remote``: it runs in a worker), placed once for good."""

    def start(self, on_accept: Callable[[Event], None], client: str) -> None: ...


@runtime_checkable
class Peers(Protocol):
    """The links, as the caches' anti-entropy uses them (`aa.router.links.MeshService`)."""

    on_link_up: list[Callable[[str], None]]

    def peer_ids(self) -> list[str]: ...

    def send_control(self, peer_id: str, topic: str, body: Mapping[str, Any]) -> bool: ...

    def on_control(self, topic: str, callback: Callable[[Control], None]) -> Callable[[], None]: ...


def _policy_from(body: Mapping[str, Any]) -> ExpiryPolicy:
    age = body.get("max_age")
    return ExpiryPolicy(
        max_age=None if age is None else timedelta(seconds=float(age)),
        max_count=body.get("max_count"),
    )


class ClientCacheService:
    """Every client cache of one router, kept in step with the mesh. See the module
    docstring. All methods are synchronous and flood what must flood.

    >>> # router.caches.register("phone-7", PatternSpec(source="Alarm"), ExpiryPolicy(max_count=50),
    3600)
    >>> # got = router.caches.fetch("phone-7", limit=10); router.caches.ack("phone-7", got.cursor)
    """

    def __init__(
        self,
        cfg: CacheConfig,
        *,
        controls: Controls,
        matcher: MatcherFactory,
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
        self._caches = ClientCaches(
            max_caches=cfg.max_client_caches, max_events_per_cache=cfg.max_events_per_cache
        )
        self.counters: Counter[str] = Counter()
        self._specs: dict[str, PatternSpec] = {}  # client id → its pattern
        self._keys: dict[str, Hashable] = {}  # client id → the key of its pattern's group
        #: The event types a cache's owner may receive (`Gate.scope_of`; None: any type),
        #: set by the router when a permissions file is in force. A cache's pattern runs
        #: only over those: caches of one pattern share a matcher only within one scope.
        self.scope_of: Callable[[str], tuple[str, ...] | None] | None = None
        self._matchers: dict[Hashable, list[Any]] = {}  # spec key → [matcher, caches using it]
        self._index = CacheIndex()  # which of those patterns take an event
        self._flooded: dict[str, float] = {}  # client id → when its keep-alive last flooded
        self._gone_since_trim = 0  # caches removed since the heap was last asked to shrink
        self._trim_again_at: float | None = None  # this clock's `now` of the second trim
        self._sink_on = False
        self._task: asyncio.Task[None] | None = None
        self.queries: set[asyncio.Task[None]] = set()  # GetCached answers awaiting a worker
        self.asking: set[ClientPort] = set()  # clients with one of those
        self._clock: Callable[[], float] = time.time  # wall clock: ages are time stamps'
        controls.on_control(CACHE_TOPIC, self._on_control)
        #: Anti-entropy with the peers (`attach`, then every `CacheConfig.sync_interval`).
        self.sync = CacheSync(self)
        self.sync.check_remote = self._check_remote
        self._peers: Peers | None = None
        self._spreading: asyncio.TimerHandle | None = None
        #: Called (no arguments) when a pattern comes or goes: the caches' patterns are part
        #: of this router's interest summary (`aa.router.links.wants`).
        self.on_change: list[Callable[[], None]] = []
        if isinstance(controls, Peers):  # the links themselves (the router passes its MeshService)
            self.attach(controls)

    def attach(self, peers: Peers) -> None:
        """Run anti-entropy with *peers*' routers: when a link comes up, and periodically."""
        self._peers = peers
        peers.on_control(CACHE_SYNC_TOPIC, self._on_sync)
        peers.on_link_up.append(self.link_up)

    def link_up(self, peer_id: str) -> None:
        """A link with *peer_id* came up: compare caches now."""
        self._send_sync(peer_id, [self.sync.digest(self._clock())])

    def _send_sync(self, peer_id: str, bodies: list[dict[str, Any]]) -> None:
        if self._peers is not None:
            for body in bodies:
                if self._peers.send_control(peer_id, CACHE_SYNC_TOPIC, body):
                    self.sync.counters[f"sent_{body['op']}"] += 1

    def _on_sync(self, control: Control) -> None:
        if not control.path or control.ttl != 0:
            return  # only from the router at the other end of a link
        peer_id = control.path[0]
        changed = self.sync.counters["events_repaired"] + self.sync.counters["defs_applied"]
        try:
            replies = self.sync.receive(peer_id, control.body, self._clock())
        except (AaError, TypeError, ValueError) as exc:  # a malformed event is a MalformedFrame
            self.sync.counters["refused"] += 1
            log.info("ignoring a malformed cache-sync message from %s: %s", peer_id, exc)
            return
        self._update_sink()
        self._send_sync(peer_id, replies)
        if (
            self.sync.counters["events_repaired"] + self.sync.counters["defs_applied"] > changed
            and self._spreading is None
        ):
            # Repaired here: the other peers may lack it too (a line A–B–C, B back from the
            # dead, C exchanged with B before B had A's events). Tell them once the peer's
            # digest rate limit allows, not at the next interval.
            self._spreading = asyncio.get_running_loop().call_later(
                DIGEST_MIN_GAP * 1.2, self._spread
            )

    def _check_remote(self, client_id: str, matcher: Any, events: list[Event]) -> None:
        """A peer's events for a cache whose pattern runs in a worker: checked there, then
        kept (a line A–B–C heals for such caches too, not only by the flood)."""

        async def check() -> None:
            try:
                taken = await matcher.select(events, client_id)
            except Exception as exc:  # a worker gone, the router closing: the next round repairs
                log.debug("checking repaired events of %s in a worker failed: %s", client_id, exc)
                return
            if self.sync.repaired(client_id, taken, self._clock()) and self._spreading is None:
                self._spreading = asyncio.get_running_loop().call_later(
                    DIGEST_MIN_GAP * 1.2, self._spread
                )

        task = asyncio.get_running_loop().create_task(check())
        self.queries.add(task)
        task.add_done_callback(self.queries.discard)

    def _spread(self) -> None:
        self._spreading = None
        peer_ids = list(self._peers.peer_ids()) if self._peers is not None else []
        if peer_ids:  # a lone router hashes nothing
            digest = self.sync.digest(self._clock())
            for peer_id in peer_ids:
                self._send_sync(peer_id, [digest])

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._sweep_loop(), name="aa-cache-sweep"
        )

    async def aclose(self) -> None:
        for query in list(self.queries):
            query.cancel()
        if self._spreading is not None:
            self._spreading.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _sweep_loop(self) -> None:
        interval, every = self._config.sweep_interval, self._config.sync_interval
        next_sync = self._clock() + every
        while True:
            await asyncio.sleep(min(interval, every) if every > 0 else interval)
            if self.sweep():
                give_back()  # their tables and logs were freed: the heap's pages go back
            now = self._clock()
            if self._trim_again_at is not None and now >= self._trim_again_at:
                self._trim_again_at = None
                # A full collection also empties the interpreter's free lists (of tuples,
                # floats, dicts...), whose blocks, kept from the freed caches' objects, would
                # keep Python's allocator from giving their arenas back.
                gc.collect()
                give_back()  # the removals' flood ids are forgotten: their pages go back too
            if every > 0 and now >= next_sync:
                next_sync = now + every
                self._spread()

    def sweep(self, now: float | None = None) -> list[str]:
        """Remove caches whose keep-alive lapsed (on this router's clock) and drop aged
        events now; the removed clients' ids."""
        now = self._clock() if now is None else now
        gone = self._caches.expire(now)
        for client_id in gone:
            self._forget(client_id)
        self.sync.sweep(now)
        if gone:
            self.counters["lapsed"] += len(gone)
            self._update_sink()
        return gone

    # -- the public API ---------------------------------------------------------------------

    def register(
        self, client_id: str, pattern: PatternSpec | str, policy: ExpiryPolicy, timeout: float
    ) -> None:
        """Keep the events *pattern* matches for *client_id* under *policy*, on every router,
        until no keep-alive came for *timeout* seconds. Registering again with the same
        pattern changes policy and timeout and keeps the events; another pattern starts an
        empty cache. Raises `PatternError` for a refused pattern, `InvalidPolicy`,
        `UsageError` (bad timeout, this router's cache limit)."""
        spec = pattern if isinstance(pattern, PatternSpec) else PatternSpec(source=pattern)
        if not isinstance(policy, ExpiryPolicy):
            raise InvalidPolicy("a client cache needs an ExpiryPolicy")
        self._register(client_id, spec, policy, timeout)
        self.sync.bump(client_id, self._clock())
        self._flooded[client_id] = self._clock()
        self._flood("register", client_id, **self._registration(client_id, full=True))

    def keepalive(self, client_id: str) -> bool:
        """The client is alive: push its cache's removal back, here and (at most every
        quarter timeout) everywhere. False when there is no such cache here."""
        now = self._clock()
        if not self._caches.keepalive(client_id, now):
            return False
        info = self._caches.info(client_id)
        if now - self._flooded.get(client_id, -1e18) >= info.timeout * KEEPALIVE_FLOOD_FRACTION:
            self._flooded[client_id] = now
            self._flood("keepalive", client_id, **self._registration(client_id, full=True))
        return True

    def fetch(
        self, client_id: str, *, after: int | None = None, limit: int | None = None
    ) -> Fetched:
        """The cache's events, oldest first: after this router's cursor *after* (None: all
        not yet acknowledged), at most *limit*. Removes nothing. Raises `UnknownCache`."""
        return self._caches.fetch(client_id, now=self._clock(), after=after, limit=limit)

    def ack(self, client_id: str, upto: int | str) -> int:
        """Drop every event up to and including *upto* (a cursor from `fetch`, or an event
        id) here and, by event id, everywhere; the cache's new floor. Raises `UnknownCache`."""
        upto_id = upto if isinstance(upto, str) else self._id_at(client_id, upto)
        floor = self._caches.ack(client_id, upto)
        if upto_id is not None:
            self._flood(
                "ack", client_id, upto=upto_id, mark=wire_mark(self._caches.floor(client_id))
            )
        return floor

    def set_policy(self, client_id: str, policy: ExpiryPolicy) -> None:
        """Change the cache's expiry policy everywhere (it applies to the events kept too).
        Raises `UnknownCache`, `InvalidPolicy`."""
        if not isinstance(policy, ExpiryPolicy):
            raise InvalidPolicy("a client cache needs an ExpiryPolicy")
        self._caches.set_policy(client_id, policy)
        version = self.sync.bump(client_id, self._clock())
        self._flood("policy", client_id, version=list(version), **_policy_body(policy))

    def clear(self, client_id: str) -> None:
        """Empty the cache everywhere; it stays registered. Raises `UnknownCache`."""
        mark = self._caches.clear(client_id, self._clock())
        self._flood("clear", client_id, mark=wire_mark(mark))

    def remove(self, client_id: str) -> bool:
        """Remove the cache everywhere; False when this router had none."""
        now = self._clock()
        timeout = self._caches.info(client_id).timeout if client_id in self._caches else 0.0
        version = self.sync.bump(client_id, now)
        removed = self._remove(client_id)
        self.sync.removed(client_id, version, now + max(timeout, 60.0))
        self._flood("remove", client_id, version=list(version))
        return removed

    def info(self, client_id: str) -> CacheInfo:
        """What the cache is. Raises `UnknownCache`."""
        return self._caches.info(client_id)

    def dropped(self, client_id: str) -> int:
        """Events the cache took and lost unacknowledged to its count or age limit
        (`ClientCaches.dropped`). Raises `UnknownCache`."""
        return self._caches.dropped(client_id, self._clock())

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

    @property
    def events_held(self) -> int:
        """Events the client caches hold together (for ``GET /metrics``)."""
        return self._caches.events_held

    # -- local state ------------------------------------------------------------------------

    def _apply_registration(
        self, client_id: str, body: Mapping[str, Any], *, floor: Mark | None, seen: float
    ) -> None:
        """A definition from the mesh (a flood or anti-entropy): create or update the cache."""
        spec = PatternSpec.from_wire(body.get("pattern"))
        policy = _policy_from(body)
        timeout = cast(float, body.get("timeout"))  # checked by ClientCaches.register
        self._register(client_id, spec, policy, timeout, floor=floor, now=seen)

    def _register(
        self,
        client_id: str,
        spec: PatternSpec,
        policy: ExpiryPolicy,
        timeout: float,
        *,
        floor: Mark | None = None,
        now: float | None = None,
    ) -> None:
        key, scope = self._key(client_id, spec)
        entry = self._matchers.get(key)
        matcher = entry[0] if entry is not None else self._matcher(spec, scope=scope)
        old_key = self._keys.get(client_id)
        self._caches.register(
            client_id,
            matcher,
            policy,
            timeout,
            self._clock() if now is None else now,
            key=key,
            floor=floor,
        )
        if entry is None:
            entry = self._matchers[key] = [matcher, 0]
            self._index.add(key, spec, matcher)
            if getattr(matcher, "remote", False):  # pattern code: runs in a worker, answers later

                def accepted(ev: Event) -> None:
                    self._caches.offer(ev, self._clock(), keys=[key])

                cast(_Standing, matcher).start(accepted, client_id)
            self._changed()
        if old_key != key:
            entry[1] += 1
            if old_key is not None:
                self._release(old_key)
        self._specs[client_id] = spec
        self._keys[client_id] = key
        self._update_sink()

    def _key(self, client_id: str, spec: PatternSpec) -> tuple[Hashable, tuple[str, ...] | None]:
        """The key of the group *client_id*'s cache of *spec* belongs to, and its owner's
        scope by the rules in force (None: any type)."""
        owner, slash, _ = client_id.partition("/")  # `cache_key`: owner/client id
        scope = self.scope_of(owner) if slash and self.scope_of is not None else None
        if scope is not None and "*" in scope:
            scope = None
        base = (spec.kernel, spec.format, spec.source)
        return (base if scope is None else (*base, scope)), scope

    def rescope(self) -> list[str]:
        """Hold the caches' pattern code to their owners' scopes in force now (after a
        permissions reload); the caches that start afresh. A cache whose pattern is code and
        whose owner's scope changed starts again, empty, under the new scope: its code's
        state was built from what the old scope let it see. A predicate's cache keeps its
        events and its old scope (a predicate keeps no state: an old, wider scope shows its
        owner nothing, since fetches filter by the rules in force; a narrower one takes
        less until the client registers again)."""
        restarted = []
        for client_id, key in list(self._keys.items()):
            spec = self._specs[client_id]
            new, _ = self._key(client_id, spec)
            matcher = self._matchers[key][0]
            if new == key or (isinstance(matcher, Matcher) and matcher.indexable):
                continue
            info = self._caches.info(client_id)
            self._register(client_id, spec, info.policy, info.timeout, now=info.last_seen)
            log.warning(
                "client cache %r starts afresh: its owner's subscribe rules changed", client_id
            )
            restarted.append(client_id)
        return restarted

    def _remove(self, client_id: str) -> bool:
        removed = self._caches.remove(client_id)
        self._forget(client_id)
        self._update_sink()
        if removed:
            self._gone_since_trim += 1
            if self._gone_since_trim >= TRIM_AFTER_REMOVALS or not self._caches:
                self._gone_since_trim = 0
                give_back()  # many caches' tables and logs were freed: the pages go back
                self._trim_again_at = self._clock() + TRIM_AGAIN_AFTER
        return removed

    def _forget(self, client_id: str) -> None:
        self._specs.pop(client_id, None)
        key = self._keys.pop(client_id, None)
        self._flooded.pop(client_id, None)
        self._specs, self._flooded = shrunk(self._specs), shrunk(self._flooded)
        self._keys = shrunk(self._keys)
        self.sync.lapsed(client_id)
        if key is not None:
            self._release(key)

    def _release(self, key: Hashable) -> None:
        entry = self._matchers.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del self._matchers[key]
                self._matchers = shrunk(self._matchers)
                self._index.remove(key)
                getattr(entry[0], "close", lambda: None)()  # a worker's matcher leaves its worker
                self._changed()

    def _changed(self) -> None:
        for hook in self.on_change:
            hook()

    def patterns(self) -> list[tuple[PatternSpec, Any]]:
        """Each distinct pattern of the caches with its matcher (a `PatternEngine.matcher`,
        or a worker's `RemoteMatcher`): what the caches want from the mesh."""
        specs = {self._keys[c]: s for c, s in self._specs.items()}
        return [(specs[k], m[0]) for k, m in self._matchers.items() if k in specs]

    def _registration(self, client_id: str, *, full: bool = False) -> dict[str, Any]:
        info = self._caches.info(client_id)
        body = {
            "pattern": self._specs[client_id].to_wire(),
            "timeout": info.timeout,
            **_policy_body(info.policy),
        }
        if full:  # as floods carry it: with the version and floor
            body["version"] = list(self.sync.versions.get(client_id, ZERO))
            body["mark"] = wire_mark(self._caches.floor(client_id))
        return body

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
        if keys and self.scope_of is not None:  # a scoped key holds its scope last
            keys = [k for k in keys if _admitted(k, event.type)]
        if keys:
            self._caches.offer(event, self._clock(), keys=keys)

    # -- the mesh ---------------------------------------------------------------------------

    def _flood(self, op: str, client_id: str, **body: Any) -> None:
        self._controls.flood_control(CACHE_TOPIC, {"op": op, "client": client_id, **body})
        self.counters[f"flooded_{op}"] += 1

    def _on_control(self, control: Control) -> None:
        body = control.body
        op, client_id = body.get("op"), body.get("client")
        now = self._clock()
        self.counters[f"received_{str(op)}"] += 1
        try:
            if type(client_id) is not str or not client_id:
                raise UsageError("no client id")
            version = parse_version(body.get("version"))
            if op in ("register", "keepalive") and self.sync.newer(client_id, version):
                self._apply_registration(
                    client_id, body, floor=parse_mark(body.get("mark")), seen=now
                )
                self.sync.adopt(client_id, version)
                self._update_sink()
            elif op == "keepalive":
                self._caches.keepalive(client_id, now)
            elif op in ("ack", "clear"):
                mark, upto = parse_mark(body.get("mark")), body.get("upto")
                if mark is not None:
                    self._caches.ack_mark(client_id, mark)
                elif op == "clear":
                    self._caches.clear(client_id)
                elif type(upto) is str:
                    self._caches.ack(client_id, upto)
                else:
                    raise UsageError("an ack floods an event id")
            elif op == "policy":
                if self.sync.newer(client_id, version) or version == ZERO:
                    self._caches.set_policy(client_id, _policy_from(body))
                    self.sync.adopt(client_id, version)
            elif op == "remove":
                if self.sync.newer(client_id, version) or version == self.sync.versions.get(
                    client_id, ZERO
                ):
                    timeout = (
                        self._caches.info(client_id).timeout if client_id in self._caches else 0.0
                    )
                    self._remove(client_id)
                    self.sync.removed(client_id, version, now + max(timeout, 60.0))
            else:
                raise UsageError(f"unknown op {op!r}")
        except UnknownCache:
            pass  # lapsed or never reached us: the client's next keep-alive re-creates it
        except (UsageError, PatternError, TypeError, ValueError) as exc:
            self.counters["bad_controls"] += 1
            log.info("ignoring a %r cache control for %r from the mesh: %s", op, client_id, exc)

    # -- requests from TCP clients ----------------------------------------------------------

    def cached(
        self,
        pattern: str | PatternSpec,
        *,
        since: datetime | None = None,
        limit: int | None = None,
        receives: Callable[[str | None], bool] | None = None,
    ) -> list[Event] | Awaitable[list[Event]]:
        """Mesh-cached events *pattern* matches (time at or after *since*), oldest first, at
        most *limit*; marked historical. With *receives*, the pattern sees only the events
        of the types it admits (the asking user's): they are left out before it runs. For
        pattern code, which runs only in a worker, an awaitable of them (`requests.py`
        answers it when the worker has). Raises `PatternError`, `UsageError`."""
        since = check_since(since)
        if self.mesh_cache is None:
            return []
        match = self._matcher(as_spec(pattern))
        self._flush_cache()
        select = getattr(match, "select", None)
        if select is not None:
            seen = self.mesh_cache.query(None, since=since)
            if receives is not None:
                seen = [e for e in seen if receives(e.type)]
            return marked(select, seen, limit)
        if receives is not None:
            inner = match

            def match(event: Event) -> bool:
                return receives(event.type) and inner(event)

        return [mark_historical(e) for e in self.mesh_cache.query(match, since=since, limit=limit)]

    @property
    def pattern_count(self) -> int:
        """Distinct patterns among the client caches (each compiled and matched once)."""
        return len(self._matchers)

    @property
    def attached(self) -> bool:
        """Whether the caches take dispatched events (only while a cache exists)."""
        return self._sink_on

    def handle_request(
        self,
        session: ClientPort,
        msg: CacheRequest,
        *,
        owner: str | None = None,
        receives: Callable[[str | None], bool] | None = None,
    ) -> None:
        """A storage request of *session*'s client: the mesh cache (`GetCached`), or its own
        client cache (*owner*'s for the session's client id); only what *receives* admits
        is answered. See `aa.router.caches.requests`."""
        handle_request(self, session, msg, owner=owner, receives=receives)


def _admitted(key: Hashable, type_: str | None) -> bool:
    """Whether the caches of group *key* may take an event of *type_* (a scoped key holds
    its owner's scope last: `ClientCacheService._register`)."""
    parts = cast(tuple[Any, ...], key)
    return len(parts) == 3 or admits(parts[3], type_)
