"""aa.mesh — the foundation: events, the wire protocol, flooding, peers, discovery.

Imports nothing else of Aa. Routers and clients both use it (Å §4.1: clients discover the
mesh the way routers do).
"""

from . import peering as _peering  # noqa: F401  (registers the router-to-router kinds)
from . import meshinfo as _meshinfo  # noqa: F401  (registers get-mesh / mesh-info)
from . import storage_messages as _storage_messages  # noqa: F401  (registers the store/cache kinds)
from . import quench_messages as _quench_messages  # noqa: F401  (registers the quench kinds)
from .beacon import Beacon, RouterInfo
from .codec import MAX_FRAME_BYTES, NEED_DATA, Connection
from .datagram import DatagramNetwork, UdpNetwork
from .discovery import DISCOVERY_PORT, BroadcastDiscovery, Discovery, DiscoveryConfig
from .endpoints import DEFAULT_ROUTER_PORT, check_endpoint, format_endpoint, parse_endpoint
from .errors import (
    AaError,
    AaTimeout,
    ConnectionClosed,
    ConnectionLost,
    FrameTooLarge,
    InvalidPattern,
    InvalidPolicy,
    InvalidValue,
    MalformedFrame,
    OutboxFull,
    PatternError,
    ProtocolError,
    RemoteError,
    StoreError,
    StoreFull,
    StoreUnavailable,
    UnknownCache,
    UnknownMessage,
    UsageError,
)
from .event import Event, IdGenerator
from .flood import DEFAULT_TTL, FloodRules, Hop, SeenIds
from .mdns import ZeroconfDiscovery
from .meshinfo import GetMesh, MeshInfo
from .messages import PatternSpec
from .peering import Control, Flood, KnownRouter, PeerHello, PeerRouters
from .peers import PeerEntry, PeerState, PeerTable, Source
from .topology import load_topology, save_topology
from .values import Value, Values, check_value, check_values

__all__ = [
    "AaError",
    "AaTimeout",
    "Beacon",
    "BroadcastDiscovery",
    "Connection",
    "ConnectionClosed",
    "ConnectionLost",
    "Control",
    "DEFAULT_ROUTER_PORT",
    "DEFAULT_TTL",
    "DISCOVERY_PORT",
    "DatagramNetwork",
    "Discovery",
    "DiscoveryConfig",
    "Event",
    "Flood",
    "FloodRules",
    "FrameTooLarge",
    "GetMesh",
    "Hop",
    "IdGenerator",
    "InvalidPattern",
    "InvalidPolicy",
    "InvalidValue",
    "KnownRouter",
    "MAX_FRAME_BYTES",
    "MalformedFrame",
    "MeshInfo",
    "NEED_DATA",
    "OutboxFull",
    "PatternError",
    "PatternSpec",
    "PeerEntry",
    "PeerHello",
    "PeerRouters",
    "PeerState",
    "PeerTable",
    "ProtocolError",
    "RemoteError",
    "RouterInfo",
    "SeenIds",
    "Source",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "UdpNetwork",
    "UnknownCache",
    "UnknownMessage",
    "UsageError",
    "Value",
    "Values",
    "ZeroconfDiscovery",
    "check_endpoint",
    "check_value",
    "check_values",
    "format_endpoint",
    "load_topology",
    "parse_endpoint",
    "save_topology",
]
