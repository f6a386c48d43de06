"""Stream tickets: how a browser opens ``GET /stream`` as a user, since ``EventSource`` cannot
send an ``Authorization`` header.

The page asks ``POST /stream/tickets`` with its header and gets a ticket, a random string it
puts in the stream's URL (``/stream?ticket=…``). A ticket is worth less than the credential
it stands for, so that the URL (which may reach a log or a browser's history) carries
nothing worth stealing:

- it opens one stream once: redeeming it removes it, and ``/stream`` is the only route
  that reads it;
- it expires `TICKET_LIFETIME` seconds after it was issued (``now`` passed in);
- it remembers the credential itself, not the user it named: redeeming resolves that
  credential again, so a token revoked or a client removed since is refused then (an
  anonymous caller's ticket stands for no credential, and opens what anonymous may);
- at most `MAX_TICKETS_PER_USER` wait per user (a new one pushes out that user's oldest;
  anonymous callers together are one user) and `MAX_TICKETS` in all (past it, 503): a
  caller asking for tickets in a loop costs bounded memory and takes no other user's.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

__all__ = [
    "MAX_TICKETS",
    "MAX_TICKETS_PER_USER",
    "TICKET_LIFETIME",
    "StreamTickets",
    "Ticket",
    "TicketsFull",
]

#: Seconds a ticket stays valid: long enough for a page to open its stream on a slow phone,
#: short enough that a ticket read from a log later opens nothing.
TICKET_LIFETIME: Final = 20.0
#: Tickets waiting per user: a page opens one stream at a time, and reopens it after a
#: break; more than this are a loop, whose oldest are dropped.
MAX_TICKETS_PER_USER: Final = 16
#: Tickets waiting in all (each holds a credential of at most 2 KiB: a few MiB at most).
MAX_TICKETS: Final = 2_000
#: Random bytes in a ticket (URL-safe base64: 43 characters).
_TICKET_BYTES: Final = 32


class TicketsFull(Exception):
    """`MAX_TICKETS` tickets are waiting: ask again in a few seconds."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a ticket stands for."""

    #: The ``Authorization`` header it was issued with; None for an anonymous caller.
    credential: str | None
    user: str
    expires: float


class StreamTickets:
    """The tickets waiting to be redeemed, oldest first."""

    def __init__(self, *, lifetime: float = TICKET_LIFETIME) -> None:
        self.lifetime = lifetime
        self._waiting: OrderedDict[str, Ticket] = OrderedDict()
        self._per_user: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def issue(self, credential: str | None, user: str, now: float) -> str:
        """A new ticket standing for *credential* (an ``Authorization`` header's value, None
        for none) of *user*; raises `TicketsFull` when `MAX_TICKETS` are waiting."""
        self._expire(now)
        mine = self._per_user.setdefault(user, [])
        if len(mine) >= MAX_TICKETS_PER_USER:
            self._drop(mine[0])
            mine = self._per_user.setdefault(user, [])
        if len(self._waiting) >= MAX_TICKETS:
            if not mine:
                del self._per_user[user]
            raise TicketsFull(f"{MAX_TICKETS} stream tickets are waiting to be used")
        ticket = secrets.token_urlsafe(_TICKET_BYTES)
        self._waiting[ticket] = Ticket(credential, user, now + self.lifetime)
        mine.append(ticket)
        return ticket

    def redeem(self, ticket: str, now: float) -> Ticket | None:
        """What *ticket* stands for, once: None when it is unknown, used or expired."""
        self._expire(now)
        found = self._waiting.get(ticket)
        if found is None:
            return None
        self._drop(ticket)
        return found

    def _expire(self, now: float) -> None:
        waiting = self._waiting
        while waiting:
            ticket, oldest = next(iter(waiting.items()))
            if oldest.expires > now:
                return
            self._drop(ticket)

    def _drop(self, ticket: str) -> None:
        found = self._waiting.pop(ticket)
        mine = self._per_user[found.user]
        mine.remove(ticket)
        if not mine:
            del self._per_user[found.user]
