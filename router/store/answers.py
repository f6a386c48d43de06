"""Answers to queries over stored and cached events: paging into frames, the historical
mark, and the arguments every query takes (a pattern, a `since`). Used by the store's
history and by the caches' requests alike."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Final

from aa.mesh import META_HISTORICAL, META_TIME, Event, PatternSpec, UsageError
from aa.mesh.protocol import MAX_ANSWER_EVENTS, Message

from ..seams import ClientPort

__all__ = ["as_spec", "check_since", "mark_historical", "event_order", "send_paged"]

log = logging.getLogger("aa.router.store")

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def as_spec(pattern: str | PatternSpec) -> PatternSpec:
    """*pattern* as a `PatternSpec` (a str is a python expression)."""
    if isinstance(pattern, PatternSpec):
        return pattern
    if isinstance(pattern, str):
        return PatternSpec(source=pattern)
    raise UsageError(
        f"a pattern is a PatternSpec or an expression (str), not {type(pattern).__name__}"
    )


def check_since(since: object) -> datetime | None:
    """*since* if it is None or an aware datetime; `UsageError` otherwise (a naive time is
    ambiguous: whose clock?)."""
    if since is None:
        return None
    if type(since) is not datetime:
        raise UsageError(
            f"since must be a datetime with a time zone, or None; not {type(since).__name__}"
        )
    if since.tzinfo is None:
        raise UsageError(
            "since must be an aware datetime (with a time zone), e.g. datetime.now(timezone.utc)"
        )
    return since


def mark_historical(event: Event) -> Event:
    """A copy of *event* marked as replayed rather than live (`META_HISTORICAL`)."""
    meta = dict(event.meta)
    meta[META_HISTORICAL] = True
    return Event.trusted(event.values, event.type, meta, event.id)


def event_order(event: Event) -> tuple[datetime, str]:
    """Sort key: the event's stamped time (naive or missing first), then its id."""
    t = event.meta.get(META_TIME)
    return (t if type(t) is datetime and t.tzinfo is not None else _EPOCH, event.id or "")


def send_paged(
    session: ClientPort, events: Sequence[Event], build: Callable[[list[Event], bool], Message]
) -> None:
    """Send *events* as `build(chunk, partial)` frames of at most `MAX_ANSWER_EVENTS`,
    halving a chunk that would outgrow the frame cap; the last frame has partial False."""
    chunks = [
        list(events[i : i + MAX_ANSWER_EVENTS]) for i in range(0, len(events), MAX_ANSWER_EVENTS)
    ] or [[]]
    for n, chunk in enumerate(chunks):
        _send_split(session, chunk, build, n < len(chunks) - 1)


def _send_split(
    session: ClientPort,
    chunk: list[Event],
    build: Callable[[list[Event], bool], Message],
    partial: bool,
) -> None:
    try:
        session.send(build(chunk, partial))
    except UsageError:  # over the frame cap
        if len(chunk) <= 1:
            log.warning("an event too large to answer with was left out for %s", session.client_id)
            if not partial:
                session.send(build([], False))
            return
        half = len(chunk) // 2
        _send_split(session, chunk[:half], build, True)
        _send_split(session, chunk[half:], build, partial)
