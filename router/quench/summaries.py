"""Answering a quench registration from the interest summaries of other routers (pure: no
I/O): does a router whose subscriptions may want *this* want what the publisher sends?

Under interest routing a router holds every other router's summary (`aa.router.links`), and
each summary carries what that router's subscriptions want (its ``listen`` part: the
routing filters of its patterns plus the names they declare they need; no store, no cache).
The publisher's router answers a registration from those: no registration, report or
keep-alive crosses the mesh.

A summary says which events a router *may* want, never which subscription wants them, so a
remote answer is one line per router, with the subscription id `SUMMARY_SUB`, and it errs
toward "someone listens": a summary widened past its caps is "anything" and counts, even
for a ``mentioned_only`` registration (it may hide a pattern that names the prototype's
values). Its filters are read as the pattern index reads them: an event type, equalities
of values with constants, names that must be present — the prototype is one event.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Final, Protocol

from aa.mesh import Event, Interest, InterestFilter

__all__ = ["SUMMARY_SUB", "Listening", "summary_answers"]

#: The subscription id of a remote router's answer: some subscription there may want it.
SUMMARY_SUB: Final = "*"


class Listening(Protocol):
    """Other routers' summaries, as quenching reads them (`aa.router.links.InterestService`)."""

    listeners: dict[str, Interest]
    on_listening: list[Callable[[str], None]]

    def listening_of(self, router_id: str) -> Interest | None:
        """What *router_id*'s subscriptions may want; None when it is not in the view."""


def summary_answers(interest: Interest | None, prototype: Event, mentioned_only: bool) -> bool:
    """Whether a router whose subscriptions want *interest* (None: a router we do not know)
    may want events like *prototype*.

    >>> hot = Interest.of([InterestFilter(type="snow", has=("SnowDepth",))])
    >>> summary_answers(hot, Event(values={"SnowDepth": 50}, type="snow"), False)
    True
    >>> summary_answers(hot, Event(values={"Temperature": 3}, type="snow"), False)
    False
    >>> summary_answers(Interest.of([InterestFilter(type="snow")]),
    ...                 Event(values={"SnowDepth": 50}, type="snow"), True)
    False
    """
    if interest is None or interest.empty:
        return False
    if interest.anything:
        return True
    if not mentioned_only and prototype.type in interest.types:
        return True
    names = prototype.values.keys()
    for f in interest.filters:
        if mentioned_only and not _mentions(f, names):
            continue
        if f.matches(prototype):
            return True
    return False


def _mentions(f: InterestFilter, names: Collection[str]) -> bool:
    return any(n in names for n in f.has) or any(n in names for n, _ in f.eq)
