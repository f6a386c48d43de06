"""aa.router.caches — the in-memory event caches (Å §4.5): the mesh cache and the client caches.

Owns: the mesh cache (`MeshCache`: the newest events this router dispatched, opt-out per
event, asked for explicitly, never written to disk) and the client caches (`ClientCaches`,
one router's copy, its shared logs in `grouplog`; `ClientCacheService`, kept in step across
the mesh by flooded control messages with keep-alives, and repaired by anti-entropy with each
peer, `CacheSync`; client requests in `requests`), with their settings (`CacheConfig`)
and the index of client cache patterns (`CacheIndex`).

Does not own: persistence (`aa.router.store`, whose `ExpiryPolicy` the caches share), the
flood itself (`aa.router.links`), or how dispatched events are collected for the mesh cache
once per batch (`aa.router.sinks`).
"""

from .clientcaches import MAX_CLIENT_CACHES, MAX_EVENTS_PER_CACHE, CacheInfo, ClientCaches, Fetched
from .config import CACHE_SWEEP_INTERVAL, CACHE_SYNC_INTERVAL, CacheConfig
from .index import CacheIndex, equality_of
from .meshcache import (
    MESH_CACHE_MAX_BYTES,
    MESH_CACHE_MAX_EVENTS,
    MeshCache,
    approx_size,
    encode_events,
)
from .requests import cache_key, owner_of
from .service import CACHE_TOPIC, ClientCacheService
from .sync import CACHE_SYNC_TOPIC, CacheSync

__all__ = [
    "CACHE_SWEEP_INTERVAL",
    "CACHE_SYNC_INTERVAL",
    "CACHE_SYNC_TOPIC",
    "CACHE_TOPIC",
    "CacheConfig",
    "CacheIndex",
    "CacheInfo",
    "CacheSync",
    "ClientCacheService",
    "ClientCaches",
    "Fetched",
    "MAX_CLIENT_CACHES",
    "MAX_EVENTS_PER_CACHE",
    "MESH_CACHE_MAX_BYTES",
    "MESH_CACHE_MAX_EVENTS",
    "MeshCache",
    "approx_size",
    "cache_key",
    "encode_events",
    "equality_of",
    "owner_of",
]
