"""The quench registrations one router knows, and the interest its own publishers hear of
(pure: no I/O; time is passed in as `now`, monotonic seconds).

Two tables:

- **Registrations** (`QuenchTable.registrations`), every router: each prototype registered
  anywhere in the mesh, with the local subscriptions that match it now. A registration from
  another router lives until its keep-alive lapses (`expire`), or a ``remove`` comes; one
  owned here (its publisher's session is on this router) lives as long as that session.
- **Interest** (`QuenchTable.interest`), owner only: per owned registration and per router,
  the set of that router's subscriptions that match, and when that router last said so.
  Routers report a full set each time (never a delta), so a report lost or overtaken costs
  nothing once the next one arrives; `report` turns a new set into the changes the publisher
  is told. A router that stops reporting (it left, it crashed, the mesh split) has its
  subscriptions declared gone after the timeout (`expire_interest`): reports refresh with
  every keep-alive of the registration, so a live router's set never lapses.

Bodies that came over the mesh are checked here (`parse_registrations`, `parse_report`): a
malformed one raises `ValueError` and is dropped by the caller, never half-applied.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Final

from aa.mesh import Event, InvalidValue, check_values

__all__ = [
    "Registration",
    "QuenchTable",
    "Change",
    "parse_registrations",
    "parse_report",
    "MAX_REGISTRATIONS",
    "MAX_REPORTED_SUBS",
]

#: Registrations one router keeps (its own and the mesh's), in registrations. Each costs one
#: prototype evaluation per new subscription; ten thousand publishers is far beyond an office.
MAX_REGISTRATIONS: Final = 10_000
#: Subscription ids one router may report for one registration: a router holds at most
#: this many subscriptions matching one prototype in any sane mesh.
MAX_REPORTED_SUBS: Final = 10_000
#: Longest registration id (client id, "/", number), client or router id, in characters.
MAX_ID: Final = 300

#: (router id, subscription id, interested): one line of a `QuenchNotice`.
Change = tuple[str, str, bool]


@dataclass(slots=True, kw_only=True)
class Registration:
    """A prototype registered somewhere in the mesh."""

    #: Mesh-wide id: "<client id>/<client's number>".
    reg: str
    #: The publisher's client id, and its number for the registration.
    client: str
    number: int
    #: Id of the router holding the publisher's session (where reports go).
    owner: str
    prototype: Event
    mentioned_only: bool
    #: Seconds it lives without a keep-alive (on routers other than the owner).
    timeout: float
    #: Monotonic time it lapses; None when owned here.
    expires: float | None
    #: Local subscriber keys whose patterns match the prototype now.
    matches: set[Hashable] = field(default_factory=set)

    def body(self) -> dict[str, Any]:
        """What floods for it (one entry of a ``register`` control)."""
        return {
            "reg": self.reg,
            "client": self.client,
            "number": self.number,
            "values": self.prototype.values,
            "type": self.prototype.type,
            "mentioned_only": self.mentioned_only,
            "timeout": self.timeout,
        }


class QuenchTable:
    """See the module docstring."""

    def __init__(self, router_id: str, *, max_registrations: int = MAX_REGISTRATIONS) -> None:
        self.router_id = router_id
        self.max_registrations = max_registrations
        self.registrations: dict[str, Registration] = {}
        #: Owned registration → router id → (its matching subscription ids, when heard).
        self.interest: dict[str, dict[str, tuple[frozenset[str], float]]] = {}

    def __len__(self) -> int:
        return len(self.registrations)

    # -- registrations ---------------------------------------------------------------------

    def add_owned(self, reg: Registration) -> Registration:
        """Register a prototype of a local publisher (replacing one under the same id)."""
        reg.expires = None
        old = self.registrations.get(reg.reg)
        if old is not None:
            reg.matches = old.matches if old.prototype == reg.prototype else set()
        elif len(self.registrations) >= self.max_registrations:
            raise InvalidValue(
                f"this router keeps at most {self.max_registrations} quench registrations"
            )
        self.registrations[reg.reg] = reg
        self.interest.setdefault(reg.reg, {})
        return reg

    def upsert(self, reg: Registration, now: float) -> tuple[Registration, bool]:
        """A registration flooded by its owner (first time, or a keep-alive): (the entry, whether
        its prototype is new here, so that every subscription must be checked). Raises
        `InvalidValue` when the table is full."""
        old = self.registrations.get(reg.reg)
        if old is not None and old.expires is None and old.owner == self.router_id:
            if reg.owner != self.router_id:
                # The publisher failed over to another router: it is theirs now.
                self.interest.pop(reg.reg, None)
            else:
                return old, False
        reg.expires = now + reg.timeout
        if (
            old is not None
            and old.prototype == reg.prototype
            and old.mentioned_only == reg.mentioned_only
        ):
            old.owner, old.timeout, old.expires = reg.owner, reg.timeout, reg.expires
            return old, False
        if old is None and len(self.registrations) >= self.max_registrations:
            raise InvalidValue(
                f"this router keeps at most {self.max_registrations} quench registrations"
            )
        if old is not None:
            reg.matches = set()  # re-checked by the caller
        self.registrations[reg.reg] = reg
        return reg, True

    def remove(self, reg_id: str) -> Registration | None:
        self.interest.pop(reg_id, None)
        return self.registrations.pop(reg_id, None)

    def expire(self, now: float) -> list[str]:
        """Drop registrations from other routers whose keep-alive lapsed; their ids."""
        gone = [
            r.reg for r in self.registrations.values() if r.expires is not None and r.expires <= now
        ]
        for reg_id in gone:
            del self.registrations[reg_id]
        return gone

    def owned(self) -> list[Registration]:
        return [r for r in self.registrations.values() if r.expires is None]

    # -- interest (owner side) -------------------------------------------------------------

    def report(self, reg_id: str, router_id: str, subs: frozenset[str], now: float) -> list[Change]:
        """Router *router_id* says *subs* of its subscriptions match *reg_id* now: the
        changes to tell the publisher (none for a registration not owned here)."""
        table = self.interest.get(reg_id)
        if table is None:
            return []
        before = table[router_id][0] if router_id in table else frozenset()
        if subs:
            table[router_id] = (subs, now)
        else:
            table.pop(router_id, None)
        return _diff(router_id, before, subs)

    def expire_interest(self, now: float, timeout: float) -> dict[str, list[Change]]:
        """Declare gone what routers other than this one have not confirmed for *timeout*
        seconds: registration id → changes."""
        out: dict[str, list[Change]] = {}
        for reg_id, table in self.interest.items():
            for rid, (subs, heard) in list(table.items()):
                if rid != self.router_id and now - heard > timeout:
                    del table[rid]
                    out.setdefault(reg_id, []).extend(_diff(rid, subs, frozenset()))
        return out

    def interested(self, reg_id: str) -> list[Change]:
        """Everything that matches *reg_id* now, as changes (for a publisher that came back)."""
        table = self.interest.get(reg_id, {})
        return [(rid, s, True) for rid, (subs, _) in table.items() for s in sorted(subs)]


def _diff(router_id: str, before: frozenset[str], after: frozenset[str]) -> list[Change]:
    return [(router_id, s, False) for s in sorted(before - after)] + [
        (router_id, s, True) for s in sorted(after - before)
    ]


def _id(value: Any, what: str) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_ID:
        raise ValueError(f"{what} must be a str of 1 to {MAX_ID} characters")
    return value


def parse_registrations(
    body: dict[str, Any], *, owner: str, max_timeout: float
) -> list[Registration]:
    """The registrations of a ``register`` control from router *owner*. Raises `ValueError`."""
    regs = body.get("regs")
    if type(regs) is not list:
        raise ValueError("regs must be a list")
    out = []
    for r in regs:
        if type(r) is not dict:
            raise ValueError("each registration is a map")
        values = r.get("values")
        if type(values) is not dict:
            raise ValueError("values must be a map")
        check_values(values, "values")  # InvalidValue is a ValueError
        type_ = r.get("type")
        if type_ is not None and type(type_) is not str:
            raise ValueError("type must be a str or nil")
        timeout = r.get("timeout")
        if (
            not isinstance(timeout, (int, float))
            or isinstance(timeout, bool)
            or not 0 < timeout <= max_timeout
        ):
            raise ValueError(f"timeout must be in (0, {max_timeout}] seconds")
        number = r.get("number")
        if type(number) is not int:
            raise ValueError("number must be an int")
        out.append(
            Registration(
                reg=_id(r.get("reg"), "reg"),
                client=_id(r.get("client"), "client"),
                number=number,
                owner=owner,
                prototype=Event(values=values, type=type_),
                mentioned_only=r.get("mentioned_only") is True,
                timeout=float(timeout),
                expires=None,
            )
        )
    return out


def parse_report(body: dict[str, Any]) -> tuple[str, list[tuple[str, frozenset[str]]]]:
    """(reporting router, [(registration id, its matching subscription ids)]) of a
    ``report`` control. Raises `ValueError`."""
    router_id = _id(body.get("router"), "router")
    items = body.get("items")
    if type(items) is not list:
        raise ValueError("items must be a list")
    out = []
    for item in items:
        if type(item) is not list or len(item) != 2 or type(item[1]) is not list:
            raise ValueError("each item is [reg, [subscription ids]]")
        if len(item[1]) > MAX_REPORTED_SUBS:
            raise ValueError("too many subscriptions in one report")
        out.append((_id(item[0], "reg"), frozenset(_id(s, "subscription id") for s in item[1])))
    return router_id, out
