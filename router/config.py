"""Router configuration: small frozen objects, validated on construction.

Environment variables (`AA_…`) and command-line flags only fill these in (see `aa.tools`).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from aa.mesh import DiscoveryConfig, UsageError, check_endpoint

from .caches import CacheConfig
from .eventlog import EventLogConfig
from .links import MeshConfig
from .patterns import WorkerConfig
from .quench import QuenchConfig
from .security import SecurityConfig
from .store import StoreConfig

__all__ = ["RouterConfig", "DEFAULT_PORT", "MAX_SUBSCRIPTIONS_PER_CLIENT", "MAX_SESSION_BACKLOG"]

#: The TCP port `aa router` listens on unless told otherwise (clients and peer routers share
#: it: the first frame says which one is calling). Tests use port 0.
DEFAULT_PORT = 7447

#: Subscriptions one client may hold at once. Each costs a slot in the pattern engine that
#: every event is checked against, so one client must not be able to fill the engine.
MAX_SUBSCRIPTIONS_PER_CLIENT = 100

#: Bytes waiting to be written to one client before the router drops that client's
#: deliveries (and counts them, and tells it `Missed` once it drains) rather than buffer
#: more: a stalled subscriber must not grow the router's memory without bound, nor slow
#: anyone else down. A second of a busy subscription (4,000 events of 1 KB), on top of what
#: the kernel's socket buffers already hold for it (megabytes); twenty clients that stop
#: reading then cost the router some 80 MiB, not a gigabyte.
MAX_SESSION_BACKLOG = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterConfig:
    """How a router runs.

    >>> RouterConfig(port=0).host
    '127.0.0.1'
    """

    #: Address to listen on for clients and peer routers. Loopback by default: listening on a
    #: real interface is a decision the operator makes (`aa router --host 0.0.0.0`).
    host: str = "127.0.0.1"
    #: TCP port; 0 picks a free one (the real one is `Router.address` after start).
    port: int = DEFAULT_PORT
    #: Name shown to people (mesh picture, `aa mesh`); defaults to the host name and port.
    name: str | None = None
    #: Folder for the store, the event log and the persisted topology. None keeps nothing on
    #: disk (an embedded router for tests or a short-lived program).
    data_dir: Path | None = None
    #: Subscriptions one client may hold at once.
    max_subscriptions_per_client: int = MAX_SUBSCRIPTIONS_PER_CLIENT
    #: Bytes queued for one client that does not read before its deliveries are dropped
    #: (`MAX_SESSION_BACKLOG`; the ``max-backlog`` key and ``--max-backlog``).
    max_session_backlog: int = MAX_SESSION_BACKLOG
    #: Seconds a clean shutdown waits for clients to take what is in flight.
    shutdown_grace: float = 5.0
    #: CPU seconds one pattern evaluation may take before the sandbox stops the pattern.
    pattern_time_budget: float = 0.02
    #: Extra router-id prefix for event ids; random when None (tests may fix it).
    id_prefix: str | None = field(default=None, repr=False)
    #: How to find other routers. Off for an embedded router (a library puts nothing on the
    #: network unless the program asks); `aa router` turns it on unless --no-discovery. The
    #: routers other routers tell about are dialled only when discovery is on, so a mesh
    #: wired by hand (`peers`) keeps the shape it was given.
    discovery: DiscoveryConfig = field(default_factory=lambda: DiscoveryConfig(enabled=False))
    #: Well-known peer routers ("host:port") to dial whatever discovery finds (added to
    #: `discovery.peers`).
    peers: tuple[str, ...] = ()
    #: Timings and caps of the peer links.
    mesh: MeshConfig = field(default_factory=MeshConfig)
    #: The persistent store (Å §4.5): events their publishers asked to keep, replayed to new
    #: subscribers that ask for history. `StoreConfig.url` None means the SQLite file
    #: `events.db` in `data_dir` (no store when there is no data folder either); any
    #: SQLAlchemy URL otherwise (`aa router --store-url`). None: no store at all.
    store: StoreConfig | None = field(default_factory=StoreConfig)
    #: The event log for mining: every dispatched event, in Parquet files under
    #: `data_dir`/eventlog. On by default whenever there is a data folder (no data folder,
    #: no log); None: off (`aa router --no-event-log`). Its writer is a process of its own:
    #: the router only encodes the rows (see `aa.router.eventlog`).
    event_log: EventLogConfig | None = field(default_factory=EventLogConfig)
    #: The mesh cache and the client caches: sizes, and how often lapsed caches are swept.
    caches: CacheConfig = field(default_factory=CacheConfig)
    #: Quenching: how often registrations are re-flooded as keep-alives, and limits.
    quench: QuenchConfig = field(default_factory=QuenchConfig)
    #: TLS, users, permissions, address ranges (`aa.router.security`); all off by default.
    security: SecurityConfig = field(default_factory=SecurityConfig)
    #: The worker processes that run pattern code, and their limits and probation
    #: (`aa.router.patterns.workers`).
    workers: WorkerConfig = field(default_factory=WorkerConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise UsageError("host must be a non-empty address")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise UsageError(f"port must be 0..65535, not {self.port!r}")
        if self.data_dir is not None:
            object.__setattr__(self, "data_dir", Path(self.data_dir))
        for name in ("max_subscriptions_per_client", "max_session_backlog"):
            if getattr(self, name) <= 0:
                raise UsageError(f"{name} must be positive")
        if self.shutdown_grace < 0:
            raise UsageError("shutdown_grace must not be negative")
        if not 0 < self.pattern_time_budget <= 10:
            raise UsageError("pattern_time_budget must be in (0, 10] seconds")
        if type(self.discovery) is not DiscoveryConfig:
            raise UsageError("discovery must be a DiscoveryConfig")
        if type(self.mesh) is not MeshConfig:
            raise UsageError("mesh must be a MeshConfig")
        if self.store is not None and type(self.store) is not StoreConfig:
            raise UsageError("store must be a StoreConfig or None")
        if self.event_log is not None and type(self.event_log) is not EventLogConfig:
            raise UsageError("event_log must be an EventLogConfig or None")
        if type(self.security) is not SecurityConfig:
            raise UsageError("security must be a SecurityConfig")
        if type(self.caches) is not CacheConfig:
            raise UsageError("caches must be a CacheConfig")
        peers = (self.peers,) if isinstance(self.peers, str) else tuple(self.peers)
        for p in peers:
            check_endpoint(p, "peers")
        object.__setattr__(self, "peers", peers)

    def display_name(self, port: int) -> str:
        return self.name or f"{socket.gethostname()}:{port}"

    def discovery_with_peers(self) -> DiscoveryConfig:
        """The discovery settings with `peers` added to its well-known endpoints."""
        return dataclasses.replace(self.discovery, peers=self.discovery.peers + self.peers)


def env_default(name: str, default: str | None = None) -> str | None:
    """An `AA_…` environment variable, or *default*."""
    return os.environ.get(name, default)
