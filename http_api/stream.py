"""``GET /stream?pattern=…``: live events as server-sent events, for the monitor and any
browser (``new EventSource(url)``); ``POST /stream/tickets``: a one-use ticket that opens a
stream as its caller's user, since ``EventSource`` sends no ``Authorization`` header
(`tickets`).

Each stream is one `LocalSubscription` of the router. Its callback runs in the router's
dispatch, so it only appends the event to a bounded backlog and wakes the stream's writer;
encoding and writing happen in the writer's own task, off the event path. A reader slower
than the events loses the oldest (``event: dropped`` says how many) rather than grow the
router's memory. Messages::

    event: event         data: {"event": <typed JSON of the event>}      id: <event id>
    event: dropped       data: {"dropped": <count so far>}
    event: error         data: {"error": <code>, "message": <why the pattern stopped>}
    : keep-alive         (a comment, every STREAM_HEARTBEAT seconds of silence)
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from aa.mesh import Event, PatternSpec, event_to_json

from .callers import caller_of
from .limits import MAX_STREAM_BACKLOG, MAX_STREAMS, STREAM_HEARTBEAT
from .models import TicketOut
from .tickets import TicketsFull
from .web import error

__all__ = ["api", "close_streams"]

api = APIRouter(tags=["events"])

#: What a ticket asks its user to be allowed: a stream of every event it may receive.
_EVERY_EVENT = PatternSpec(kernel="python", format="expr", source="True")


class _Stream:
    __slots__ = ("backlog", "wake", "dropped", "closing", "sub", "receives")

    def __init__(self, receives: Callable[[str | None], bool]) -> None:
        self.sub: Any = None
        #: The types the caller may receive, per the rules in force at each event.
        self.receives = receives
        self.backlog: deque[Event] = deque()
        self.wake = asyncio.Event()
        self.dropped = 0
        self.closing = False

    def deliver(self, event: Event) -> None:
        if not self.receives(event.type):
            return
        backlog = self.backlog
        if len(backlog) >= MAX_STREAM_BACKLOG:
            backlog.popleft()
            self.dropped += 1
        backlog.append(event)
        self.wake.set()


def close_streams(app_state: Any) -> None:
    """End every open stream (the endpoint is closing)."""
    for s in list(app_state.streams):
        s.closing = True
        s.wake.set()
        s.sub.close()


def _sse(kind: str, data: dict[str, Any], id: str | None = None) -> str:
    head = f"id: {id}\n" if id else ""
    return (
        f"{head}event: {kind}\ndata: "
        f"{json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"
    )


async def _write(stream: _Stream, sub: Any, streams: set[_Stream]) -> AsyncIterator[str]:
    dropped = 0
    try:
        yield "retry: 2000\n: connected\n\n"
        while not stream.closing:
            if not stream.backlog:
                if sub.closed:
                    failure = sub.failure
                    if failure is not None:
                        yield _sse("error", {"error": failure.code, "message": str(failure)})
                    return
                stream.wake.clear()
                try:
                    await asyncio.wait_for(stream.wake.wait(), STREAM_HEARTBEAT)
                except TimeoutError:
                    yield ": keep-alive\n\n"
                continue
            parts = []
            backlog = stream.backlog
            while backlog:
                event = backlog.popleft()
                parts.append(_sse("event", {"event": event_to_json(event)}, event.id))
            if stream.dropped != dropped:
                dropped = stream.dropped
                parts.append(_sse("dropped", {"dropped": dropped}))
            yield "".join(parts)
    finally:
        sub.close()
        streams.discard(stream)


@api.get(
    "/stream",
    summary="Live events matching a pattern, as server-sent events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def stream(
    request: Request,
    pattern: str = Query("True", description="Pattern source (default: every event)"),
    kernel: str = "python",
    format: str = "expr",
    ticket: str | None = Query(
        None,
        description="A ticket from `POST /stream/tickets`, for a browser's EventSource, "
        "which sends no Authorization header: it opens one stream, within seconds",
        max_length=64,
    ),
) -> Response:
    """Only the types the caller may receive reach it, checked at each event against the
    rules in force then; a pattern kind its rules do not allow is a 403."""
    state = request.app.state
    gate = state.router.security
    identity = caller_of(request).identity
    spec = PatternSpec(kernel=kernel, format=format, source=pattern)
    gate.require_pattern(identity, spec, state.router.engine.tier(spec))
    if len(state.streams) >= MAX_STREAMS:
        return error(
            503,
            "full",
            f"this router already serves {MAX_STREAMS} streams",
            headers={"Retry-After": "10"},
        )
    s = _Stream(gate.receives(identity))
    sub = s.sub = state.router.subscribe(
        spec, s.deliver, scope=gate.scope_of(identity)
    )  # a refused pattern raises here: a 422
    state.streams.add(s)
    return StreamingResponse(
        _write(s, sub, state.streams),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@api.post(
    "/stream/tickets",
    status_code=201,
    response_model=TicketOut,
    summary="A ticket that opens one stream as the caller, for a browser's EventSource",
)
async def ticket(request: Request, response: Response) -> Response | TicketOut:
    """Called with the caller's ``Authorization`` header; the ticket goes in the stream's
    URL (``/stream?ticket=…``), opens one stream within `expires_in` seconds, and stands
    for that header (checked again when it is used: a token revoked since is refused)."""
    state = request.app.state
    gate = state.router.security
    identity = caller_of(request).identity
    gate.require_pattern(identity, _EVERY_EVENT, state.router.engine.tier(_EVERY_EVENT))
    header = request.headers.get("authorization")
    try:
        issued = state.tickets.issue(header, identity.user, now=state.clock())
    except TicketsFull as exc:
        return error(503, "full", str(exc), headers={"Retry-After": "5"})
    response.headers["Cache-Control"] = "no-store"
    return TicketOut(ticket=issued, expires_in=state.tickets.lifetime)
