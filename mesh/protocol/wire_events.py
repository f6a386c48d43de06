"""Events on the wire: `[id, type, values, meta]` arrays, checked as they are read.

A router reads every event of every publish through here, so the usual event is checked in
one function call (`_event`); a frame decoded in steps has its events checked in steps too
(`events_from_wire_steps`), nested values included: one event may hold ~128,000 of them. A
client reads a delivery frame's events in one call (`deliver_items`), and a relaying router
a flood group's events in one (`flood_events`).
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import datetime
from typing import Any, Final, NoReturn

from ..errors import InvalidValue, MalformedFrame
from ..event import MAX_ID_LENGTH, META_PATH, META_TTL, Event
from ..values import _check_steps, _valid_map, check_values

__all__ = [
    "deliver_items",
    "event_to_wire",
    "event_from_wire",
    "events_from_wire_steps",
    "flood_events",
]


def event_to_wire(ev: Event) -> list[Any]:
    """An event as a compact array: [id, type, values, meta]. An array, not a map: no key
    strings to pack and unpack per event, on every hop."""
    return [ev.id, ev.type, ev.values, ev.meta]


def event_from_wire(data: Any) -> Event:
    """Check a peer's event array and build the event; `MalformedFrame` when it is wrong
    (the cheap fields first: a bad id is not found after a walk of all the values)."""
    if type(data) is not list or len(data) != 4:
        raise MalformedFrame("an event must be an array [id, type, values, meta]")
    id_, type_, values, meta = data
    if type_ is not None and type(type_) is not str:
        raise MalformedFrame("event type must be str or nil")
    if id_ is not None and (type(id_) is not str or not 0 < len(id_) <= MAX_ID_LENGTH):
        raise MalformedFrame(f"event id must be a str of 1 to {MAX_ID_LENGTH} characters")
    if type(values) is not dict or not _valid_map(values, 0):
        _bad_event("values", values)
    if meta is None:
        meta = {}
    elif type(meta) is not dict or not _valid_map(meta, 0):
        _bad_event("meta", meta)
    return Event.trusted(values, type_, meta, id_)


def _event(data: list[Any], checked: bool = False) -> Event:
    """`event_from_wire` of a 4-item list, its checks written out for the usual event (one
    call per event instead of three on the hot path); whatever is unusual or wrong goes to
    `event_from_wire`, which says what is wrong. *checked*: its values and meta are known
    good (`events_from_wire_steps` checked them)."""
    id_, type_, values, meta = data
    if (
        type(values) is dict
        and type(meta) is dict
        and (type_ is None or type(type_) is str)
        and (id_ is None or type(id_) is str and 0 < len(id_) <= MAX_ID_LENGTH)
        and (checked or _valid_map(values, 0) and (not meta or _valid_map(meta, 0)))
    ):
        return _trusted(values, type_, meta, id_)
    return event_from_wire(data)


_trusted = Event.trusted


def deliver_items(items: Any) -> tuple[tuple[tuple[int, ...], Event], ...]:
    """The items of a peer's `deliver` message: `[[sub_ids, event], ...]` to
    `((sub_ids, Event), ...)`, each event checked as `_event` checks it; `MalformedFrame`
    when an item or an event is wrong. A delivery frame holds at most as many items as the
    codec's `max_items` lets through, each checked once: no steps needed beyond the codec's."""
    if type(items) is not list:
        raise MalformedFrame("bad 'deliver' message: items must be a list")
    out = []
    for item in items:
        if type(item) is not list or len(item) != 2 or type(item[0]) is not list:
            raise MalformedFrame("bad 'deliver' message: each item is [sub_ids, event]")
        ev = item[1]
        out.append(
            (
                tuple(item[0]),
                _event(ev) if type(ev) is list and len(ev) == 4 else event_from_wire(ev),
            )
        )
    return tuple(out)


# What `flood_events` may accept without the full check of `event_from_wire`: maps whose keys
# are all str and whose values are all of these exact types. This is sound only for data fresh
# from `aa.mesh.protocol.codec.unpack`, which a flood group's blob always is: msgpack yields no
# int outside the value model's 64-bit range (its format has none), no tuple, no subclass, and
# the codec turns every extension into a datetime or refuses it. So the only things the full
# check could still find wrong are keys that are not str and nesting (depth, lists, maps), and
# the fast check defers every list and map value to it. Typical events are flat: this halves
# their checking. `tests/test_links_peering.py` holds the fast check to the full one.
_FLAT_TYPES: Final = frozenset({str, int, float, bool, type(None), bytes, datetime})


def _flat_map(m: dict[Any, Any]) -> bool:
    """Whether every key of *m* is a str and every value of a type in `_FLAT_TYPES`: a plain
    loop, which compiled is a few C calls per item (a generator, for `all`, is not)."""
    flat = _FLAT_TYPES
    for k, v in m.items():
        if type(k) is not str or type(v) not in flat:
            break
    else:
        return True
    return False


def flood_events(items: list[Any], ids: tuple[str, ...], ttl: int, path: Any) -> list[Event]:
    """The events of a flood group's unpacked blob *items* (as many as *ids*), checked, each
    with ``meta`` ttl and path set to *ttl* and *path* (the hop's: the blob's are stale and
    never read, so they need no check). `MalformedFrame` unless each item is a well-formed
    event array whose id is the one of *ids* at its place."""
    out: list[Event] = []
    for item, id_ in zip(items, ids):
        # The fast check (see `_FLAT_TYPES`): a flat event straight from msgpack.
        if type(item) is list and len(item) == 4:
            eid, etype, values, meta = item
            if type(meta) is dict:
                meta[META_TTL] = ttl
                meta[META_PATH] = None  # flat for the check; the real path just below
                if (
                    type(values) is dict
                    and eid == id_
                    and (etype is None or type(etype) is str)
                    and _flat_map(values)
                    and _flat_map(meta)
                ):
                    meta[META_PATH] = path
                    out.append(_trusted(values, etype, meta, eid))
                    continue
        # Anything else (nested values, a nil meta, or something wrong): the full check.
        ev = event_from_wire(item)
        if ev.id != id_:
            raise MalformedFrame("bad 'flood' message: a group's events do not match its ids")
        # The meta map was just unpacked (or made) for this event alone: set the hop's ttl
        # and path in place rather than copy it.
        meta = ev.meta
        meta[META_TTL] = ttl
        meta[META_PATH] = path
        out.append(ev)
    return out


#: Nested values checked per step of a publish decoded in steps (~2 ms of the densest).
NESTED_PER_STEP: Final = 8192

#: Events checked per step of a publish decoded in steps (~0.25 ms of usual events).
EVENTS_PER_STEP: Final = 256


def events_from_wire_steps(events: list[Any]) -> Generator[None, None, list[Event]]:
    """`_event` of each of *events*, a `yield` after every `EVENTS_PER_STEP` events and
    within an event's nested values every `NESTED_PER_STEP` (checking 10,000 usual events
    takes ~10 ms, one event of 120,000 nested empty lists ~30 ms)."""
    out = []
    for start in range(0, len(events), EVENTS_PER_STEP):
        for e in events[start : start + EVENTS_PER_STEP]:
            if (
                type(e) is not list
                or len(e) != 4
                or type(e[2]) is not dict
                or type(e[3]) is not dict
            ):
                out.append(event_from_wire(e))  # says what is wrong
                continue
            for where, value in (("values", e[2]), ("meta", e[3])):
                ok = _valid_map(value, 0, flat=True)
                if ok is None:  # nested values: checked a step at a time
                    yield from _nested(value, f"event {where}")
                elif not ok:  # a wrong one before any list or map: said without walking again
                    _refuse_event(e, where, value)
            out.append(_event(e, True))
        yield
    return out


def _refuse_event(e: list[Any], where: str, value: dict[str, Any]) -> NoReturn:
    """`MalformedFrame` for event *e* whose *where* is wrong, its id and type said first as
    `event_from_wire` says them — without its whole check, which would walk the values again
    (a large nested value, good, then a wrong meta: all of it again in one go)."""
    event_from_wire([e[0], e[1], {}, {}])  # raises for a wrong id or type
    _bad_event(where, value)


def _nested(values: dict[str, Any], where: str) -> Generator[None, None, None]:
    try:
        yield from _check_steps(values, where, NESTED_PER_STEP)
    except InvalidValue as exc:
        raise MalformedFrame(str(exc)) from None


def _bad_event(where: str, value: Any) -> NoReturn:
    if type(value) is not dict:
        raise MalformedFrame(f"event {where} must be a map")
    try:
        check_values(value, where)
    except InvalidValue as exc:
        raise MalformedFrame(str(exc)) from None
    raise MalformedFrame(f"event {where} is not valid")
