"""aa.router — the broker, embeddable in any asyncio program."""

from .cacheconfig import CacheConfig
from .caching import ClientCacheService
from .clientcache import CacheInfo, Fetched
from .config import DEFAULT_PORT, RouterConfig
from .eventlog import EventLogConfig
from .local import LocalSubscription
from .mesh import MeshService
from .meshconfig import MeshConfig
from .policy import ExpiryPolicy, parse_duration
from .quench import QuenchService
from .quenchconfig import QuenchConfig
from .router import Endpoint, Router
from .storage import StorageService
from .store import StoreConfig

__all__ = [
    "CacheConfig",
    "CacheInfo",
    "ClientCacheService",
    "DEFAULT_PORT",
    "Endpoint",
    "EventLogConfig",
    "ExpiryPolicy",
    "Fetched",
    "LocalSubscription",
    "MeshConfig",
    "MeshService",
    "QuenchConfig",
    "QuenchService",
    "Router",
    "RouterConfig",
    "StorageService",
    "StoreConfig",
    "parse_duration",
]
