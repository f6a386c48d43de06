"""aa.router — the broker, embeddable in any asyncio program, in rooms.

At the top: the `Router` and its life cycle (`router`), its configuration (`config`),
dispatch of one event (`dispatch`), the client session (`session`), when a publish is
acknowledged (`acks`), in-process subscriptions (`local`), the store/mesh-cache/event-log
sink (`sinks`) and the small interfaces the rooms are given (`seams`).

The rooms, one concept each: `links` (peer links and the flood), `patterns` (the pattern
engine), `quench` (quenching), `store` (the persistent store and history), `caches` (the
mesh cache and client caches), `eventlog` (the event log for mining), `security` (TLS,
users, permissions, address ranges). The manual's
Architecture page (docs/architecture.md) draws an event's way through them.
"""

from .acks import Acknowledgements
from .caches import CacheConfig, CacheInfo, ClientCacheService, Fetched, MeshCache
from .config import DEFAULT_PORT, RouterConfig
from .dispatch import Dispatcher, scoped_id
from .eventlog import EventLog, EventLogConfig
from .links import MeshConfig, MeshService
from .local import LocalSubscription
from .patterns import WorkerConfig
from .quench import QuenchConfig, QuenchService
from .router import Endpoint, Router
from .store import ExpiryPolicy, StoreConfig, StoreService, parse_duration

__all__ = [
    "Acknowledgements",
    "CacheConfig",
    "CacheInfo",
    "ClientCacheService",
    "DEFAULT_PORT",
    "Dispatcher",
    "Endpoint",
    "EventLog",
    "EventLogConfig",
    "ExpiryPolicy",
    "Fetched",
    "LocalSubscription",
    "MeshCache",
    "MeshConfig",
    "MeshService",
    "QuenchConfig",
    "QuenchService",
    "Router",
    "RouterConfig",
    "StoreConfig",
    "WorkerConfig",
    "StoreService",
    "parse_duration",
    "scoped_id",
]
