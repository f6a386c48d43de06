"""``GET /clients/live``: the TCP clients connected now, the slowest subscribers first, for
``aa top`` and scripts.

Per client: its id, name, user, address, seconds connected, events it published and
deliveries written to it with their rates, bytes written to it that it has not read yet
(``buffered``), deliveries dropped because it did not read, and its subscriptions with the
tier each pattern runs in. "Slowest" is the most bytes buffered, then the most dropped.

Bounded with many clients: a page holds at most `MAX_LIVE_PAGE` clients (``limit``,
``offset``), each with at most `MAX_LIVE_SUBSCRIPTIONS` subscriptions listed and pattern
text cut at `MAX_PATTERN_SHOWN`; the page is chosen with a heap, not a sort of everyone.
Rates are per client over the time since the previous look at it (at least `MIN_WINDOW`;
the average since it connected at the first look), kept in a weak map that holds only
clients shown and forgets a client with its connection.

``GET /patterns/live``: the patterns whose evaluations took the most CPU
(`PatternEngine.cpu_top`), at most `MAX_CPU_TOP`, with their tier and subscribers.

Who sees whom: the gate is asked as for ``/health`` (a caller the permissions file covers);
a caller whose user may receive every event type (``subscribe = ["*"]``) sees every client,
since the meta of every event already tells such a user its publisher's client, address and
user; any other caller sees only the clients of its own user.
"""

from __future__ import annotations

import heapq
import time
from typing import Any, Final
from weakref import WeakKeyDictionary

from fastapi import APIRouter, Query, Request

from aa.router.patterns import MAX_CPU_TOP

from .callers import caller_of

__all__ = ["api", "MAX_LIVE_PAGE", "MAX_LIVE_SUBSCRIPTIONS", "live_clients", "live_patterns"]

#: Most clients one page lists: a few hundred bytes each, so a page stays under a megabyte.
MAX_LIVE_PAGE: Final = 1000
#: Subscriptions listed per client (the count says how many it has): a client may have
#: thousands, and the page must stay bounded.
MAX_LIVE_SUBSCRIPTIONS: Final = 20
#: Characters of a pattern's source shown (a script can be long).
MAX_PATTERN_SHOWN: Final = 200
#: Seconds a rate is measured over at the least: looks closer together reuse the last rate.
MIN_WINDOW: Final = 1.0

api = APIRouter(tags=["operations"])


@api.get("/clients/live", summary="TCP clients connected now, the slowest subscribers first")
async def clients_live(
    request: Request,
    limit: int = Query(50, ge=1, le=MAX_LIVE_PAGE, description="clients in this page"),
    offset: int = Query(0, ge=0, le=1_000_000, description="clients skipped (slowest first)"),
) -> dict[str, Any]:
    """``{"router", "id", "clients": how many the caller may see, "offset", "more",
    "items": [...]}``; each item as the module says (`aa.http_api.live`)."""
    state = request.app.state
    router = state.router
    identity = caller_of(request).identity
    rules = router.security.require_covered(identity)
    own = None if rules.subscribe_any else identity.user
    rates = getattr(state, "live_rates", None)
    if rates is None:
        rates = state.live_rates = WeakKeyDictionary()
    return live_clients(router, limit=limit, offset=offset, user=own, rates=rates)


@api.get("/patterns/live", summary="The patterns whose evaluation took the most CPU")
async def patterns_live(
    request: Request,
    limit: int = Query(20, ge=1, le=MAX_CPU_TOP, description="patterns listed"),
) -> dict[str, Any]:
    """``{"router", "id", "items": [{"pattern", "kernel", "format", "tier", "subscribers",
    "cpu"}...]}``, the dearest first; ``cpu`` in seconds since the pattern was created.
    Who sees what as for ``/clients/live``: a caller without ``subscribe = ["*"]`` sees only
    the patterns of its own user's clients."""
    router = request.app.state.router
    identity = caller_of(request).identity
    rules = router.security.require_covered(identity)
    own = None if rules.subscribe_any else identity.user
    return live_patterns(router, limit=limit, user=own)


def live_patterns(router: Any, *, limit: int, user: str | None = None) -> dict[str, Any]:
    """The `limit` patterns of *router* (of *user*'s TCP clients only, unless None) whose
    evaluations took the most CPU, as `patterns_live` answers."""
    keys = None
    if user is not None:
        sessions = [s for s in list(router.sessions) if s.identity.user == user]
        keys = [sub for s in sessions for sub in list(s.subscriptions.values())]
    top = router.engine.cpu_top(limit, keys)
    return {
        "router": router.name,
        "id": router.id,
        "items": [
            {
                "pattern": _shown(c.spec.source),
                "kernel": c.spec.kernel,
                "format": c.spec.format,
                "tier": c.tier,
                "subscribers": c.subscribers,
                "cpu": round(c.cpu, 6),
            }
            for c in top
        ],
    }


def _shown(source: str) -> str:
    return source if len(source) <= MAX_PATTERN_SHOWN else source[:MAX_PATTERN_SHOWN] + "…"


def live_clients(
    router: Any,
    *,
    limit: int,
    offset: int = 0,
    user: str | None = None,
    rates: WeakKeyDictionary[Any, list[float]] | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The page of *router*'s sessions (of *user* only, unless None) the module describes;
    *rates* keeps each shown client's last look (a fresh one: rates since connect)."""
    now = time.monotonic() if now is None else now
    sessions = [s for s in list(router.sessions) if user is None or s.identity.user == user]
    page = heapq.nlargest(offset + limit, sessions, key=_slowness)[offset:]
    looks = rates if rates is not None else WeakKeyDictionary()
    return {
        "router": router.name,
        "id": router.id,
        "clients": len(sessions),
        "offset": offset,
        "more": offset + len(page) < len(sessions),
        "items": [_client(router, s, looks, now) for s in page],
    }


def _slowness(s: Any) -> tuple[int, int]:
    return s.backlog, s.dropped


def _client(
    router: Any, s: Any, looks: WeakKeyDictionary[Any, list[float]], now: float
) -> dict[str, Any]:
    events_in, events_out = s.events_in, s.events_out
    in_rate, out_rate = _rates(s, looks, now, events_in, events_out)
    subs = list(s.subscriptions.values())
    return {
        "id": s.client_id,
        "name": s.name,
        "user": s.identity.user,
        "address": s.address,
        "connected": round(max(0.0, now - s.connected_at), 3),
        "events_in": events_in,
        "events_out": events_out,
        "in_rate": round(in_rate, 2),
        "out_rate": round(out_rate, 2),
        "buffered": s.backlog,
        "dropped": s.dropped,
        "subscription_count": len(subs),
        "subscriptions": [_subscription(router, sub) for sub in subs[:MAX_LIVE_SUBSCRIPTIONS]],
    }


def _rates(
    s: Any, looks: WeakKeyDictionary[Any, list[float]], now: float, n_in: int, n_out: int
) -> tuple[float, float]:
    """Events per second in and out since the previous look at *s* (at least `MIN_WINDOW`
    ago, else that look's rates again); at the first look, since it connected."""
    look = looks.get(s)
    if look is None:
        age = max(now - s.connected_at, 1e-3)
        rates = (n_in / age, n_out / age)
    else:
        t, was_in, was_out, rate_in, rate_out = look
        if now - t < MIN_WINDOW:
            return rate_in, rate_out
        rates = ((n_in - was_in) / (now - t), (n_out - was_out) / (now - t))
    looks[s] = [now, n_in, n_out, *rates]
    return rates


def _subscription(router: Any, sub: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": sub.sub_id, "overflow": sub.overflow, "missed": sub.missed}
    try:
        spec = router.engine.pattern_of(sub)
    except Exception:  # stopped between the list and this look
        return {**out, "tier": None}
    source = spec.source
    return {
        **out,
        "pattern": _shown(source),
        "kernel": spec.kernel,
        "format": spec.format,
        "tier": router.engine.tier(spec),
    }
