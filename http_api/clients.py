"""HTTP clients: who they are, their patterns, and their feed as one queue (no I/O; time is
passed in as `now`).

Å §4.8: an HTTP client cannot be called back, so the router keeps its events in client
caches (Å §4.5) and the client polls. This module maps an HTTP client onto the router's
public cache API (`router.caches`) and nothing more; the caching itself lives in the router.

Mapping. An HTTP client may hold several patterns; each is one client cache, keyed
``http:<client id>:<pattern id>``, registered with the client's expiry policy and keep-alive
timeout (so the policy holds per pattern). The caches number the events they take with ONE
sequence per router, which is what lets one integer cursor stand for a position in all of a
client's caches at once.

The feed is the union of those caches, each event once, tagged with every pattern that took
it, in arrival order. A page after cursor ``c`` is built without knowing each event's
sequence number (`Fetched` gives only the last one):

1. fetch up to ``limit`` events after ``c`` from every cache;
2. the page ends at ``bound``: the smallest cursor among caches that have *more*, or, when
   none has, the largest cursor of all — every event with a sequence up to ``bound`` is then
   known from every cache;
3. a cache whose fetch went past ``bound`` is cut just before its first event after
   ``bound`` (a second fetch, ``after=bound, limit=1``, names it);
4. the cut lists are merged, each keeping its own (arrival) order, events shared by several
   lists once; the next page is "after ``bound``".

So no event is lost or repeated between pages, whatever the patterns' overlap. A page may
hold up to ``limit`` events per pattern.

Acknowledgement is explicit (`ack`), so a GET stays safe: a client acknowledges a cursor (or
an event id), and the caches drop what it covers. Polling without a cursor returns what is
not acknowledged yet; polling with ``after`` returns only what is newer. Every poll counts
as the client's keep-alive, for its registration here and its caches in the router.

Tokens are 256-bit random strings; only their SHA-256 is kept, and they are compared in
constant time.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import secrets
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from aa.mesh import META_TIME, AaError, Event, PatternSpec, UsageError

from .limits import (
    DEFAULT_KEEPALIVE,
    MAX_CONDITIONAL_VARIANTS,
    MAX_HTTP_CLIENTS,
    MAX_HTTP_CLIENTS_PER_ADDRESS,
    MAX_HTTP_CLIENTS_PER_USER,
    MAX_PATTERNS_PER_CLIENT,
)

__all__ = [
    "HttpClients",
    "HttpClient",
    "FeedPage",
    "UnknownClient",
    "BadToken",
    "Capacity",
    "CacheAPI",
]


class UnknownClient(AaError):
    """No HTTP client has that id here (never had, deleted, or its keep-alive lapsed)."""


class BadToken(AaError):
    """The request did not carry the client's token."""


class Capacity(AaError):
    """The router keeps as many HTTP clients (or caches) as it may."""


class CacheAPI(Protocol):
    """The part of `router.caches` this module uses."""

    def register(
        self, client_id: str, pattern: PatternSpec, policy: Any, timeout: float
    ) -> None: ...
    def keepalive(self, client_id: str) -> bool: ...
    def fetch(
        self, client_id: str, *, after: int | None = None, limit: int | None = None
    ) -> Any: ...
    def ack(self, client_id: str, upto: int | str) -> int: ...
    def set_policy(self, client_id: str, policy: Any) -> None: ...
    def clear(self, client_id: str) -> None: ...
    def remove(self, client_id: str) -> bool: ...
    def info(self, client_id: str) -> Any: ...
    def dropped(self, client_id: str) -> int: ...
    def __contains__(self, client_id: object) -> bool: ...


@dataclass(eq=False, slots=True, kw_only=True)
class HttpClient:
    """One registered HTTP client."""

    id: str
    name: str | None
    #: The user who registered it (`aa.http_api.callers`): its events are what this user may
    #: receive, and only this user (or the client's own token) reaches it.
    owner: str = "anonymous"
    #: The address it was registered from (counted against `MAX_HTTP_CLIENTS_PER_ADDRESS`).
    address: str | None = None
    policy: Any  # aa.router.policy.ExpiryPolicy
    #: Seconds without a poll after which the client and its caches go.
    keepalive: float
    token_hash: bytes = field(repr=False)
    created: datetime
    last_seen: float
    #: Pattern id ("p1", "p2", …) → pattern, in the order they were added.
    patterns: dict[str, PatternSpec] = field(default_factory=dict)
    next_pattern: int = 1
    #: (format, after, limit) → (ETag, Last-Modified as epoch seconds); see `conditional`.
    validators: dict[tuple[Any, ...], tuple[str, int]] = field(default_factory=dict, repr=False)
    #: The latest Last-Modified given for any variant.
    modified: int = 0

    @property
    def issued(self) -> float:
        """When its token was issued, Unix seconds (revoking the owner revokes it too)."""
        return self.created.timestamp()

    def cache_key(self, pattern_id: str) -> str:
        return f"http:{self.id}:{pattern_id}"


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedPage:
    """One page of a client's feed."""

    #: (event, ids of the patterns that took it), in arrival order.
    entries: list[tuple[Event, tuple[str, ...]]]
    #: Everything up to this cursor is on this page or an earlier one: poll ``after`` it next,
    #: and acknowledge it once the entries are handled.
    cursor: int
    #: True when more events wait after `cursor` now.
    more: bool
    #: The cursor the page started after (None: from what was acknowledged).
    after: int | None


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _arrival_key(item: tuple[Event, str]) -> datetime:
    t = item[0].meta.get(META_TIME)
    return t if type(t) is datetime and t.tzinfo is not None else _EPOCH


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class HttpClients:
    """The HTTP clients of one router, over its caches.

    >>> # clients = HttpClients(router.caches)
    >>> # client, token = clients.register(name="phone", policy=ExpiryPolicy(), now=0.0)
    """

    def __init__(
        self,
        caches: CacheAPI,
        *,
        max_clients: int = MAX_HTTP_CLIENTS,
        per_user: int = MAX_HTTP_CLIENTS_PER_USER,
        per_address: int = MAX_HTTP_CLIENTS_PER_ADDRESS,
    ) -> None:
        self.caches = caches
        self.max_clients = max_clients
        self.per_user = per_user
        self.per_address = per_address
        self._by_owner: Counter[str] = Counter()
        self._by_address: Counter[str] = Counter()
        self._clients: dict[str, HttpClient] = {}
        self._by_hash: dict[bytes, HttpClient] = {}  # token hash → client

    def __len__(self) -> int:
        return len(self._clients)

    def __iter__(self) -> Iterator[HttpClient]:
        return iter(list(self._clients.values()))

    # -- registration ---------------------------------------------------------------------

    def register(
        self,
        *,
        name: str | None,
        policy: Any,
        keepalive: float = DEFAULT_KEEPALIVE,
        patterns: Iterable[PatternSpec] = (),
        owner: str = "anonymous",
        address: str | None = None,
        now: float,
    ) -> tuple[HttpClient, str]:
        """A new client of *owner*, registered from *address*, and its token (shown once).
        Raises `Capacity` (this router's, the user's or the address's limit), `PatternError`
        or `UsageError`; on failure nothing is left behind."""
        self.expire(now)
        if len(self._clients) >= self.max_clients:
            raise Capacity(f"this router already serves {self.max_clients} HTTP clients, its limit")
        if self._by_owner[owner] >= self.per_user:
            raise Capacity(
                f"user {owner!r} already has {self.per_user} HTTP clients here, the limit per "
                "user: delete some (DELETE /clients/ID) or let them expire"
            )
        if address is not None and self._by_address[address] >= self.per_address:
            raise Capacity(
                f"{self.per_address} HTTP clients were registered from {address} already, the "
                "limit per address"
            )
        specs = list(patterns)
        if len(specs) > MAX_PATTERNS_PER_CLIENT:
            raise UsageError(f"a client may hold at most {MAX_PATTERNS_PER_CLIENT} patterns")
        token = secrets.token_urlsafe(32)
        client = HttpClient(
            id=secrets.token_hex(8),
            name=name,
            owner=owner,
            address=address,
            policy=policy,
            keepalive=float(keepalive),
            token_hash=_hash(token),
            created=datetime.now(UTC),
            last_seen=now,
        )
        self._clients[client.id] = client
        self._by_hash[client.token_hash] = client
        self._by_owner[owner] += 1
        if address is not None:
            self._by_address[address] += 1
        try:
            for spec in specs:
                self.add_pattern(client, spec)
        except BaseException:
            self.remove(client)
            raise
        return client, token

    def lookup(self, client_id: str, *, now: float) -> HttpClient:
        """The live client *client_id*, whoever asks (the caller decides who may reach it).
        Raises `UnknownClient`."""
        client = self._clients.get(client_id)
        if client is None:
            raise UnknownClient(f"no HTTP client {client_id!r} here (unknown, deleted or expired)")
        if now - client.last_seen > client.keepalive:
            self.remove(client)
            raise UnknownClient(
                f"HTTP client {client_id!r} expired: no poll for {client.keepalive:.0f} s"
            )
        return client

    def get(self, client_id: str, token: str | None, *, now: float) -> HttpClient:
        """The client, if *token* is its token. Raises `UnknownClient` or `BadToken`."""
        client = self.lookup(client_id, now=now)
        if token is None or not hmac.compare_digest(_hash(token), client.token_hash):
            raise BadToken(
                "this resource needs the client's token: 'Authorization: Bearer <token>'"
            )
        return client

    def owner_of(self, token: str | None, *, now: float) -> HttpClient | None:
        """The live client whose token *token* is (None: no token, or no such client)."""
        if not token:
            return None
        client = self._by_hash.get(_hash(token))  # a hash of the secret: the look-up leaks nothing
        if client is None or now - client.last_seen > client.keepalive:
            return None
        return client

    def by_token(self, token: str) -> HttpClient | None:
        """The client whose token *token* is, live or expired but not yet swept."""
        return self._by_hash.get(_hash(token))

    def add_pattern(self, client: HttpClient, spec: PatternSpec) -> str:
        """Add a pattern (a cache in the router); its id. Raises `UsageError`/`PatternError`."""
        if len(client.patterns) >= MAX_PATTERNS_PER_CLIENT:
            raise UsageError(f"a client may hold at most {MAX_PATTERNS_PER_CLIENT} patterns")
        pid = f"p{client.next_pattern}"
        self.caches.register(client.cache_key(pid), spec, client.policy, client.keepalive)
        client.next_pattern += 1
        client.patterns[pid] = spec
        return pid

    def remove_pattern(self, client: HttpClient, pattern_id: str) -> bool:
        """Drop a pattern and its cache; False when the client has no such pattern."""
        if client.patterns.pop(pattern_id, None) is None:
            return False
        self.caches.remove(client.cache_key(pattern_id))
        return True

    def set_policy(self, client: HttpClient, policy: Any) -> None:
        for pid in client.patterns:
            self.caches.set_policy(client.cache_key(pid), policy)
        client.policy = policy

    def remove(self, client: HttpClient) -> None:
        """Forget the client and remove its caches."""
        self._by_hash.pop(client.token_hash, None)
        if self._clients.pop(client.id, None) is None:
            return
        _release(self._by_owner, client.owner)
        if client.address is not None:
            _release(self._by_address, client.address)
        for pid in client.patterns:
            self.caches.remove(client.cache_key(pid))

    def expire(self, now: float) -> list[str]:
        """Remove clients that have not polled within their keep-alive; their ids."""
        gone = [c for c in self._clients.values() if now - c.last_seen > c.keepalive]
        for c in gone:
            self.remove(c)
        return [c.id for c in gone]

    # -- the feed -------------------------------------------------------------------------

    def touch(self, client: HttpClient, now: float) -> None:
        """A poll: keep the client and its caches alive. Raises `UnknownClient` when the
        router dropped a cache meanwhile (its keep-alive lapsed there)."""
        client.last_seen = max(client.last_seen, now)
        for pid in client.patterns:
            if not self.caches.keepalive(client.cache_key(pid)):
                self.remove(client)
                raise UnknownClient(
                    f"HTTP client {client.id!r} expired: the router dropped its cache"
                )

    def page(self, client: HttpClient, *, after: int | None, limit: int) -> FeedPage:
        """Events after cursor *after* (None: after what was acknowledged); see the module
        docstring for how one page is cut from several caches."""
        caches = self.caches
        fetched = {
            pid: caches.fetch(client.cache_key(pid), after=after, limit=limit)
            for pid in client.patterns
        }
        if not fetched:
            return FeedPage(entries=[], cursor=after or 0, more=False, after=after)
        waiting = [f.cursor for f in fetched.values() if f.more]
        bound = min(waiting) if waiting else max(f.cursor for f in fetched.values())
        lists: list[list[tuple[Event, str]]] = []
        for pid, f in fetched.items():
            events = f.events
            if events and f.cursor > bound:
                beyond = caches.fetch(client.cache_key(pid), after=bound, limit=1).events
                events = events[: _index(events, beyond[0])] if beyond else events
            if events:
                lists.append([(e, pid) for e in events])
        return FeedPage(entries=_merge(lists), cursor=bound, more=bool(waiting), after=after)

    def ack(self, client: HttpClient, upto: int | str) -> int:
        """Acknowledge a cursor or an event id in all the client's caches: every entry up to
        that position, whatever the patterns; the cursor now acknowledged.

        An event id names one position in the router's one sequence, but only the caches of
        the patterns that took the event hold it: it is turned into its cursor (found in a
        cache that took it, a linear search as in `find`) and every cache is acknowledged up
        to that cursor, so a pattern that did not take the event drops its earlier entries
        too. An id no cache holds acknowledges nothing. The answer is the largest floor: each
        cache's floor is the last entry it held up to the position, and what is in none of
        them was acknowledged with it."""
        keys = [client.cache_key(pid) for pid in client.patterns]
        if type(upto) is str:
            cursor = self._cursor_of(keys, upto)
            if cursor is None:
                floors = [self.caches.ack(key, upto) for key in keys]  # (nothing to drop)
                return max(floors, default=0)
            upto = cursor
        floors = [self.caches.ack(key, upto) for key in keys]
        return max(floors) if floors else (upto if type(upto) is int else 0)

    def _cursor_of(self, keys: list[str], event_id: str) -> int | None:
        """The cursor of event *event_id* in the first of the caches *keys* that holds it."""
        for key in keys:
            events = self.caches.fetch(key).events
            for i in range(len(events) - 1, -1, -1):
                if events[i].id == event_id:
                    cursor: int = self.caches.fetch(key, limit=i + 1).cursor
                    return cursor
        return None

    def find(self, client: HttpClient, event_id: str) -> tuple[Event, tuple[str, ...]] | None:
        """The event with id *event_id* among those kept for the client, and the patterns
        that took it; None when none holds it (never taken, acknowledged, or expired).

        Linear in what the client's caches hold (at most `MAX_PATTERNS_PER_CLIENT` caches of
        the router's per-cache cap), searched newest first: this answers a person following
        an entry's link, not a program's poll (the router's caches offer no lookup by id)."""
        found: Event | None = None
        pids: list[str] = []
        for pid in client.patterns:
            events = self.caches.fetch(client.cache_key(pid)).events
            for event in reversed(events):
                if event.id == event_id:
                    found = found or event
                    pids.append(pid)
                    break
        return None if found is None else (found, tuple(pids))

    def clear(self, client: HttpClient) -> None:
        for pid in client.patterns:
            self.caches.clear(client.cache_key(pid))

    def queued(self, client: HttpClient) -> dict[str, int]:
        """Events each pattern's cache holds (age limits not applied)."""
        return {pid: self.caches.info(client.cache_key(pid)).size for pid in client.patterns}

    def dropped(self, client: HttpClient) -> dict[str, int]:
        """Events each pattern's cache took and lost to the client's count or age limit
        before they were acknowledged: what it missed while away although it had a cache."""
        return {pid: self.caches.dropped(client.cache_key(pid)) for pid in client.patterns}

    # -- conditional GET ------------------------------------------------------------------

    @staticmethod
    def conditional(client: HttpClient, variant: tuple[Any, ...], etag: str, now: float) -> int:
        """The Last-Modified (epoch seconds) of *variant* of the client's feed, whose current
        ETag is *etag*.

        HTTP dates have one-second resolution, so a feed that changed twice in one second
        must not carry the same date twice: a client holding the first version would get a
        304 for the second. The date of a new version is therefore the current second, or
        one more than the previous version's when that is not earlier. Only a few variants
        per client are remembered; one not remembered (new, or forgotten) is dated after
        every date the client was given, so its answer is a 200, never a wrong 304."""
        known = client.validators.get(variant)
        if known is not None and known[0] == etag:
            return known[1]
        floor = known[1] if known is not None else client.modified
        second = int(now)
        if second <= floor:
            second = floor + 1
        if known is None and len(client.validators) >= MAX_CONDITIONAL_VARIANTS:
            client.validators.pop(next(iter(client.validators)))
        client.validators[variant] = (etag, second)
        client.modified = max(client.modified, second)
        return second


def _release(counts: Counter[str], key: str) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]


def _index(events: list[Event], target: Event) -> int:
    for i, e in enumerate(events):
        if e is target or e.id == target.id:
            return i
    return len(events)


def _merge(lists: list[list[tuple[Event, str]]]) -> list[tuple[Event, tuple[str, ...]]]:
    """Merge per-pattern lists, each kept in its order, by arrival stamp; one entry per
    event, tagged with all its patterns."""
    if len(lists) == 1:
        return [(e, (pid,)) for e, pid in lists[0]]
    tags: dict[str, list[str]] = {}
    order: list[Event] = []
    for event, pid in heapq.merge(*lists, key=_arrival_key):
        key = event.id or str(id(event))
        got = tags.get(key)
        if got is None:
            tags[key] = [pid]
            order.append(event)
        elif pid not in got:
            got.append(pid)
    return [(e, tuple(tags[e.id or str(id(e))])) for e in order]
