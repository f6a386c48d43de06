"""How a router keeps its mesh cache and client caches (a small frozen object, validated on
construction; `RouterConfig.caches` holds one).

Defaults suit a router on a small machine; tests shorten `sweep_interval` instead of sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aa.mesh import UsageError

from .clientcaches import MAX_CLIENT_CACHES, MAX_EVENTS_PER_CACHE
from .meshcache import MESH_CACHE_MAX_BYTES, MESH_CACHE_MAX_EVENTS

__all__ = ["CacheConfig", "CACHE_SWEEP_INTERVAL", "CACHE_SYNC_INTERVAL"]

#: Seconds between two sweeps of the client caches (lapsed keep-alives, aged events). A cache
#: outlives its timeout by at most this; fetches filter by age themselves in between.
CACHE_SWEEP_INTERVAL: Final = 5.0
#: Seconds between two anti-entropy exchanges of the client caches with each peer router (also
#: run when a link comes up; `aa.router.caches.sync`): the longest a router that missed
#: floods stays behind once linked, for what link-up did not already repair.
CACHE_SYNC_INTERVAL: Final = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """Sizes of the mesh cache and the client caches (Å §4.5).

    >>> CacheConfig(mesh_cache_events=0).mesh_cache      # no mesh cache
    False
    """

    #: Events the mesh cache keeps (the newest); 0 turns the mesh cache off.
    mesh_cache_events: int = MESH_CACHE_MAX_EVENTS
    #: Estimated bytes of memory the mesh cache may hold; the oldest events go first.
    mesh_cache_bytes: int = MESH_CACHE_MAX_BYTES
    #: Client caches this router keeps (registrations flood, so this bounds every router).
    max_client_caches: int = MAX_CLIENT_CACHES
    #: Events one client cache keeps at most, whatever its count policy.
    max_events_per_cache: int = MAX_EVENTS_PER_CACHE
    #: Seconds between sweeps of lapsed client caches and aged events.
    sweep_interval: float = CACHE_SWEEP_INTERVAL
    #: Seconds between anti-entropy exchanges of the client caches with each peer (also run
    #: when a link comes up); 0 for only when links come up.
    sync_interval: float = CACHE_SYNC_INTERVAL

    def __post_init__(self) -> None:
        if type(self.mesh_cache_events) is not int or self.mesh_cache_events < 0:
            raise UsageError("CacheConfig.mesh_cache_events must be an int ≥ 0 (0: no mesh cache)")
        for name in ("mesh_cache_bytes", "max_client_caches", "max_events_per_cache"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise UsageError(f"CacheConfig.{name} must be a positive int, not {v!r}")
        if type(self.sweep_interval) not in (int, float) or not self.sweep_interval > 0:
            raise UsageError("CacheConfig.sweep_interval must be a positive number of seconds")
        if type(self.sync_interval) not in (int, float) or not self.sync_interval >= 0:
            raise UsageError("CacheConfig.sync_interval must be a number of seconds ≥ 0")

    @property
    def mesh_cache(self) -> bool:
        """Whether the router keeps a mesh cache."""
        return self.mesh_cache_events > 0
