"""Answering a quench registration from the interest summaries of other routers (pure: no
I/O): does a router whose subscriptions may want *this* want what the publisher sends?

Under interest routing a router holds every other router's summary (`aa.router.links`), and
each summary carries what that router's subscriptions want (its ``listen`` part: the
routing filters of its patterns plus the names they declare they need; no store, no cache).
The publisher's router answers a registration from those: no registration, report or
keep-alive crosses the mesh.

A summary says which events a router *may* want, never which subscription wants them, so a
remote answer is one line per router, with the subscription id `SUMMARY_SUB`, and it errs
toward "someone listens": its filters are necessary conditions of the patterns (an event
type, equalities of values with constants, names that must be present), so a prototype that
a pattern there lets through passes its router's summary, and a summary widened past its caps
is "anything". A ``mentioned_only`` registration is not narrowed here: a filter keeps one
condition of a pattern (its type, say) and cannot tell whether the pattern names the
prototype's values, so only local answers drop catch-all patterns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from aa.mesh import Event, Interest

__all__ = ["SUMMARY_SUB", "Listening", "summary_answers"]

#: The subscription id of a remote router's answer: some subscription there may want it.
SUMMARY_SUB: Final = "*"


class Listening(Protocol):
    """Other routers' summaries, as quenching reads them (`aa.router.links.InterestService`)."""

    listeners: dict[str, Interest]
    on_listening: list[Callable[[str], None]]

    def listening_of(self, router_id: str) -> Interest | None:
        """What *router_id*'s subscriptions may want; None when it is not in the view."""


def summary_answers(interest: Interest | None, prototype: Event) -> bool:
    """Whether a router whose subscriptions want *interest* (None: a router we do not know)
    may want events like *prototype*.

    >>> from aa.mesh import InterestFilter
    >>> snow = Interest.of([InterestFilter(type="snow", has=("SnowDepth",))])
    >>> summary_answers(snow, Event(values={"SnowDepth": 50}, type="snow"))
    True
    >>> summary_answers(snow, Event(values={"Temperature": 3}, type="snow"))
    False
    """
    if interest is None:
        return False
    return interest.may_match(prototype)
