"""What a router knows of the mesh, for `aa mesh` and `GET /mesh`: its own summary and the
latest summary flooded by every other router.

Every router floods a small `Control` with topic ``router-info`` every
`MeshConfig.info_interval` seconds (and when a link comes up): its id, name, endpoints, peers,
poison list and counters. Each router keeps the latest one of each origin, so any router can
answer for the whole mesh. A summary older than `GONE_AFTER` of its sender's intervals is
shown as gone (the router stopped, or is cut off: `aa mesh` says so rather than show its
last peers as if they were live), and forgotten after `FORGET_AFTER_INTERVALS`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from aa.mesh import MAX_PEERS, Control, PeerState, is_unspecified, parse_endpoint
from aa.mesh.protocol import MESH_INFO_FORMAT

from .config import summary_interval

if TYPE_CHECKING:
    from .meshservice import MeshService

__all__ = ["MeshView", "ROUTER_INFO_TOPIC", "MAX_LISTED", "GONE_AFTER", "FORGET_AFTER_INTERVALS"]

#: Control topic of the periodic router summaries.
ROUTER_INFO_TOPIC: Final = "router-info"
#: Most peers and poisoned entries one summary lists, in entries: keeps a summary a few KB.
MAX_LISTED: Final = 64
#: Intervals after which a router whose summaries stopped is shown as gone: one summary
#: lost or late on a busy link is normal, two in a row are not.
GONE_AFTER: Final = 2.5
#: Intervals after which the summary of a gone router is dropped: long enough for `aa mesh`
#: to show it as gone for a while, short enough not to keep it.
FORGET_AFTER_INTERVALS: Final = 6.0
#: Interval assumed when a summary does not say its own, and the bounds put on one that does
#: (seconds): a peer must not make us keep its summary for ever.


class MeshView:
    """The summaries of the other routers, and this router's own."""

    def __init__(self, mesh: MeshService) -> None:
        self.mesh = mesh
        # router id -> (summary, monotonic time it came); oldest first.
        self._remote: OrderedDict[str, tuple[dict[str, Any], float]] = OrderedDict()

    def on_info(self, control: Control, now: float | None = None) -> None:
        """A router-info control arrived (called once per origin and summary)."""
        origin = control.path[0]
        body = control.body
        if body.get("id") != origin:
            return  # a summary is only taken from the router it describes
        at = time.monotonic() if now is None else now
        self._remote[origin] = (dict(body), at)
        self._remote.move_to_end(origin)
        while len(self._remote) > MAX_PEERS:
            self._remote.popitem(last=False)

    def expire(self, now: float) -> None:
        for rid, (body, at) in list(self._remote.items()):
            if now - at > FORGET_AFTER_INTERVALS * summary_interval(body.get("interval")):
                del self._remote[rid]

    def summary_of(self, router_id: str) -> dict[str, Any]:
        """The latest summary of *router_id* ({} when we hold none)."""
        held = self._remote.get(router_id)
        return held[0] if held is not None else {}

    def forget(self, router_id: str) -> bool:
        """Drop the summary of *router_id*; whether there was one."""
        return self._remote.pop(router_id, None) is not None

    def names(self) -> dict[str, str]:
        """Router id by name, for the routers whose summaries we hold."""
        out = {}
        for rid, (body, _) in self._remote.items():
            name = body.get("name")
            if type(name) is str:
                out[name] = rid
        return out

    def known(self) -> list[str]:
        """Ids of the routers whose summaries we hold (not counting ourselves)."""
        return list(self._remote)

    def remote_clients(self) -> list[str]:
        """Client endpoints of the routers we hold summaries of (unspecified hosts left out:
        only the router's neighbours know what address reaches it)."""
        out = []
        for body, _ in self._remote.values():
            client = body.get("client")
            if type(client) is str:
                try:
                    host, _port = parse_endpoint(client)
                except ValueError:
                    continue
                if not is_unspecified(host):
                    out.append(client)
        return out

    def alternatives(self, limit: int) -> tuple[str, ...]:
        """Client endpoints of other routers, for clients to fail over to: our peers first,
        then the rest of the mesh; at most *limit*."""
        out: list[str] = []
        for link in self.mesh.links.values():
            if link.client_endpoint and link.client_endpoint not in out:
                out.append(link.client_endpoint)
        for endpoint in self.remote_clients():
            if endpoint not in out and endpoint != self.mesh.advertised:
                out.append(endpoint)
        return tuple(out[:limit])

    def summary(self) -> dict[str, Any]:
        """This router's own summary (what it floods as router-info)."""
        mesh = self.mesh
        facts = mesh.facts.summary()
        now = time.monotonic()
        peers = [
            {
                "id": link.remote_id,
                "name": link.remote.name if link.remote is not None else None,
                "address": link.address,
                "direction": "out" if link.outgoing else "in",
                "since": round(now - link.since, 3) if link.since is not None else 0.0,
                "events_in": link.events_in,
                "events_out": link.events_out,
            }
            for link in list(mesh.links.values())[:MAX_LISTED]
        ]
        poisoned = [
            {
                "address": e.address,
                "router_id": e.router_id,
                "failures": e.failures,
                "retry_in": round(max(0.0, e.next_attempt - now), 3),
            }
            for e in mesh.table
            if e.state is PeerState.POISONED
        ][:MAX_LISTED]
        counters = dict(mesh.counters.items())
        for k in ("events_in", "events_out", "duplicates"):
            counters.setdefault(k, 0)
        counters["dispatched"] = facts["dispatched"]
        counters["published"] = facts["published"]
        counters["client_duplicates"] = facts["client_duplicates"]
        return {
            "id": mesh.id,
            "name": mesh.facts.name,
            "peer": mesh.advertised,
            "client": mesh.advertised,
            "uptime": round(facts["uptime"], 3),
            "interval": mesh.interests.repeat_interval(),
            "clients": facts["clients"],
            # Listening off loopback without TLS: `aa mesh` says "open".
            "open": bool(facts.get("open", False)),
            # What it enforces: a hash of its permissions' rules, its CRL number (None: none).
            "permissions": facts.get("permissions"),
            "crl": facts.get("crl"),
            "peers": peers,
            "poisoned": poisoned,
            "counters": counters,
        }

    def info(self, now: float | None = None) -> dict[str, Any]:
        """The whole mesh as this router knows it (layout: `aa.mesh.protocol.meshinfo.MeshInfo`)."""
        now = time.monotonic() if now is None else now
        self.expire(now)
        own = self.summary()
        own["age"] = 0.0
        own["gone"] = False
        # Whether this router routes by interest now or floods while unsure: asked of the
        # answering router only (it is not part of the summary every router floods).
        routing = self.mesh.interests.info()
        own["routing"] = {
            k: routing[k] for k in ("routing", "settled", "complete", "awaited", "routers")
        }
        routers = [own]
        for body, at in self._remote.values():
            entry = dict(body)
            entry["age"] = round(now - at, 3)
            entry["gone"] = now - at > GONE_AFTER * summary_interval(body.get("interval"))
            routers.append(entry)
        return {
            "format": MESH_INFO_FORMAT,
            "router": own["id"],
            "at": datetime.now(UTC),
            "routers": routers,
        }
