"""Cache requests of a client (Å §4.5): the mesh cache, and the client's own cache.

`CacheClient` is a part of `AsyncClient`; `BlockingCacheClient` gives `Client` the same
methods, blocking. The wire messages are `aa.mesh.protocol.cache_messages`.

    await client.cache_register("Alarm", max_age="3h", max_count=100)   # on every router
    ...                                                                   # (offline a while)
    events = await client.cache_fetch()          # what the mesh kept for us, oldest first
    await client.cache_ack()                     # done with them: gone everywhere
    recent = await client.cached("Temperature > 30", since=datetime.now(timezone.utc) -
    timedelta(hours=1))

Keep-alives: once registered, the client sends one every third of the cache's timeout while
connected, and at once on every (re)connection. A router that does not know the cache (it
lapsed, or the whole mesh restarted) answers ``unknown-cache``, and the client registers it
again with what it was given. A client that stays away longer than the timeout loses its
cache: that is the contract (Å §4.5).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, TypeVar

from aa.mesh import (
    AaError,
    AaTimeout,
    ConnectionLost,
    Event,
    PatternError,
    PatternSpec,
    ProtocolError,
    RemoteError,
    UsageError,
)
from aa.mesh.protocol import (
    DEFAULT_CACHE_TIMEOUT,
    CacheAck,
    CacheAnswer,
    CacheClear,
    Cached,
    CacheDone,
    CacheEvents,
    CacheFetch,
    CacheKeepalive,
    CachePolicy,
    CacheRegister,
    CacheRemove,
    Error,
    GetCached,
    GetCacheInfo,
    Message,
)

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .config import ClientConfig
    from .link import Link

__all__ = ["CacheClient", "BlockingCacheClient", "KEEPALIVE_FRACTION"]

log = logging.getLogger("aa.client")

#: Keep-alives go every this fraction of the cache's timeout: two may be lost (or a
#: reconnection take a while) before the cache lapses.
KEEPALIVE_FRACTION: Final = 1 / 3

T = TypeVar("T")
Age = float | int | str | timedelta | None


def _age(value: Age) -> float | str | None:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool):
        raise UsageError("max_age must be seconds, text such as '3h', or a timedelta")
    return value


def _spec(pattern: str | PatternSpec, format: str, kernel: str) -> PatternSpec:
    return (
        pattern
        if isinstance(pattern, PatternSpec)
        else PatternSpec(kernel=kernel, format=format, source=pattern)
    )


def _aware(since: datetime | None) -> datetime | None:
    if since is None:
        return None
    if not isinstance(since, datetime):
        raise UsageError("since must be a datetime or None")
    return since if since.tzinfo is not None else since.astimezone()  # naive: this machine's time


#: What a storage request resolves to: the `CacheDone`, or the events of every answer frame.
_Answer = CacheDone | list[Event]


def _dropped_of(info: dict[str, Any]) -> int:
    dropped = info.get("dropped")
    return dropped if type(dropped) is int and dropped >= 0 else 0


class _Pending:
    __slots__ = ("future", "events")

    def __init__(self, future: asyncio.Future[_Answer]) -> None:
        self.future = future
        self.events: list[Event] = []


class CacheClient:
    """Cache requests for `AsyncClient` (a mixin: it uses the client's link and ids)."""

    if TYPE_CHECKING:  # what it uses of AsyncClient
        config: ClientConfig
        client_id: str
        _link: Link | None
        _next_sub: int
        _closing: bool

        @property
        def connected(self) -> bool: ...

        async def wait_connected(self, timeout: float | None = None) -> None: ...

        def _send(self, msg: Message) -> None: ...

    def _init_caching(self) -> None:
        self._storage_requests: dict[int, _Pending] = {}
        #: What `cache_register` was given, to renew the registration with.
        self._cache_registration: dict[str, Any] | None = None
        self._cache_keepalive_task: asyncio.Task[None] | None = None
        self._cache_last_fetched: str | None = None
        self._cache_on_dropped: Callable[[int], None] | None = None
        self._cache_dropped = 0  # the router's count of the cache's drops, as last told

    # -- the mesh cache ---------------------------------------------------------------------

    async def cached(
        self,
        pattern: str | PatternSpec,
        *,
        since: datetime | None = None,
        limit: int | None = None,
        format: str = "expr",
        kernel: str = "python",
    ) -> list[Event]:
        """Events the router's mesh cache holds that *pattern* matches, taken at or after
        *since* (a naive datetime is this machine's local time), oldest first, at most
        *limit*; marked historical. Raises `PatternError`, `AaTimeout`, `ConnectionLost`."""
        spec = _spec(pattern, format, kernel)
        when = _aware(since)
        return await self._storage_events(
            lambda req: GetCached(req=req, pattern=spec, since=when, limit=limit)
        )

    # -- the client cache -------------------------------------------------------------------

    async def cache_register(
        self,
        pattern: str | PatternSpec,
        *,
        max_age: Age = None,
        max_count: int | str | None = None,
        timeout: float = DEFAULT_CACHE_TIMEOUT,
        format: str = "expr",
        kernel: str = "python",
        on_dropped: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Ask every router of the mesh to keep the events *pattern* matches for this
        client (its `client_id`): at most *max_count* of them, none older than *max_age*
        (seconds, text such as ``"3h"``, or a timedelta), while keep-alives come at least
        every *timeout* seconds (this client sends them by itself while connected).
        Registering again with the same pattern changes the policy and keeps the events.
        *on_dropped*: called with how many events the cache took and lost unacknowledged to
        its count or age limit since last told: by this registration when the mesh kept the
        cache while this client was away (a client registers again when it comes back), then
        by the keep-alive sent on every reconnection and by `cache_info`; without it, a
        warning is logged. Returns the cache's info (see
        `aa.mesh.protocol.cache_messages`). Raises `RemoteError` with code
        ``invalid-policy`` and the router's reason for a bad policy, `PatternError` for a
        refused pattern."""
        spec = _spec(pattern, format, kernel)
        age = _age(max_age)
        first = self._cache_registration is None
        done = await self._storage_done(
            lambda req: CacheRegister(
                req=req, pattern=spec, max_age=age, max_count=max_count, timeout=float(timeout)
            )
        )
        self._cache_registration = {
            "pattern": spec,
            "max_age": age,
            "max_count": max_count,
            "timeout": float(timeout),
        }
        self._cache_last_fetched = None
        self._cache_on_dropped = on_dropped
        if first:  # back to a cache kept while this client was away: what it lost is news
            self._cache_dropped = 0
        self._note_dropped(done.info)
        self._start_cache_keepalives()
        return done.info

    async def cache_fetch(self, limit: int | None = None) -> list[Event]:
        """The cached events not yet acknowledged, oldest first, at most *limit*. Fetching
        removes nothing: `cache_ack()` does. Raises `RemoteError` (``unknown-cache``)."""
        events = await self._storage_events(lambda req: CacheFetch(req=req, limit=limit))
        if events:
            self._cache_last_fetched = events[-1].id
        return events

    async def cache_ack(self, upto: str | None = None) -> dict[str, Any]:
        """Remove from the cache, on every router, the events up to and including event id
        *upto* (default: the last one `cache_fetch` returned). Returns the cache's info."""
        target = upto if upto is not None else self._cache_last_fetched
        if target is None:
            return await self.cache_info()
        done = await self._storage_done(lambda req: CacheAck(req=req, upto=target))
        return done.info

    async def cache_policy(
        self, *, max_age: Age = None, max_count: int | str | None = None
    ) -> dict[str, Any]:
        """Change the cache's expiry policy everywhere (it applies to what is kept too)."""
        age = _age(max_age)
        done = await self._storage_done(
            lambda req: CachePolicy(req=req, max_age=age, max_count=max_count)
        )
        if self._cache_registration is not None:
            self._cache_registration.update(max_age=age, max_count=max_count)
        return done.info

    async def cache_clear(self) -> dict[str, Any]:
        """Empty the cache everywhere; it stays registered."""
        done = await self._storage_done(lambda req: CacheClear(req=req))
        return done.info

    async def cache_remove(self) -> bool:
        """Remove the cache everywhere and stop the keep-alives; False if there was none."""
        self._stop_cache_keepalives()
        self._cache_registration = None
        done = await self._storage_done(lambda req: CacheRemove(req=req))
        return bool(done.info.get("removed"))

    async def cache_info(self) -> dict[str, Any]:
        """The cache's pattern, policy, timeout and number of events waiting."""
        done = await self._storage_done(lambda req: GetCacheInfo(req=req))
        self._note_dropped(done.info)
        return done.info

    async def cache_keepalive(self) -> dict[str, Any]:
        """Send a keep-alive now (they are sent by themselves; this is for tests and tools).
        Registers the cache again if the router does not know it and we registered it."""
        try:
            done = await self._storage_done(lambda req: CacheKeepalive(req=req))
        except RemoteError as exc:
            reg = self._cache_registration
            if exc.code != "unknown-cache" or reg is None:
                raise
            log.info("the router had lost our cache; registering it again")
            done = await self._storage_done(lambda req: CacheRegister(req=req, **reg))
        self._note_dropped(done.info)
        return done.info

    def _note_dropped(self, info: dict[str, Any]) -> None:
        """Tell what the cache lost since last told (counts are the router's own: a lower one,
        from another router's copy, becomes the new baseline)."""
        dropped = _dropped_of(info)
        new, self._cache_dropped = dropped - self._cache_dropped, dropped
        if new <= 0:
            return
        if self._cache_on_dropped is None:
            log.warning(
                "the client cache lost %d events to its count or age limit before they were "
                "acknowledged",
                new,
            )
            return
        try:
            self._cache_on_dropped(new)
        except Exception:
            log.exception("cache on_dropped callback failed")

    # -- keep-alives ------------------------------------------------------------------------

    def _start_cache_keepalives(self) -> None:
        if self._cache_keepalive_task is None or self._cache_keepalive_task.done():
            self._cache_keepalive_task = asyncio.get_running_loop().create_task(
                self._cache_keepalive_loop(), name=f"aa-cache-keepalive-{self.client_id}"
            )

    def _stop_cache_keepalives(self) -> None:
        task, self._cache_keepalive_task = self._cache_keepalive_task, None
        if task is not None:
            task.cancel()

    async def _cache_keepalive_loop(self) -> None:
        while self._cache_registration is not None and not self._closing:
            await asyncio.sleep(self._cache_registration["timeout"] * KEEPALIVE_FRACTION)
            if self.connected:
                await self._cache_keepalive_quietly()

    async def _cache_keepalive_quietly(self) -> None:
        try:
            await self.cache_keepalive()
        except AaError as exc:
            log.info("cache keep-alive failed (next one later): %s", exc)

    def _caching_connected(self) -> None:
        """On every (re)connection: a keep-alive at once (it re-registers if needed)."""
        if self._cache_registration is not None:
            task = asyncio.get_running_loop().create_task(self._cache_keepalive_quietly())
            self._storage_background = task  # keep a reference until it is done

    def _caching_close(self) -> None:
        self._stop_cache_keepalives()
        for p in self._storage_requests.values():
            if not p.future.done():
                p.future.set_exception(ConnectionLost("the client closed"))
        self._storage_requests.clear()

    # -- requests and answers ---------------------------------------------------------------

    async def _storage_done(self, make: Callable[[int], Message]) -> CacheDone:
        """Send a request the router answers with `CacheDone`; that answer."""
        answer = await self._storage_request(make)
        if not isinstance(answer, CacheDone):
            raise ProtocolError("the router answered a cache request with events")
        return answer

    async def _storage_events(self, make: Callable[[int], Message]) -> list[Event]:
        """Send a request the router answers with events; all of them (of every frame)."""
        answer = await self._storage_request(make)
        if isinstance(answer, CacheDone):
            raise ProtocolError("the router answered a request for events without any")
        return answer

    async def _storage_request(self, make: Callable[[int], Message]) -> _Answer:
        await self.wait_connected(self.config.request_timeout)
        link = self._link
        if link is None:
            raise ConnectionLost("not connected")
        req = self._next_sub  # shared with sub_ids: an Error's ref names one request only
        self._next_sub += 1
        msg = make(req)
        fut: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._storage_requests[req] = _Pending(fut)
        try:
            self._send(msg)
            async with asyncio.timeout(self.config.request_timeout):
                ends: list[asyncio.Future[Any]] = [fut, link.lost]  # waited on, not read
                await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            raise AaTimeout(f"the router did not answer {msg.kind!r} in time") from None
        finally:
            self._storage_requests.pop(req, None)
        if not fut.done():
            raise ConnectionLost(f"the connection was lost before the router answered {msg.kind!r}")
        return fut.result()

    def _storage_answer(self, msg: CacheAnswer) -> None:
        p = self._storage_requests.get(msg.req)
        if p is None or p.future.done():
            return
        match msg:
            case CacheDone():
                p.future.set_result(msg)
            case Cached() | CacheEvents():
                p.events.extend(msg.events)
                if not msg.partial:
                    p.future.set_result(p.events)

    def _storage_error(self, msg: Error) -> bool:
        """Route a refusal of one of our storage requests; False if it is not one."""
        p = self._storage_requests.get(msg.ref) if msg.ref is not None else None
        if p is None:
            return False
        if not p.future.done():
            cls = PatternError if msg.code.startswith("pattern-") else RemoteError
            p.future.set_exception(cls(msg.message, code=msg.code))
        return True


class BlockingCacheClient:
    """The cache requests for the blocking `Client` (a mixin over its `AsyncClient`)."""

    _async: AsyncClient

    if TYPE_CHECKING:  # the blocking client's

        def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

    def cached(
        self,
        pattern: str | PatternSpec,
        *,
        since: datetime | None = None,
        limit: int | None = None,
        format: str = "expr",
        kernel: str = "python",
    ) -> list[Event]:
        """Blocking `AsyncClient.cached`."""
        return self._run(
            self._async.cached(pattern, since=since, limit=limit, format=format, kernel=kernel)
        )

    def cache_register(
        self,
        pattern: str | PatternSpec,
        *,
        max_age: Age = None,
        max_count: int | str | None = None,
        timeout: float = DEFAULT_CACHE_TIMEOUT,
        format: str = "expr",
        kernel: str = "python",
        on_dropped: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Blocking `AsyncClient.cache_register` (keep-alives go on in the client's thread,
        where *on_dropped* is called)."""
        return self._run(
            self._async.cache_register(
                pattern,
                max_age=max_age,
                max_count=max_count,
                timeout=timeout,
                format=format,
                kernel=kernel,
                on_dropped=on_dropped,
            )
        )

    def cache_fetch(self, limit: int | None = None) -> list[Event]:
        """Blocking `AsyncClient.cache_fetch`."""
        return self._run(self._async.cache_fetch(limit))

    def cache_ack(self, upto: str | None = None) -> dict[str, Any]:
        """Blocking `AsyncClient.cache_ack`."""
        return self._run(self._async.cache_ack(upto))

    def cache_policy(
        self, *, max_age: Age = None, max_count: int | str | None = None
    ) -> dict[str, Any]:
        """Blocking `AsyncClient.cache_policy`."""
        return self._run(self._async.cache_policy(max_age=max_age, max_count=max_count))

    def cache_clear(self) -> dict[str, Any]:
        """Blocking `AsyncClient.cache_clear`."""
        return self._run(self._async.cache_clear())

    def cache_remove(self) -> bool:
        """Blocking `AsyncClient.cache_remove`."""
        return self._run(self._async.cache_remove())

    def cache_info(self) -> dict[str, Any]:
        """Blocking `AsyncClient.cache_info`."""
        return self._run(self._async.cache_info())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._call(coro)
