"""The library's defaults that `aa router --help` and `aa container --help` show, as plain
numbers: importing the router, the HTTP API and the add-in container only to print help
takes over a second. tests/test_cli_errors.py checks that each equals the library's own."""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_HTTP_PORT",
    "DISCOVERY_PORT",
    "BROADCAST_INTERVAL",
    "ENV_INTERFACES",
    "RETRY_BASE",
    "RETRY_MAX",
    "FORGET_AFTER",
    "PEER_KEEPALIVE",
    "ROUTER_INFO_INTERVAL",
    "MESH_CACHE_MAX_EVENTS",
    "CACHE_SWEEP_INTERVAL",
    "STORE_SYNC_INTERVAL",
    "DEFAULT_POLL_INTERVAL",
    "MAX_SUBSCRIPTIONS_PER_CLIENT",
    "MAX_SESSION_BACKLOG",
    "MAX_ROUTERS",
]

DEFAULT_PORT: Final = 7447  # aa.router.DEFAULT_PORT
DEFAULT_HTTP_PORT: Final = 7448  # aa.http_api.DEFAULT_HTTP_PORT (the port after DEFAULT_PORT)
DISCOVERY_PORT: Final = 47474  # aa.mesh.DISCOVERY_PORT
BROADCAST_INTERVAL: Final = 10.0  # aa.mesh.discovery.BROADCAST_INTERVAL
ENV_INTERFACES: Final = "AA_DISCOVERY_INTERFACES"  # aa.mesh.interfaces.ENV_INTERFACES
RETRY_BASE: Final = 1.0  # aa.mesh.peers.RETRY_BASE
RETRY_MAX: Final = 300.0  # aa.mesh.peers.RETRY_MAX
FORGET_AFTER: Final = 7 * 24 * 3600.0  # aa.mesh.peers.FORGET_AFTER
PEER_KEEPALIVE: Final = 5.0  # aa.router's MeshConfig.keepalive default
ROUTER_INFO_INTERVAL: Final = 10.0  # aa.router's MeshConfig.info_interval default
MESH_CACHE_MAX_EVENTS: Final = 20_000  # aa.router's CacheConfig.mesh_cache_events default
CACHE_SWEEP_INTERVAL: Final = 5.0  # aa.router's CacheConfig.sweep_interval default
STORE_SYNC_INTERVAL: Final = 30.0  # aa.router's StoreConfig.sync_interval default
DEFAULT_POLL_INTERVAL: Final = 2.0  # aa.addins.ContainerConfig.poll_interval default
MAX_SUBSCRIPTIONS_PER_CLIENT: Final = 100  # aa.router.MAX_SUBSCRIPTIONS_PER_CLIENT
MAX_SESSION_BACKLOG: Final = 4 * 1024 * 1024  # aa.router.MAX_SESSION_BACKLOG
MAX_ROUTERS: Final = 10_000  # aa.mesh.MAX_ROUTERS, MeshConfig.max_routers default
