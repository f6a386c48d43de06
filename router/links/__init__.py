"""aa.router.links — the router's peer links and the flood over them (Å §4.1).

Owns: the links with peer routers (`PeerLink`, one TCP connection each, and `MeshService`,
their set and life cycle), the flood of events and control messages with its rules applied
through `aa.mesh.FloodRules` (`Relay`), interest routing over it (`InterestService`, this
router's wants in `Wants`), which routers to dial and the poison list's
back-off and the topology file (`Dialer`), and what the router knows of the whole mesh
(`MeshView`, for `aa mesh` and `GET /mesh`), with their timings (`MeshConfig`).

Does not own: discovery's sockets and the peer table's rules (`aa.mesh`), dispatch of the
events a flood brings (`aa.router.dispatch`), when a publish is acknowledged
(`aa.router.acks`).
"""

from .config import (
    MAX_PEER_BACKLOG,
    PEER_KEEPALIVE,
    ROUTER_INFO_INTERVAL,
    ROUTINGS,
    MeshConfig,
    summary_interval,
)
from .dialer import MAX_CONCURRENT_DIALS, Dialer
from .interests import INTEREST_TOPIC, InterestService
from .meshservice import MAX_ALTERNATIVES, MAX_PEER_LINKS, MeshService
from .meshview import ROUTER_INFO_TOPIC, MeshView
from .peerlink import LinkOwner, PeerLink
from .relay import ControlCallback, Relay
from .wants import Wants

__all__ = [
    "ControlCallback",
    "Dialer",
    "INTEREST_TOPIC",
    "InterestService",
    "LinkOwner",
    "MAX_ALTERNATIVES",
    "MAX_CONCURRENT_DIALS",
    "MAX_PEER_BACKLOG",
    "MAX_PEER_LINKS",
    "MeshConfig",
    "MeshService",
    "MeshView",
    "PEER_KEEPALIVE",
    "PeerLink",
    "ROUTER_INFO_INTERVAL",
    "ROUTER_INFO_TOPIC",
    "ROUTINGS",
    "Relay",
    "Wants",
    "summary_interval",
]
