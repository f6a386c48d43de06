"""Asking a router about the mesh: `GetMesh` and its answer `MeshInfo`; telling it to forget a
router, `ForgetRouter`, answered by a `MeshInfo` too (pure: no I/O).

Any client may ask, after its hello (``aa mesh`` does). The router answers with what it knows:
itself, its peers, its poison list and its counters, and the same about every other router it
has heard from (routers flood a small periodic summary of themselves, so any one of them can
answer for the whole mesh). The answer is a plain map of event values, so it travels and
prints (JSON) without a schema of its own; its layout is `MeshInfo`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import InvalidValue
from ..values import Values, check_values
from .messages import Message, register

__all__ = ["GetMesh", "MeshInfo", "ForgetRouter", "MESH_INFO_FORMAT", "MAX_ROUTER_REF"]

#: Version of the layout of `MeshInfo.info`.
MESH_INFO_FORMAT: Final = 1
#: Longest router reference in a `ForgetRouter`, in characters: an id (64), a name (128) or a
#: "host:port" endpoint all fit.
MAX_ROUTER_REF: Final = 300


@register("get-mesh")
@dataclass(frozen=True, slots=True, kw_only=True)
class GetMesh(Message):
    """Ask the router for a `MeshInfo`."""


@register("forget-router")
@dataclass(frozen=True, slots=True, kw_only=True)
class ForgetRouter(Message):
    """Ask the router to drop *router* (its id, its name or its "host:port" endpoint) from
    its peer table, its topology file and its picture of the mesh (``aa mesh forget``). Only
    an administrator may (`aa.router.security.permissions`). The answer is a `MeshInfo`
    whose info has a ``forget`` map: ``{"router": as asked, "forgotten": [{"id", "name",
    "address"}], "refused": null | "the one-line reason"}``."""

    router: str

    def __post_init__(self) -> None:
        if type(self.router) is not str or not 0 < len(self.router) <= MAX_ROUTER_REF:
            raise InvalidValue(f"router must be a str of 1 to {MAX_ROUTER_REF} characters")

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "router": self.router}


@register("mesh-info")
@dataclass(frozen=True, slots=True, kw_only=True)
class MeshInfo(Message):
    """The router's view of the mesh. `info` is a map::

    {"format": 1,
     "router": "<id of the answering router>",
     "routers": [                          # the answering router first
        {"id", "name", "peer": "host:port", "client": "host:port" | None,
         "uptime": seconds, "age": seconds since this summary was made (0 for the
         answering router), "gone": true once its summaries stopped (two of its
         intervals missed: it stopped, or is cut off), "clients": int,
         "peers": [{"id", "name", "address", "direction": "out" | "in", "since": seconds,
                    "events_in", "events_out": events on that link}],
         "poisoned": [{"address", "router_id", "failures", "retry_in": seconds}],
         "counters": {"events_in", "events_out", "duplicates", "dispatched",
                      "published", ...},
         "routing": {"routing": "interest" | "flood", "settled", "complete": bool,
                     "awaited": int, "routers": int}},  # the answering router only
        ...]}

    ``routing`` says whether the answering router forwards by interest now: it floods
    while its view of the mesh is not settled and complete, or while it awaits the
    summaries of ``awaited`` routers that came back into reach (`aa.mesh.interest`).
    """

    info: Values = field(default_factory=dict)

    def __post_init__(self) -> None:
        if type(self.info) is not dict:
            raise InvalidValue("info must be a map")
        check_values(self.info, "info")

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "info": self.info}
