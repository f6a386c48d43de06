"""Which routers to dial, when, and what to remember of them: the peer table, the poison
list's back-off, and the topology file.

Routers found by discovery (beacons, zeroconf), configured (`RouterConfig.peers`), read from
the topology file, or told by other routers (hellos, `PeerRouters`) go into a `PeerTable`.
Every entry that is due is dialled, except told ones while discovery is off: a mesh wired by
hand keeps the shape it was given. A dial that fails, and a link that breaks, poison the
address: it is dialled again after exponentially growing intervals (`aa.mesh.PeerTable`).
What we tell other routers is never hearsay: the routers we are linked with, and those we
heard of first hand and have not failed — a dead address must not live on by being repeated.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from aa.mesh import (
    TOPOLOGY_FILE,
    DiscoveryConfig,
    KnownRouter,
    PeerEntry,
    PeerState,
    PeerTable,
    RouterInfo,
    Source,
    UsageError,
    format_endpoint,
    is_unspecified,
    load_topology,
    parse_endpoint,
    save_topology,
)
from aa.mesh.protocol import MAX_KNOWN_ROUTERS, PROTOCOL_VERSION

from .config import MeshConfig

__all__ = ["Dialer", "MAX_CONCURRENT_DIALS", "SAVE_DELAY", "fill_host"]

log = logging.getLogger("aa.router.links")

#: Dials in progress at once, in dials: bounds sockets and tasks when discovery reports many
#: routers together.
MAX_CONCURRENT_DIALS: Final = 16
#: Seconds a save of the topology file is put off after a change, to write once for a burst
#: of changes (a router joining a mesh of twenty brings twenty links up).
SAVE_DELAY: Final = 1.0


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def fill_host(endpoint: str, host: str | None) -> str:
    """*endpoint* with an unspecified host replaced by *host* (the address we see it at)."""
    h, port = parse_endpoint(endpoint)
    if is_unspecified(h) and host:
        return format_endpoint(host, port)
    return endpoint


class Dialer:
    """The peer table of one router and the dials it makes (see the module docstring).

    *connect(address)* opens a link and returns once its hello exchange is over; it raises
    for a refusal, a timeout or a bad hello (the address is then poisoned). *linked()* gives
    the links in use by peer router id; *poke()* wakes the mesh's housekeeping loop.
    """

    def __init__(
        self,
        own_id: str,
        config: MeshConfig,
        discovery: DiscoveryConfig,
        *,
        connect: Callable[[str], Awaitable[None]],
        linked: Callable[[], Mapping[str, Any]],
        poke: Callable[[], None],
    ) -> None:
        self.table = PeerTable(
            own_id=own_id,
            retry_base=config.retry_base,
            retry_max=config.retry_max,
            stable_after=config.stable_after,
            jitter=config.retry_jitter,
            forget_after=config.forget_after,
        )
        self.discovery = discovery
        self._connect = connect
        self._linked = linked
        self._poke = poke
        self._dialing: dict[str, asyncio.Task[None]] = {}
        self._topology_path: Path | None = None
        self._save_task: asyncio.Task[None] | None = None
        self._save_at: float | None = None

    # -- what we hear of --------------------------------------------------------------------

    def found(self, info: RouterInfo) -> None:
        """Discovery found a router (or reports a configured endpoint)."""
        if info.protocol is not None and info.protocol != PROTOCOL_VERSION:
            log.debug("ignoring router %s: protocol %s", info.router_id, info.protocol)
            return
        self.add(info.peer, info.source, time.monotonic(), info.router_id)

    def learn(
        self, routers: Iterable[KnownRouter], teller_id: str | None, teller_host: str | None
    ) -> None:
        """A peer told us routers it knows."""
        now = time.monotonic()
        for r in routers:
            # An unspecified host is filled with the teller's address only for the teller
            # itself: for anyone else it says nothing about where that router is.
            if r.router_id == teller_id:
                peer = fill_host(r.peer, teller_host)
            elif is_unspecified(parse_endpoint(r.peer)[0]):
                continue
            else:
                peer = r.peer
            self.add(peer, Source.TOLD, now, r.router_id)

    def add(self, address: str, source: Source, now: float, router_id: str | None) -> None:
        try:
            entry = self.table.add(address, source=source, now=now, router_id=router_id)
        except UsageError as exc:
            log.debug("ignoring router address %r: %s", address, exc)
            return
        if entry is not None and self.dialable(entry) and entry.next_attempt <= now:
            self._poke()

    def known_routers(self, links: Iterable[Any]) -> list[KnownRouter]:
        """What we tell peers: the routers we are linked with, and those we heard of first
        hand (configured, discovered) and have not failed."""
        out: list[KnownRouter] = []
        seen: set[str] = set()
        for link in links:
            if link.address and link.address not in seen:
                seen.add(link.address)
                out.append(
                    KnownRouter(
                        peer=link.address,
                        router_id=link.remote_id,
                        client=link.client_endpoint,
                        name=link.remote.name if link.remote else None,
                    )
                )
        for e in self.table:
            if len(out) >= MAX_KNOWN_ROUTERS:
                break
            if e.address in seen or e.state is PeerState.POISONED:
                continue
            if e.source is Source.CONFIGURED or e.source is Source.DISCOVERED:
                seen.add(e.address)
                out.append(KnownRouter(peer=e.address, router_id=e.router_id))
        return out[:MAX_KNOWN_ROUTERS]

    # -- dialling ---------------------------------------------------------------------------

    def dialable(self, entry: PeerEntry) -> bool:
        if entry.state is not PeerState.IDLE and entry.state is not PeerState.POISONED:
            return False
        if entry.source is Source.TOLD and not self.discovery.enabled:
            return False
        if entry.router_id is not None and entry.router_id in self._linked():
            return False
        return entry.address not in self._dialing

    def dial_due(self, now: float) -> None:
        """Start a dial to every entry that is due (at most `MAX_CONCURRENT_DIALS` at once)."""
        for address in self.table.due(now):
            if len(self._dialing) >= MAX_CONCURRENT_DIALS:
                return
            entry = self.table.get(address)
            if entry is None or not self.dialable(entry):
                continue
            task = asyncio.get_running_loop().create_task(
                self._dial(address), name=f"aa-dial-{address}"
            )
            self._dialing[address] = task
            task.add_done_callback(functools.partial(self._dial_done, address))

    def _dial_done(self, address: str, _task: asyncio.Task[None]) -> None:
        self._dialing.pop(address, None)
        self._poke()

    def next_dial(self, now: float) -> float | None:
        """When the next dial falls due (None: nothing to dial)."""
        soonest = None
        for e in self.table:
            if e.next_attempt > now and self.dialable(e):
                soonest = e.next_attempt if soonest is None else min(soonest, e.next_attempt)
        return soonest

    async def _dial(self, address: str) -> None:
        self.table.record_attempt(address, time.monotonic())
        try:
            await self._connect(address)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # refused, unreachable, timed out, a bad hello: all poison
            now = time.monotonic()
            retry = self.table.record_failure(address, now)
            wait = (
                f"; next attempt in {retry - now:.1f} s"
                if retry is not None
                else f"; forgotten (of no use for {_duration(self.table.forget_after)})"
            )
            log.info("peer %s unavailable: %s%s", address, exc or type(exc).__name__, wait)

    def forget(self, router: str) -> list[PeerEntry]:
        """Drop *router* (address or id) from the table, stop dialling it, and save the
        topology file soon; returns the entries dropped."""
        gone = self.table.forget(router)
        for e in gone:
            task = self._dialing.pop(e.address, None)
            if task is not None:
                task.cancel()
        if gone and self._topology_path is not None:
            self.spawn_save()  # now, so the file no longer names it
            self.save_soon()  # and again, in case a save with the old table was under way
        return gone

    async def cancel_dials(self) -> None:
        tasks = list(self._dialing.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the topology file ------------------------------------------------------------------

    async def load(self, data_dir: Any) -> None:
        """Read the topology file of *data_dir* (None: no file is kept)."""
        if data_dir is None:
            return
        self._topology_path = Path(data_dir) / TOPOLOGY_FILE
        await asyncio.to_thread(Path(data_dir).mkdir, parents=True, exist_ok=True)
        n = await asyncio.to_thread(
            load_topology,
            self._topology_path,
            self.table,
            now=time.monotonic(),
            wall_now=time.time(),
        )
        if n:
            log.info("read %d known routers from %s", n, self._topology_path)

    @property
    def keeps_topology(self) -> bool:
        return self._topology_path is not None

    @property
    def save_at(self) -> float | None:
        """When a save put off by `save_soon` is due."""
        return self._save_at

    def save_soon(self) -> None:
        if self._topology_path is not None:
            at = time.monotonic() + SAVE_DELAY
            if self._save_at is None or at < self._save_at:
                self._save_at = at
                self._poke()

    def spawn_save(self) -> None:
        self._save_at = None
        if self._save_task is None or self._save_task.done():
            self._save_task = asyncio.get_running_loop().create_task(self.save())

    async def close(self) -> None:
        """Finish a save under way, then save once more."""
        if self._save_task is not None:
            await asyncio.gather(self._save_task, return_exceptions=True)
        if self._topology_path is not None:
            await self.save()

    async def save(self) -> None:
        if self._topology_path is None:
            return
        # A copy taken in the loop: the file is written in a thread while links come and go.
        snapshot = copy.deepcopy(self.table)
        try:
            await asyncio.to_thread(
                save_topology,
                self._topology_path,
                snapshot,
                now=time.monotonic(),
                wall_now=time.time(),
            )
        except OSError as exc:
            log.warning("cannot save the topology to %s: %s", self._topology_path, exc)
