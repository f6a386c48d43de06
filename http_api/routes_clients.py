"""Routes of HTTP clients (Å §4.8): registration, patterns, policy, the feed, acknowledgement.

Every route needs a caller whose user has the ``client_caches`` rule (`callers`, the router's
gate); everything under ``/clients/{id}`` is reached only with that client's own token or
its owner's user token, and shows only the event types the owner may receive now. The feed is
Atom unless ``Accept`` prefers JSON; both carry the same page (`clients.HttpClients.page`).
It answers conditional requests: ``If-None-Match`` against a strong ETag of the page's
content, else ``If-Modified-Since`` against its Last-Modified (`HttpClients.conditional`);
either gives a 304 without rendering. A poll, conditional or not, is the client's keep-alive.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from aa.mesh import META_TIME, PatternSpec, UsageError, event_to_json
from aa.router import ExpiryPolicy, parse_duration
from aa.router.security import Identity

from .atom import ATOM_TYPE, render_atom, render_json
from .callers import Caller, caller_of
from .clients import BadToken, HttpClient, HttpClients, UnknownClient
from .limits import (
    DEFAULT_KEEPALIVE,
    DEFAULT_MAX_COUNT,
    DEFAULT_PAGE,
    MAX_KEEPALIVE,
    MAX_PAGE,
    MIN_KEEPALIVE,
)
from .models import (
    AckIn,
    AckOut,
    ClientIn,
    ClientOut,
    PatternAdded,
    PatternIn,
    PatternOut,
    PolicyIn,
    Registered,
)
from .web import error, etag_matches, http_date, negotiate, parse_http_date

__all__ = ["api", "answer_feed", "advice", "FEED_FORMATS"]

api = APIRouter(tags=["clients"])

_FEED_TYPES = (ATOM_TYPE, "application/json")
FEED_FORMATS = {"atom": ATOM_TYPE, "json": "application/json"}


def _clients(request: Request) -> HttpClients:
    clients: HttpClients = request.app.state.clients  # set by the app factory
    return clients


def _caching_caller(request: Request) -> Caller:
    """The caller, if its user may own client caches (the rules in force now); raises
    `NotAuthenticated` or `PermissionDenied`."""
    caller = caller_of(request)
    request.app.state.router.security.require(
        caller.identity, "client_caches", "own client caches (HTTP clients)"
    )
    return caller


def _client(request: Request, client_id: str) -> HttpClient:
    """The client the path names, if the caller may reach it (`Caller.may_reach`). Another
    user's client is answered as unknown, so ids cannot be probed; an anonymous caller
    without the client's token is asked for it."""
    caller = _caching_caller(request)
    client = _clients(request).lookup(client_id, now=request.app.state.clock())
    if caller.may_reach(client):
        return client
    if caller.client is not None:
        raise BadToken("this token belongs to another HTTP client")
    if caller.identity.anonymous:
        raise BadToken("this resource needs the client's token: 'Authorization: Bearer <token>'")
    raise UnknownClient(f"no HTTP client {client_id!r} here (unknown, deleted or expired)")


def _check_patterns(request: Request, client: HttpClient | None, specs: list[PatternSpec]) -> None:
    """Each pattern must be one the owner (or, for a new client, the caller) may run."""
    gate = request.app.state.router.security
    identity = caller_of(request).identity if client is None else Identity(user=client.owner)
    engine = request.app.state.router.engine
    for spec in specs:
        gate.require_pattern(identity, spec, engine.tier(spec))


def _receives(request: Request, client: HttpClient) -> Callable[[str | None], bool]:
    """The test of types the client's owner may receive now."""
    receives: Callable[[str | None], bool] = request.app.state.router.security.receives(
        Identity(user=client.owner)
    )
    return receives


def _dropped(request: Request, client: HttpClient) -> dict[str, int] | None:
    """Each pattern's cache drops, unless permissions hide event types from the owner: a
    cache takes what its pattern matches, so its count could tell of events hidden to it."""
    gate = request.app.state.router.security
    if gate.receive_filter(Identity(user=client.owner)) is not None:
        return None
    return _clients(request).dropped(client)


async def _authenticated(client_id: str, request: Request) -> HttpClient:
    """The client the path names, if the caller may reach it. A dependency, so it is
    checked before the body is: a caller without the token learns nothing from a 422."""
    return _client(request, client_id)


Authenticated = Annotated[HttpClient, Depends(_authenticated)]


def _policy(body: PolicyIn | None) -> ExpiryPolicy:
    if body is None:
        return ExpiryPolicy(max_count=DEFAULT_MAX_COUNT)
    return ExpiryPolicy.parse(max_age=body.max_age, max_count=body.max_count)


def _keepalive(value: float | int | str | None) -> float:
    if value is None:
        return DEFAULT_KEEPALIVE
    seconds = parse_duration(value).total_seconds() if type(value) is str else float(value)
    if not MIN_KEEPALIVE <= seconds <= MAX_KEEPALIVE:
        raise UsageError(
            f"keepalive must be {MIN_KEEPALIVE:.0f} to {MAX_KEEPALIVE:.0f} seconds, not {seconds:g}"
        )
    return seconds


def _spec(body: PatternIn) -> PatternSpec:
    return PatternSpec(kernel=body.kernel, format=body.format, source=body.source)


def _feed_url(request: Request, client: HttpClient) -> str:
    scope = request.scope
    host = next((v for k, v in scope["headers"] if k == b"host"), None)
    key = (scope.get("scheme"), host, scope.get("server"), scope.get("root_path", ""))
    base = _BASES.get(key)
    if base is None:  # what Starlette's base_url makes of the same parts of the scope
        base = str(request.base_url).rstrip("/")
        if len(_BASES) >= _MAX_BASES:
            _BASES.pop(next(iter(_BASES)))
        _BASES[key] = base
    return f"{base}/clients/{client.id}/feed"


#: Base URLs of recent requests, by the parts of the request that make them: every feed
#: answer carries its URL, and building it (Starlette's URL) is a noticeable part of a poll.
#: A few distinct hosts are expected; a stranger sending made-up Host headers only
#: churns this many entries.
_MAX_BASES = 64
_BASES: dict[tuple[Any, ...], str] = {}


def _page_url(base: str, after: int | None, limit: int, format: str | None = None) -> str:
    query = [f"after={after}"] if after is not None else []
    if limit != DEFAULT_PAGE:
        query.append(f"limit={limit}")
    if format is not None:
        query.append(f"format={format}")
    return f"{base}?{'&'.join(query)}" if query else base


def _describe(request: Request, client: HttpClient) -> dict[str, Any]:
    policy = client.policy
    return {
        "id": client.id,
        "name": client.name,
        "policy": {
            "max_age": None if policy.max_age is None else policy.max_age.total_seconds(),
            "max_count": policy.max_count,
        },
        "keepalive": client.keepalive,
        "patterns": [_pattern_out(pid, s) for pid, s in client.patterns.items()],
        "queued": _clients(request).queued(client),
        "dropped": _dropped(request, client),
        "feed": _feed_url(request, client),
    }


def advice(request: Request, spec: PatternSpec) -> list[str]:
    """What a subscriber of *spec* would be told at subscribe (the router's advice): a name
    that looks like a typo of one events have had, a bare name meant as text."""
    notes = request.app.state.router.subscription_notes(spec, {})
    return list(notes["warnings"])


def _pattern_out(pid: str, spec: PatternSpec) -> dict[str, str]:
    return {"id": pid, "source": spec.source, "kernel": spec.kernel, "format": spec.format}


@api.post("/clients", status_code=201, response_model=Registered, summary="Register an HTTP client")
async def register(body: ClientIn, request: Request, response: Response) -> dict[str, Any]:
    """The router keeps the events matching the client's patterns in client caches under
    its policy (default: the newest 1,000 per pattern) until it polls; the answer holds the
    client's id and its token, which every later request about the client needs. The client
    belongs to the caller's user: it reaches what that user may receive, and is counted
    against that user's and this address's limits."""
    caller = _caching_caller(request)
    specs = [_spec(p) for p in body.patterns]
    _check_patterns(request, None, specs)
    peer = request.client
    client, token = _clients(request).register(
        name=body.name,
        policy=_policy(body.policy),
        keepalive=_keepalive(body.keepalive),
        patterns=specs,
        owner=caller.user,
        address=peer.host if peer else None,
        now=request.app.state.clock(),
    )
    response.headers["Location"] = f"/clients/{client.id}"
    warnings = [f"`{spec.source[:80]}`: {w}" for spec in specs for w in advice(request, spec)]
    return {**_describe(request, client), "token": token, "warnings": warnings}


@api.get("/clients/{client_id}", response_model=ClientOut, summary="An HTTP client")
async def describe(client: Authenticated, request: Request) -> dict[str, Any]:
    return _describe(request, client)


@api.delete("/clients/{client_id}", status_code=204, summary="Remove an HTTP client and its caches")
async def remove(client: Authenticated, request: Request) -> Response:
    _clients(request).remove(client)
    return Response(status_code=204)


@api.put("/clients/{client_id}/policy", response_model=ClientOut, summary="Change the cache policy")
async def set_policy(client: Authenticated, body: PolicyIn, request: Request) -> dict[str, Any]:
    _clients(request).set_policy(client, _policy(body))
    return _describe(request, client)


@api.get(
    "/clients/{client_id}/patterns",
    response_model=list[PatternOut],
    summary="The client's patterns",
)
async def patterns(client: Authenticated) -> list[dict[str, str]]:
    return [_pattern_out(pid, s) for pid, s in client.patterns.items()]


@api.post(
    "/clients/{client_id}/patterns",
    status_code=201,
    response_model=PatternAdded,
    summary="Add a pattern",
)
async def add_pattern(
    client: Authenticated, body: PatternIn, request: Request, response: Response
) -> dict[str, Any]:
    """Events matching it are kept for the client from now on. `warnings` says why it may
    never match (a name that looks like a typo of one events have had)."""
    spec = _spec(body)
    _check_patterns(request, client, [spec])
    pid = _clients(request).add_pattern(client, spec)
    response.headers["Location"] = f"/clients/{client.id}/patterns/{pid}"
    return {**_pattern_out(pid, spec), "warnings": advice(request, spec)}


@api.delete(
    "/clients/{client_id}/patterns/{pattern_id}", status_code=204, summary="Remove a pattern"
)
async def remove_pattern(client: Authenticated, pattern_id: str, request: Request) -> Response:
    if not _clients(request).remove_pattern(client, pattern_id):
        return error(404, "unknown-pattern", f"client {client.id!r} has no pattern {pattern_id!r}")
    return Response(status_code=204)


@api.post("/clients/{client_id}/ack", response_model=AckOut, summary="Acknowledge handled events")
async def ack(client: Authenticated, body: AckIn, request: Request) -> dict[str, int]:
    """Drop from the client's caches everything up to a feed ``cursor`` (from ``aa:cursor``,
    the ``Aa-Cursor`` header or the JSON ``cursor``), or up to an ``event`` id."""
    upto: int | str
    if body.cursor is not None and body.event is None:
        upto = body.cursor
    elif body.event is not None and body.cursor is None:
        upto = body.event
    else:
        raise UsageError("acknowledge either a 'cursor' or an 'event' id")
    return {"cursor": _clients(request).ack(client, upto)}


@api.delete("/clients/{client_id}/feed", status_code=204, summary="Drop everything queued")
async def clear(client: Authenticated, request: Request) -> Response:
    _clients(request).clear(client)
    return Response(status_code=204)


@api.get(
    "/clients/{client_id}/events/{event_id}",
    summary="One event kept for the client, as typed JSON (each feed entry links here)",
    responses={
        200: {"content": {"application/json": {}}},
        404: {"description": "Not kept for this client"},
    },
)
async def event(client: Authenticated, event_id: str, request: Request) -> Response:
    """``{"patterns": [...], "event": {"id", "type", "values", "meta"}}`` while the client's
    caches hold the event (until acknowledged or expired)."""
    found = _clients(request).find(client, event_id)
    if found is not None and not _receives(request, client)(found[0].type):
        found = None  # the owner may not receive this type (any longer)
    if found is None:
        return error(
            404, "unknown-event", f"no event {event_id!r} is kept for client {client.id!r}"
        )
    e, pids = found
    return JSONResponse({"patterns": list(pids), "event": event_to_json(e)})


@api.head("/clients/{client_id}/feed", include_in_schema=False)
@api.get(
    "/clients/{client_id}/feed",
    summary="Queued events: Atom (RFC 4287, paged per RFC 5005), or JSON",
    responses={
        200: {"content": {ATOM_TYPE: {}, "application/json": {}}},
        304: {"description": "Not modified"},
    },
)
async def feed(
    client_id: str,
    request: Request,
    after: int | None = Query(None, ge=0, description="Only events after this cursor"),
    limit: int = Query(
        DEFAULT_PAGE, ge=1, le=MAX_PAGE, description="Events per pattern on this page"
    ),
    format: Literal["atom", "json"] | None = Query(
        None, description="Atom or JSON, whatever Accept says"
    ),
) -> Response:
    """The events kept for the client, oldest first. Polling is the client's keep-alive and
    removes nothing: acknowledge with ``POST /clients/{id}/ack``."""
    return answer_feed(request, client_id, after=after, limit=limit, format=format)


def answer_feed(
    request: Request, client_id: str, *, after: int | None, limit: int, format: str | None
) -> Response:
    """The feed route's work, also called by `fastfeed` (which parses the query itself)."""
    state = request.app.state
    clients = _clients(request)
    now = state.clock()
    client = _client(request, client_id)
    clients.touch(client, now)
    page = clients.page(client, after=after, limit=limit)
    receives = _receives(request, client)
    entries = [(e, pids) for e, pids in page.entries if receives(e.type)]
    kind = FEED_FORMATS[format] if format else negotiate(request.headers.get("accept"), _FEED_TYPES)
    base = _feed_url(request, client)

    # The ETag names the page: its request, its bounds and every entry (one digest update,
    # not one per entry: a digest per entry would be most of the cost of a 304).
    shown = "|".join(
        [
            f"{kind}|{format}|{base}|{after}|{limit}|{page.cursor}|{page.more}|{','.join(client.patterns)}",
            *(f"{event.id}:{','.join(pids)}" for event, pids in entries),
        ]
    )
    etag = (
        f'"{hashlib.blake2b(shown.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()}"'
    )
    modified = clients.conditional(client, (kind, format, base, after, limit), etag, state.wall())
    headers = {
        "ETag": etag,
        "Last-Modified": http_date(modified),
        "Cache-Control": "private, no-cache",
        "Vary": "Accept, Authorization",
        "Aa-Cursor": str(page.cursor),
    }
    inm = request.headers.get("if-none-match")
    if inm is not None:
        if etag_matches(inm, etag):
            return Response(status_code=304, headers=headers)
    else:
        ims = request.headers.get("if-modified-since")
        since = parse_http_date(ims) if ims else None
        if since is not None and modified <= since:
            return Response(status_code=304, headers=headers)

    links = {
        "self": _page_url(base, after, limit, format),
        "first": _page_url(base, None, limit, format),
    }
    if page.more:
        links["next"] = _page_url(base, page.cursor, limit, format)
    if kind == "application/json":
        body = render_json(
            links=links, entries=entries, cursor=page.cursor, more=page.more, client=client.id
        )
        return Response(body, media_type="application/json", headers=headers)
    events = f"{base.removesuffix('/feed')}/events"
    stamps = [t for e, _ in entries if type(t := e.meta.get(META_TIME)) is datetime]
    updated = max(stamps) if stamps else client.created
    body = render_atom(
        feed_id=f"urn:aa:client:{client.id}",
        title=f"Aa events for {client.name or client.id}",
        updated=updated.astimezone(UTC),
        author=str(getattr(state.router, "name", "aa")),
        links=list(links.items()),
        entries=entries,
        patterns={pid: s.source for pid, s in client.patterns.items()},
        cursor=page.cursor,
        event_url=f"{events}/",
        cache=state.entries,
    )
    return Response(body, media_type=ATOM_TYPE, headers=headers)
