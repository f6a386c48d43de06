"""The FastAPI application over a router's public interface: thin — each route translates
HTTP to one of the router's calls and back.

Routes (OpenAPI at ``/docs``)::

    GET    /                                 the web monitor (static/index.html)
    GET    /static/…                         monitor files and the JS client (aa.js)
    GET    /docs, /redoc, /openapi.json      the API's documentation (Swagger UI, ReDoc), local
    files GET    /health                           liveness and the router's counters
    GET    /mesh                             routers and links of the mesh
    POST   /events                           publish
    GET    /events?pattern=&since=&limit=    stored and cached history
    GET    /stream?pattern=                  live events as server-sent events
    POST   /stream/tickets                   a one-use ticket to open /stream from a browser
    POST   /clients                          register an HTTP client (→ id, token)
    GET    /clients/{id}                     …its patterns, policy, queue sizes
    DELETE /clients/{id}
    PUT    /clients/{id}/policy
    POST   /clients/{id}/patterns            add a pattern
    DELETE /clients/{id}/patterns/{pid}
    GET    /clients/{id}/feed                queued events: Atom, or JSON by Accept
    POST   /clients/{id}/ack                 acknowledge a cursor or an event id
    DELETE /clients/{id}/feed                drop everything queued

Errors are ``{"error": code, "message": text}`` with a 4xx status, never an exception in
the router: malformed JSON 400, no or wrong token 401, an address outside the allowed ranges
403, an unknown client 404, a body over the cap 413, a well-formed request the router refuses
(unknown field, wrong type, bad pattern, bad policy) 422, a full router or an unreachable
store 503.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from importlib.resources import files
from typing import Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from aa.mesh import (
    AaError,
    Event,
    NotAuthenticated,
    PatternError,
    PatternSpec,
    PermissionDenied,
    StoreError,
    UsageError,
    event_to_json,
    from_json,
    id_scope,
    to_json,
)
from aa.router import parse_duration, scoped_id
from aa.router.store import event_order

from .app_shell import add_app_shell
from .atom import ATOM_TYPE, HTTP_PUBLISHER, EntryCache, render_atom
from .callers import caller_of, gate_dependency
from .clients import BadToken, Capacity, HttpClients, UnknownClient
from .docs import add_docs
from .fastfeed import FeedFastPath
from .guard import Guard
from .limits import DEFAULT_ALLOW, MAX_BODY_BYTES, MAX_HISTORY
from .live import api as live_api
from .metrics import api as metrics_api
from .models import ISO_INSTANT, TYPED_VALUE, ErrorOut, Published, PublishIn
from .routes_clients import advice
from .routes_clients import api as clients_api
from .stream import api as stream_api
from .tickets import StreamTickets
from .web import error as _error
from .web import negotiate

__all__ = ["create_app"]

log = logging.getLogger("aa.http_api")

_STATIC = files("aa.http_api") / "static"
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut},
    401: {"model": ErrorOut},
    403: {"model": ErrorOut},
    404: {"model": ErrorOut},
    413: {"model": ErrorOut},
    422: {"model": ErrorOut},
}


#: Header of a ``GET /events`` answer from a router that keeps no store (value ``none``): the
#: answer holds only what its mesh cache has, whatever the body's format.
NO_STORE_HEADER = "Aa-Store"

#: What ``GET /events?since=`` reads: nothing, an ISO 8601 instant, or a duration of at most
#: a few digits (parse_duration reads more, but a longer one reaches past year 1).
_SINCE = "|".join(("^$", ISO_INSTANT, r"^[1-9][0-9]{0,3}(ms|s|m|h|d|w)$"))


def _parse_since(text: str, now: datetime) -> datetime:
    """``since``: an ISO 8601 instant (UTC when it names no zone) or a duration back from
    now (``"90s"``, ``"1h"``)."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        try:
            return now - parse_duration(text)
        except UsageError:
            raise UsageError(
                f"since {text!r} is neither an ISO 8601 instant nor a duration such as '90s' or "
                "'1h'"
            ) from None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def create_app(
    router: Any,
    *,
    allow: Iterable[str] = DEFAULT_ALLOW,
    max_body: int = MAX_BODY_BYTES,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    names: Iterable[str] | None = (),
) -> Guard:
    """The ASGI application serving *router*: the FastAPI app behind the `Guard`.

    Every route asks *router*'s gate (``router.security``, `aa.router.security.Gate`) who is
    calling and what they may do (`callers`). *names* are the host names the endpoint
    answers to besides loopback's (the ``Host`` check, `guard`); None answers any (for a
    proxy in front that checks them). *clock* (monotonic seconds) drives HTTP clients'
    keep-alives, *wall* (epoch seconds) the feeds' Last-Modified and token expiry; tests pass
    their own. Raises `UsageError` for a bad range.
    """
    app = FastAPI(
        title="Aa router",
        version="1",
        description="The RESTful endpoint of an Aa router (Å §4.8): publish, register HTTP "
        "clients whose events the mesh keeps, poll their Atom feeds, watch the mesh.",
        responses=_ERRORS,
        docs_url=None,  # served by add_docs from local files: the default loads them from a CDN
        redoc_url=None,
        dependencies=[Depends(gate_dependency)],  # every route asks who is calling
    )
    _typed_values_schema(app)
    app.state.router = router
    app.state.clients = HttpClients(router.caches)
    app.state.clock = clock
    app.state.wall = wall
    app.state.streams = set()
    app.state.tickets = StreamTickets()  # stream tickets for browsers (`tickets`)
    app.state.entries = EntryCache()  # rendered Atom entries, shared by every feed
    app.state.closing = None  # set by HttpEndpoint: an asyncio.Event, set on shutdown
    _handlers(app)

    @app.get("/", include_in_schema=False)
    async def monitor() -> FileResponse:
        return FileResponse(str(_STATIC / "index.html"), media_type="text/html")

    @app.get("/health", summary="Liveness, and the router's counters")
    async def health(request: Request) -> dict[str, Any]:
        router.security.require_covered(caller_of(request).identity)
        return {"status": "ok", **to_json(router.stats())}

    @app.get("/mesh", summary="Routers and links of the mesh, as this router knows it")
    async def mesh(request: Request) -> dict[str, Any]:
        """`Router.mesh_info()` (layout: `aa.mesh.MeshInfo`), plus ``links``: each pair of
        router ids with a peer link between them, once."""
        router.security.require_covered(caller_of(request).identity)
        info: dict[str, Any] = to_json(router.mesh_info())
        pairs = {
            tuple(sorted((r["id"], p["id"])))
            for r in info.get("routers", [])
            for p in r.get("peers", [])
            if p.get("id")
        }
        info["links"] = [list(p) for p in sorted(pairs)]
        return info

    @app.post(
        "/events",
        status_code=201,
        response_model=Published,
        summary="Publish an event",
        responses={
            200: {
                "model": Published,
                "description": "A retried publish: an event with this `id` is "
                "already in the mesh, so nothing was sent (`duplicate: true`)",
            }
        },
    )
    async def publish(body: PublishIn, request: Request, response: Response) -> Published:
        """201 with the new event's id; 200 with ``duplicate: true`` when the ``id`` given was
        already seen (the mesh has the event: a retry after a lost answer is safe)."""
        values, meta = from_json(body.values), from_json(body.meta)
        count = meta.get("max_count")
        if type(count) is float and count.is_integer():  # JSON has one number type: 5.0 is 5
            meta["max_count"] = int(count)
        peer = request.client
        address = f"{peer.host}:{peer.port}" if peer else "http"
        # The id scope of this publisher (`aa.mesh.id_scope`): its bearer token, else its host,
        # so an id it proposes can only be a duplicate of its own, never of someone else's.
        who = request.headers.get("authorization") or (peer.host if peer else "http")
        scope = id_scope("http:" + who)
        # The user (Å §4.6, `meta["user"]`): the token's user, or the owner of the HTTP client
        # whose token the request carries; what it may publish and persist is the gate's say.
        identity = caller_of(request).identity
        router.security.require_publish(
            identity, Event(values={}, type=body.type, meta=meta), "persist"
        )
        user = identity.user
        event = router.publish(
            values,
            type=body.type,
            meta=meta,
            id=body.id,
            client_id=HTTP_PUBLISHER,
            address=address,
            scope=scope,
            user=user,
        )
        if (
            event is None
        ):  # a retried publish: the id is already in the mesh, as the first answer gave it
            response.status_code = 200
            return Published(id=scoped_id(scope + "-", body.id or ""), duplicate=True)
        return Published(id=event.id)

    @app.get(
        "/events",
        summary="Stored and cached events matching a pattern",
        description=(
            'Oldest first, at most `limit`. JSON: `{"events": [...], "more": bool}`: `more` says '
            "the "
            "answer was cut at `limit`, and `next` (when the cut falls between two times) is this "
            "query from the first event left out: follow it for the rest. Events stamped with one "
            "time are never split across `next`: a larger `limit` gets past them. `warnings` "
            "(when there are any) says why the pattern may never match. A router "
            "that keeps no store answers from its mesh cache alone and says so: header "
            f"`{NO_STORE_HEADER}: none` and a line in `warnings`; asked with "
            "`include_cache=false`, it answers 409 (`no-store`)."
        ),
        responses={409: {"model": ErrorOut, "description": "No store, and no cache asked for"}},
    )
    async def history(
        request: Request,
        pattern: str = Query("True", description="Pattern source (default: every event)"),
        kernel: Literal["python", "xpath"] = "python",
        format: Literal["expr", "script"] = "expr",
        since: str | None = Query(
            None,
            json_schema_extra={"pattern": _SINCE},
            description="ISO 8601 instant (UTC unless it says), or a duration back: "
            "'90s', '1h'; empty: no limit",
        ),
        limit: int = Query(100, ge=1, le=MAX_HISTORY),
        include_cache: bool = True,
    ) -> Response:
        spec = PatternSpec(kernel=kernel, format=format, source=pattern)
        identity = caller_of(request).identity
        router.security.require_pattern(identity, spec, router.engine.tier(spec))
        start = _parse_since(since, datetime.now(UTC)) if since else None
        # A router without a store answers from its mesh cache alone, and says so; asked
        # for stored events only, it has nothing that could ever answer.
        no_store = router.storage.no_store_note()
        if no_store is not None and not include_cache:
            return _error(409, "no-store", no_store)
        warnings = [*advice(request, spec), *([no_store] if no_store is not None else [])]
        headers = {NO_STORE_HEADER: "none"} if no_store is not None else None
        # The pattern is shown only what the caller may receive, so a page holds `limit` of
        # those and no script reads the others.
        events = await router.history(
            spec,
            since=start,
            limit=limit + 1,
            include_cache=include_cache,
            receives=router.security.receive_filter(identity),
        )
        beyond = events[limit] if len(events) > limit else None  # one more: is the answer cut?
        del events[limit:]
        t = _later(events[-1], beyond) if beyond is not None else None
        rest = str(request.url.include_query_params(since=t.isoformat())) if t is not None else None
        if negotiate(request.headers.get("accept"), ("application/json", ATOM_TYPE)) == ATOM_TYPE:
            body = render_atom(
                feed_id=f"urn:aa:history:{router.id}",
                title=f"Aa history: {pattern}",
                updated=datetime.now(UTC),
                author=router.name,
                links=[("self", str(request.url)), *([("next", rest)] if rest else [])],
                entries=[(e, ()) for e in events],
                cache=app.state.entries,
            )
            return Response(body, media_type=ATOM_TYPE, headers=headers)
        answer: dict[str, Any] = {
            "events": [event_to_json(e) for e in events],
            "more": beyond is not None,
        }
        if rest is not None:
            answer["next"] = rest
        if warnings:
            answer["warnings"] = warnings
        return JSONResponse(answer, headers=headers)

    app.include_router(live_api)  # before /clients/{client_id}, which would take "live"
    app.include_router(clients_api)
    app.include_router(stream_api)
    app.include_router(metrics_api)
    app.mount("/static", StaticFiles(directory=str(_STATIC)), name="static")
    add_docs(app, title="Aa router")
    add_app_shell(app)
    return Guard(FeedFastPath(app), allow=allow, max_body=max_body, names=names)


def _later(last: Any, beyond: Any) -> datetime | None:
    """The time of *beyond*, the first event past a cut answer, if it is later than the
    answer's *last* in the answer's own order (`event_order`): asking from it then gives
    exactly the rest. None when the two share a time (events stamped alike: only a larger
    limit gets past them)."""
    t, u = event_order(last)[0], event_order(beyond)[0]
    return u if u > t else None


def _allowed(app: FastAPI, request: Request) -> list[str]:
    """The methods some route of *app* answers on the request's path."""
    methods: set[str] = set()
    # Routes of included routers (no prefix) are listed on their own routers, not the app's.
    included = (*live_api.routes, *clients_api.routes, *stream_api.routes, *metrics_api.routes)
    for route in (*app.routes, *included):
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return sorted(methods | ({"HEAD"} if "GET" in methods else set()))


def _typed_values_schema(app: FastAPI) -> None:
    """Add the recursive ``TypedValue`` schema (`models.TYPED_VALUE`), which the models'
    schemas refer to, to the OpenAPI document FastAPI builds."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()  # FastAPI keeps it as app.openapi_schema
            schema.setdefault("components", {}).setdefault("schemas", {})["TypedValue"] = (
                TYPED_VALUE
            )
            return schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's way to extend the schema


def _handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        for e in errors:
            if e.get("type") == "json_invalid":
                why = (e.get("ctx") or {}).get("error", "")
                return _error(
                    400, "malformed-json", f"the body is not valid JSON: {why}".rstrip(": ")
                )
        parts = []
        for e in errors:
            where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
            parts.append(f"{where}: {e.get('msg', 'invalid')}")
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if any(e.get("loc") == ("body",) for e in errors) and kind != "application/json":
            # the body came as something else (curl -d sends a form), so FastAPI saw no JSON
            parts.insert(
                0,
                "the body must be JSON, sent with 'Content-Type: application/json' (not "
                f"{kind or 'no content type'})",
            )
        detail = json.loads(json.dumps(errors, default=str))
        return _error(422, "invalid-request", "; ".join(parts), detail=detail)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # Starlette names only the first route that matched the path; FastAPI makes one
            # route per method, so the Allow header must gather them all (RFC 9110 §15.5.6).
            headers["Allow"] = ", ".join(_allowed(app, request))
        return _error(exc.status_code, code, str(exc.detail), headers=headers or None)

    @app.exception_handler(NotAuthenticated)
    async def not_authenticated(request: Request, exc: NotAuthenticated) -> JSONResponse:
        return _error(
            401, "unauthorized", str(exc), headers={"WWW-Authenticate": 'Bearer realm="aa"'}
        )

    @app.exception_handler(PermissionDenied)
    async def denied(request: Request, exc: PermissionDenied) -> JSONResponse:
        return _error(403, "permission-denied", str(exc))

    @app.exception_handler(BadToken)
    async def bad_token(request: Request, exc: BadToken) -> JSONResponse:
        return _error(
            401, "unauthorized", str(exc), headers={"WWW-Authenticate": 'Bearer realm="aa"'}
        )

    @app.exception_handler(UnknownClient)
    async def unknown(request: Request, exc: UnknownClient) -> JSONResponse:
        return _error(404, "unknown-client", str(exc))

    @app.exception_handler(Capacity)
    async def full(request: Request, exc: Capacity) -> JSONResponse:
        return _error(503, "full", str(exc), headers={"Retry-After": "60"})

    @app.exception_handler(StoreError)
    async def store(request: Request, exc: StoreError) -> JSONResponse:
        return _error(
            503, "store", f"the store cannot answer now: {exc}", headers={"Retry-After": "10"}
        )

    @app.exception_handler(PatternError)
    async def pattern(request: Request, exc: PatternError) -> JSONResponse:
        return _error(422, "pattern", str(exc), reason=exc.code)

    @app.exception_handler(UsageError)
    async def usage(request: Request, exc: UsageError) -> JSONResponse:
        return _error(422, _code(exc), str(exc))

    @app.exception_handler(AaError)
    async def other(request: Request, exc: AaError) -> JSONResponse:
        return _error(400, _code(exc), str(exc))


def _code(exc: BaseException) -> str:
    """An error's code in the API's style: `InvalidPolicy` → "invalid-policy",
    `UsageError` → "usage"."""
    name = type(exc).__name__.removesuffix("Error") or "error"
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()
