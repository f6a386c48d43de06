"""Client requests about caches (`aa.router.caches.service.ClientCacheService.handle_request`):
the mesh cache (`GetCached`) and the client's own cache, answered in pages, refused "busy"
while the client has not read what was already sent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from aa.mesh import Event, InvalidPolicy, PatternError, UnknownCache, UsageError
from aa.mesh.protocol import (
    CacheAck,
    CacheClear,
    Cached,
    CacheDone,
    CacheEvents,
    CacheFetch,
    CacheKeepalive,
    CachePolicy,
    CacheRegister,
    CacheRemove,
    CacheRequest,
    Error,
    GetCached,
    GetCacheInfo,
)

from ..seams import ClientPort
from ..store import ExpiryPolicy, mark_historical, send_paged
from .clientcaches import Fetched

if TYPE_CHECKING:
    from .service import ClientCacheService

__all__ = ["handle_request", "marked", "cache_key", "owner_of", "MAX_ANSWER_BACKLOG"]

#: Bytes of unread answers (and deliveries) a client may have waiting before its next cache
#: request is refused with "busy": a few answer pages.
MAX_ANSWER_BACKLOG: Final = 4 * 1024 * 1024


def _policy_body(policy: ExpiryPolicy) -> dict[str, Any]:
    return {
        "max_age": None if policy.max_age is None else policy.max_age.total_seconds(),
        "max_count": policy.max_count,
    }


async def marked(
    select: Callable[[list[Event]], Awaitable[list[Event]]], events: list[Event], limit: int | None
) -> list[Event]:
    """The *events* a worker's pattern accepts (`select`), the first *limit*, marked historical."""
    return [mark_historical(e) for e in (await select(events))[:limit]]


def _answer_later(
    self: ClientCacheService, session: ClientPort, req: int, events: Awaitable[list[Event]]
) -> None:
    """Answer a `GetCached` once the pattern's worker has: one such query per client at a
    time (another is refused "busy"), the router's loop going on meanwhile."""
    if session in self.asking:
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
            self.asking.discard(session)
        send_paged(
            session,
            got,
            lambda chunk, partial: Cached(req=req, events=tuple(chunk), partial=partial),
        )

    self.asking.add(session)
    task = asyncio.get_running_loop().create_task(answer())
    self.queries.add(task)
    task.add_done_callback(self.queries.discard)


def cache_key(owner: str, client_id: str) -> str:
    """The key of *owner*'s client cache for *client_id*: ``owner/client_id``. A user name
    holds no ``/`` (`aa.router.security`), so the key names its owner unambiguously, travels
    with every flood of the cache (the owner is part of it) and no client id one user picks
    reaches another user's cache."""
    return f"{owner}/{client_id}"


def owner_of(key: str) -> str | None:
    """The user a TCP client cache *key* belongs to (None: not such a key)."""
    owner, slash, _ = key.partition("/")
    return owner if slash else None


def handle_request(
    self: ClientCacheService,
    session: ClientPort,
    msg: CacheRequest,
    *,
    owner: str | None = None,
    receives: Callable[[str | None], bool] | None = None,
) -> None:
    """A storage request of *session*'s client: the mesh cache (`GetCached`: only what
    *receives* admits, when given), or its own client cache — *owner*'s cache for the
    session's client id (`cache_key`); without an owner, the client id alone (in-process
    callers)."""
    req = msg.req
    if session.backlog > MAX_ANSWER_BACKLOG:
        # A client that asks and does not read must not make us hold its answers: each
        # is up to thousands of events, and unread ones would pile up without bound.
        self.counters["busy"] += 1
        session.send(
            Error(code="busy", message="read the answers already sent before asking again", ref=req)
        )
        return
    if isinstance(msg, GetCached):
        try:
            events = self.cached(
                msg.pattern,
                since=msg.since,
                limit=msg.limit,
                receives=receives,
            )
            if not isinstance(events, list):  # pattern code: answered once its worker did
                _answer_later(self, session, req, events)
                return
        except UsageError as exc:
            session.send(Error(code=getattr(exc, "code", "bad-request"), message=str(exc), ref=req))
            return
        except Exception as exc:  # PatternError (a RemoteError) carries its code
            session.send(Error(code=getattr(exc, "code", "error"), message=str(exc), ref=req))
            return
        send_paged(
            session,
            events,
            lambda chunk, partial: Cached(req=req, events=tuple(chunk), partial=partial),
        )
        return
    shown = session.client_id or "?"
    client_id = shown if owner is None else cache_key(owner, shown)
    try:
        match msg:
            case CacheRegister():
                policy = ExpiryPolicy.parse(max_age=msg.max_age, max_count=msg.max_count)
                self.register(client_id, msg.pattern, policy, msg.timeout)
            case CacheKeepalive():
                if not self.keepalive(client_id):
                    raise UnknownCache(f"no event cache is registered for client {shown!r}")
            case CacheFetch():
                self.keepalive(client_id)
                got = self.fetch(client_id, after=msg.after, limit=msg.limit)
                if owner is not None:  # what its owner may receive now (the rules may have changed)
                    got = _receivable(got, receives)
                _send_events(session, req, got)
                return
            case CacheAck():
                self.keepalive(client_id)
                self.ack(client_id, msg.upto)
            case CachePolicy():
                policy = ExpiryPolicy.parse(max_age=msg.max_age, max_count=msg.max_count)
                self.keepalive(client_id)
                self.set_policy(client_id, policy)
            case CacheClear():
                self.keepalive(client_id)
                self.clear(client_id)
            case CacheRemove():
                removed = self.remove(client_id)
                session.send(CacheDone(req=req, info={"client_id": shown, "removed": removed}))
                return
            case GetCacheInfo():
                self.keepalive(client_id)
            case _:  # typed out, but a caller may still pass anything
                raise UsageError(f"not a cache request: {msg.kind!r}")
        session.send(CacheDone(req=req, info=_info_map(self, client_id, shown, receives)))
    except InvalidPolicy as exc:
        session.send(Error(code="invalid-policy", message=str(exc), ref=req))
    except UnknownCache as exc:
        session.send(Error(code="unknown-cache", message=str(exc), ref=req))
    except PatternError as exc:
        session.send(Error(code=exc.code, message=str(exc), ref=req))
    except UsageError as exc:
        session.send(Error(code="bad-request", message=str(exc), ref=req))


def _info_map(
    self: ClientCacheService,
    client_id: str,
    shown: str,
    receives: Callable[[str | None], bool] | None,
) -> dict[str, Any]:
    info = self._caches.info(client_id)
    return {
        "client_id": shown,
        "timeout": info.timeout,
        "size": info.size,
        # Taken and lost to the count or age limit before acknowledged: missed while away.
        # A cache takes what its pattern matches and its owner's permissions filter only what
        # is fetched: with permissions, the count could tell of events the owner may not see.
        "dropped": self.dropped(client_id) if receives is None else None,
        "pattern": self._specs[client_id].source,
        **_policy_body(info.policy),
    }


def _receivable(got: Fetched, receives: Callable[[str | None], bool] | None) -> Fetched:
    """*got* without the events its owner may not receive (the cursor stays: acknowledging
    past them is harmless)."""
    if receives is None:
        return got
    events = [e for e in got.events if receives(e.type)]
    if len(events) == len(got.events):
        return got
    return Fetched(events=events, cursor=got.cursor, more=got.more)


def _send_events(session: ClientPort, req: int, got: Fetched) -> None:
    send_paged(
        session,
        got.events,
        lambda chunk, partial: CacheEvents(
            req=req, events=tuple(chunk), cursor=got.cursor, more=got.more, partial=partial
        ),
    )
