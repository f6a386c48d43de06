"""Asking a router about the mesh: `GetMesh` and its answer `MeshInfo` (pure: no I/O).

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

__all__ = ["GetMesh", "MeshInfo", "MESH_INFO_FORMAT"]

#: Version of the layout of `MeshInfo.info`.
MESH_INFO_FORMAT: Final = 1


@register("get-mesh")
@dataclass(frozen=True, slots=True, kw_only=True)
class GetMesh(Message):
    """Ask the router for a `MeshInfo`."""


@register("mesh-info")
@dataclass(frozen=True, slots=True, kw_only=True)
class MeshInfo(Message):
    """The router's view of the mesh. `info` is a map::

    {"format": 1,
     "router": "<id of the answering router>",
     "routers": [                          # the answering router first
        {"id", "name", "peer": "host:port", "client": "host:port" | None,
         "uptime": seconds, "age": seconds since this summary was made (0 for the
         answering router), "clients": int,
         "peers": [{"id", "name", "address", "direction": "out" | "in", "since": seconds,
                    "events_in", "events_out": events on that link}],
         "poisoned": [{"address", "router_id", "failures", "retry_in": seconds}],
         "counters": {"events_in", "events_out", "duplicates", "dispatched",
                      "published", ...}},
        ...]}
    """

    info: Values = field(default_factory=dict)

    def __post_init__(self) -> None:
        if type(self.info) is not dict:
            raise InvalidValue("info must be a map")
        check_values(self.info, "info")

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "info": self.info}
