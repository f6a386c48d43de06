"""How a router keeps its place in the mesh: timings and caps of peer links (a small frozen
object, validated on construction; `RouterConfig.mesh` holds one).

Defaults suit a LAN of tens of routers. Tests shorten the intervals instead of sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aa.mesh import (
    DEFAULT_TTL,
    FORGET_AFTER,
    MAX_ROUTERS,
    MAX_TTL,
    RETRY_BASE,
    RETRY_JITTER,
    RETRY_MAX,
    STABLE_AFTER,
    UsageError,
)

__all__ = [
    "MeshConfig",
    "MAX_PEER_BACKLOG",
    "PEER_KEEPALIVE",
    "ROUTER_INFO_INTERVAL",
    "ROUTINGS",
    "summary_interval",
]

#: Bytes queued for one peer router before events for it are dropped (and counted) rather
#: than buffered: a stalled peer must not grow our memory without bound. Some 100,000
#: typical events, seconds of full-speed traffic: a peer that is only slower catches up.
MAX_PEER_BACKLOG: Final = 32 * 1024 * 1024
#: Bytes in a link's send buffer above which it is congested: a few frames of a busy link
#: (a flood frame is up to a batch of events), far below `MAX_PEER_BACKLOG`, so a router goes
#: round a slow peer long before it would drop events for it.
CONGESTED_ABOVE: Final = 256 * 1024
#: Bytes below which a congested link is free again: a quarter of `CONGESTED_ABOVE` (the
#: proportions of asyncio's own write-buffer marks).
CONGESTED_BELOW: Final = 64 * 1024
#: Seconds between pings on an idle peer link. A link that has carried nothing for three of
#: these is taken as broken (a cable pulled does not close a TCP connection by itself).
PEER_KEEPALIVE: Final = 5.0
#: Seconds between two router-info summaries a router floods (what `aa mesh` shows of the
#: routers it is not connected to). Tens of bytes per router per interval.
ROUTER_INFO_INTERVAL: Final = 10.0
#: Routers in a mesh up to which each repeats its unchanged summaries every `info_interval`;
#: in a bigger mesh each stretches its repeats in proportion, so that a router receives
#: about as many repeats a second in a mesh of any size (each summary crosses every link).
REPEAT_ROUTERS: Final = 256
#: Longest repeat interval a summary may state, in seconds: a receiver reads a longer one as
#: this (`summary_interval`), so a router never stretches its repeats past it.
MAX_REPEAT_INTERVAL: Final = 3600.0
#: Shortest one, in seconds (a shorter stated interval would make receivers forget at once).
_MIN_REPEAT_INTERVAL: Final = 0.01
#: How events cross the mesh: "flood" (every router gets every event) or "interest" (only
#: routers that may want an event get it: `aa.mesh.interest`).
ROUTINGS: Final = ("flood", "interest")
#: Most routers `MeshConfig.max_routers` may name: a million summaries of a hundred bytes are
#: a tenth of a GB, far past any site; a larger figure is more likely a typo.
MAX_VIEW_ROUTERS: Final = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshConfig:
    """Timings and caps of the router's peer links.

    >>> MeshConfig(keepalive=0.5).link_timeout
    1.5
    """

    #: Hops an event may make from the router a client published it on (`aa.mesh.flood`).
    ttl: int = DEFAULT_TTL
    #: First retry interval after a peer failed, seconds; doubles with each failure in a row.
    retry_base: float = RETRY_BASE
    #: Longest retry interval, seconds.
    retry_max: float = RETRY_MAX
    #: Largest fraction by which a retry interval is shortened at random (0: exact).
    retry_jitter: float = RETRY_JITTER
    #: Seconds a link must stay up before its peer's failures are forgiven.
    stable_after: float = STABLE_AFTER
    #: Seconds a router may be of no use (no link, not heard of first hand) before it is
    #: forgotten: dropped from the peer table and the topology file at its next failed dial,
    #: and not read back from the file at start. Configured peers are never forgotten so.
    forget_after: float = FORGET_AFTER
    #: Seconds to wait for a peer to connect and answer our hello.
    connect_timeout: float = 5.0
    #: Seconds between pings on an idle link; three without a frame break the link.
    keepalive: float = PEER_KEEPALIVE
    #: Seconds between the router-info summaries this router floods.
    info_interval: float = ROUTER_INFO_INTERVAL
    #: Seconds between two saves of the topology file (data folder only). It is also saved
    #: soon after a link comes up, and on close.
    save_interval: float = 30.0
    #: Bytes queued for one peer before its events are dropped.
    max_backlog: int = MAX_PEER_BACKLOG
    #: "flood" or "interest" (`ROUTINGS`). Routers of both kinds mix in one mesh: a flooding
    #: router's copies arrive off the trees, and interest routers flood them on.
    routing: str = "interest"
    #: Under interest routing, whether this router's mesh cache is an interest: True, it
    #: asks for every event not opted out of the mesh cache (so the mesh floods them while
    #: any router keeps a mesh cache); False, its mesh cache holds the events that reach it
    #: anyway (its subscribers', its store's, the ones it relays).
    cache_interest: bool = False
    #: Under interest routing, bytes waiting in a link's send buffer (the transport's, past
    #: what the kernel took) above which the link counts as congested: new events for the
    #: routers behind it go round it when another path reaches them (`aa.mesh.detour`).
    #: 0: never go round.
    congested_above: int = CONGESTED_ABOVE
    #: Bytes below which a congested link counts as free again (the normal path is used
    #: again). Below `congested_above`, so that a link near the bound does not flap.
    congested_below: int = CONGESTED_BELOW
    #: Routers this router's interest view holds at most (their summaries and links); past
    #: it the router floods, as when unsure. Memory grows with it: a typical summary is about
    #: a hundred bytes (a few KB at its caps), and the trees kept are bounded apart from it
    #: (`aa.mesh.interest`). Raise it for a mesh of more routers, lower it on a small device.
    max_routers: int = MAX_ROUTERS

    def repeat_interval(self, routers: int) -> float:
        """Seconds between the repeats of an unchanged summary in a mesh of *routers*:
        `info_interval`, stretched past `REPEAT_ROUTERS`. Summaries carry it, and a
        receiver forgets one after a few of its sender's intervals, so it stretches alike.

        >>> MeshConfig().repeat_interval(10), MeshConfig().repeat_interval(2560)
        (10.0, 100.0)
        """
        return min(MAX_REPEAT_INTERVAL, self.info_interval * max(1.0, routers / REPEAT_ROUTERS))

    def __post_init__(self) -> None:
        if type(self.ttl) is not int or not 1 <= self.ttl <= MAX_TTL:
            raise UsageError(f"ttl must be an int from 1 to {MAX_TTL}")
        for name in (
            "retry_base",
            "retry_max",
            "forget_after",
            "connect_timeout",
            "keepalive",
            "info_interval",
            "save_interval",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise UsageError(f"{name} must be a positive number of seconds")
        if self.retry_base > self.retry_max:
            raise UsageError("retry_base must not exceed retry_max")
        if not 0 <= self.retry_jitter < 1:
            raise UsageError("retry_jitter must be a fraction in [0, 1)")
        if self.stable_after < 0:
            raise UsageError("stable_after must not be negative")
        if type(self.max_backlog) is not int or self.max_backlog <= 0:
            raise UsageError("max_backlog must be a positive number of bytes")
        if self.routing not in ROUTINGS:
            raise UsageError(f"routing must be one of {', '.join(ROUTINGS)}")
        for name in ("congested_above", "congested_below"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise UsageError(f"{name} must be a number of bytes, 0 or more")
        if self.congested_above and not self.congested_below < self.congested_above:
            raise UsageError("congested_below must be less than congested_above")
        if type(self.max_routers) is not int or not 2 <= self.max_routers <= MAX_VIEW_ROUTERS:
            raise UsageError(f"max_routers must be an int from 2 to {MAX_VIEW_ROUTERS:,}")
        if type(self.cache_interest) is not bool:
            raise UsageError("cache_interest must be True or False")

    @property
    def link_timeout(self) -> float:
        """Seconds without a frame after which a link is taken as broken."""
        return 3 * self.keepalive


def summary_interval(value: object) -> float:
    """The repeat interval a peer's summary states (its ``interval``), as receivers read it:
    a number of seconds within [0.01, `MAX_REPEAT_INTERVAL`]; `ROUTER_INFO_INTERVAL` when it
    states none (or no number). A summary is forgotten a few of these after it was heard.

    >>> summary_interval(30), summary_interval(1e9), summary_interval(True)
    (30.0, 3600.0, 10.0)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ROUTER_INFO_INTERVAL
    return min(max(float(value), _MIN_REPEAT_INTERVAL), MAX_REPEAT_INTERVAL)
