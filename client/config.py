"""ClientConfig: how a client finds routers, retries, and bounds what it holds while away."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from aa.mesh import DiscoveryConfig, UsageError, parse_endpoint

from .link import client_tls

__all__ = [
    "ClientConfig",
    "ENV_CERT",
    "ENV_KEY",
    "ENV_CA",
    "MAX_OUTBOX",
    "BATCH_EVENTS",
    "BATCH_BYTES",
    "MAX_INFLIGHT_FRAMES",
    "REPLAY_WINDOW_EVENTS",
    "REPLAY_WINDOW_SECONDS",
]

#: Events a client keeps while no router has acknowledged them. Past it `publish` waits and
#: `publish_nowait` raises `OutboxFull`: an hour offline at 25 events/s fits.
MAX_OUTBOX = 100_000
#: Events per `Publish` frame: large enough that framing costs vanish, small enough that a
#: frame stays far below the frame cap and an ack comes back quickly.
BATCH_EVENTS = 1000
#: Bytes of events per `Publish` frame (a single larger event goes alone): a router decodes
#: at most `aa.mesh.protocol.MAX_FRAME_VALUES` (128 Ki) values from a large frame and every
#: value is at least one byte, so a frame of this many bytes (and the frame's own few values)
#: is never refused for holding too many.
BATCH_BYTES = 127 * 1024
#: Publish frames sent and not yet acknowledged. Bounds what must be resent after a
#: failover and keeps the router's socket buffer (and so latency) small.
MAX_INFLIGHT_FRAMES = 16


#: Acknowledged events a client keeps, and for how long (seconds), to send again after a
#: fail-over. An ack means the router dispatched the event, not that its flood reached a
#: peer: a router killed in that instant (or whose socket is reset, which discards what the
#: kernel still had to send) takes the event with it. Resent to the next router under the
#: same ids, the ones the mesh already has are dropped as duplicates; ten seconds is far
#: longer than a flood takes to cross a link and far shorter than a router remembers ids.
REPLAY_WINDOW_EVENTS = 20_000
REPLAY_WINDOW_SECONDS = 10.0
#: Ids of delivered events a client remembers (count, seconds) to drop a second copy: after
#: a fail-over an event may reach the new router and this client again.
DELIVERED_IDS_MAX = 200_000
DELIVERED_IDS_MAX_AGE = 60.0


#: Environment variables every `aa` command (and any client built without these fields) takes
#: its TLS files from: the user's certificate and key, and the mesh CA.
ENV_CERT = "AA_CERT"
ENV_KEY = "AA_KEY"
ENV_CA = "AA_CA"


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value) if value else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """How a client finds and talks to routers."""

    #: Router endpoints ("host:port") to try, in order; alternatives the mesh tells about
    #: are added at run time.
    routers: tuple[str, ...] = ()
    #: This client's id, kept across reconnections (client caches are keyed by it). Random
    #: when None.
    client_id: str | None = None
    #: Name shown in `aa mesh` and the monitor.
    name: str | None = None
    #: Seconds to wait for one connection attempt (TCP and hello).
    connect_timeout: float = 5.0
    #: True: `connect()` keeps trying a router that refuses the connection (nothing listens
    #: there yet: it may be starting) until its timeout. False: it gives up at once when every
    #: router it may try refused the connection — what a one-shot command wants (the `aa`
    #: commands, as `redis-cli` or `mosquitto_pub` do). Once connected, either way, a lost
    #: router is retried.
    wait_for_routers: bool = True
    #: Seconds to wait for a router's answer to a request (subscribe, update).
    request_timeout: float = 10.0
    #: First retry interval after a router failed, seconds; doubles per failure.
    retry_base: float = 0.2
    #: Longest retry interval, seconds.
    retry_max: float = 30.0
    #: Longest retry interval in the first `retry_fast_period` seconds after the connection
    #: to a router was lost: a router restarting (an upgrade, a reboot) is back within
    #: seconds, and its subscribers should be too; only a long outage backs off further.
    retry_fast_max: float = 2.0
    retry_fast_period: float = 60.0
    #: Seconds between asking the router for alternative routers.
    alternatives_interval: float = 30.0
    #: Events kept unacknowledged before publishing waits.
    max_outbox: int = MAX_OUTBOX
    #: Listen for routers' beacons (and zeroconf, if `discovery` enables it) and connect to
    #: the routers heard (Å §4.1: clients find the mesh the way routers do). None means: only
    #: when no `routers` are given. A client only listens; it sends nothing.
    discover: bool | None = None
    #: Where and how to listen (port, interfaces; `AA_DISCOVERY_INTERFACES` as for routers).
    #: Its `peers` are tried as if given in `routers`.
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    #: The mesh CA (PEM). With it the client speaks TLS and talks only to routers whose
    #: certificate this CA signed. Default: `$AA_CA`.
    ca: Path | None = field(default_factory=lambda: _env_path(ENV_CA))
    #: This user's certificate and key (PEM, from `aa certs client`), presented to the
    #: router, which stamps the user's name on what the client publishes (`meta["user"]`).
    #: Without them the client is "anonymous". Default: `$AA_CERT`, `$AA_KEY`.
    cert: Path | None = field(default_factory=lambda: _env_path(ENV_CERT))
    key: Path | None = field(default_factory=lambda: _env_path(ENV_KEY))

    @property
    def tls(self) -> bool:
        """Whether connections use TLS (a CA is configured)."""
        return self.ca is not None

    @property
    def discovering(self) -> bool:
        """Whether the client looks for routers on the network."""
        if not self.discovery.enabled:
            return False
        return not self.routers if self.discover is None else self.discover

    def connect_wait(self, routers: int) -> float:
        """How long `connect()` waits by default with *routers* known: each one's connect
        timeout, a second more, and a beacon interval when discovering."""
        wait = self.connect_timeout * max(1, routers) + 1
        return wait + self.discovery.broadcast_interval if self.discovering else wait

    def __post_init__(self) -> None:
        if isinstance(self.routers, str):
            object.__setattr__(self, "routers", (self.routers,))
        object.__setattr__(self, "routers", tuple(self.routers))
        for r in self.routers:
            parse_endpoint(r)  # raises UsageError for a bad one
        for name in (
            "connect_timeout",
            "request_timeout",
            "retry_base",
            "retry_max",
            "retry_fast_max",
            "retry_fast_period",
            "alternatives_interval",
        ):
            if getattr(self, name) <= 0:
                raise UsageError(f"{name} must be positive")
        if self.max_outbox <= 0:
            raise UsageError("max_outbox must be positive")
        if self.retry_base > self.retry_max:
            raise UsageError("retry_base must not exceed retry_max")
        if self.discover is not None and type(self.discover) is not bool:
            raise UsageError("discover must be True, False or None")
        if type(self.discovery) is not DiscoveryConfig:
            raise UsageError("discovery must be a DiscoveryConfig")
        for name in ("ca", "cert", "key"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))
        if (self.cert is None) != (self.key is None):
            raise UsageError(
                "give a certificate and its key together (cert/key, or $AA_CERT/$AA_KEY)"
            )
        if self.cert is not None and self.ca is None:
            raise UsageError("a client certificate needs the mesh CA too (ca, or $AA_CA)")
        client_tls(self)  # UsageError now, for a missing, unreadable or expired file
