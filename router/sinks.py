"""Where a dispatched event goes besides its subscribers: the store, the mesh cache, the
event log — as one sink on dispatch, given each batch of events in order, specialised on
which of them this router keeps.

It runs for every event a router dispatches — a local client's and a peer's alike, once per
router — so every router keeps its own copy of every persisted event (replication is the
flood itself):

- the store, when the event's meta asks for it: `StoreService.persist` only queues; the
  store's writer thread writes in batches, off the event loop;
- the mesh cache, unless the publisher opted out (``mesh_cache: False``);
- the event log (on whenever there is a data folder).

Mesh-cache and event-log events are collected and handed over once the batch being
dispatched is done (`flush`): one encoding call per batch instead of one per event, shared
by the two. Events relayed from a peer are not encoded at all: the cache (when it takes all
of a flood group's events) and the event log keep the group's bytes with this router's hop
(`aa.router.caches.meshcache`, `aa.router.eventlog`), which sets each event's ttl and path
when it is read or written. Client caches attach a sink of their own (`aa.router.caches`),
only while a cache exists.

Cost: the non-persisted path adds two meta look-ups per event; the mesh cache an encoding
per batch of the events this router stamped (none for the groups it relays); the event log
shares that encoding (its own process does the rest). The figures are in the manual
(Performance).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from aa.mesh import Event
from aa.mesh.protocol import FloodGroup

from .caches import MeshCache, encode_events
from .eventlog import EventLog
from .store import META_MESH_CACHE, META_PERSIST

log = logging.getLogger("aa.router")

__all__ = ["LocalSinks"]

#: A flood group's hop, ``(ttl, path)``, as the mesh cache and the event log take it.
_Hop = tuple[int, Sequence[str]]


class LocalSinks:
    """The store, mesh-cache and event-log sink of one router (see the module docstring)."""

    def __init__(
        self,
        *,
        persist: Callable[[Event], None] | None,
        mesh_cache: MeshCache | None,
        event_log: EventLog | None,
    ) -> None:
        self._persist = persist
        self.mesh_cache = mesh_cache
        self.event_log = event_log
        self._cache_pending: list[Event] = []  # for the mesh cache, at the end of the batch
        self._log_pending: list[Event] = []  # for the event log, at the end of the batch
        #: (start, end, group): `_cache_pending[start:end]` are the events of a flood group
        #: received, kept by the cache as the group's bytes rather than encoded again.
        self._received: list[tuple[int, int, FloodGroup]] = []
        #: The same for `_log_pending`: logged as the group's bytes.
        self._log_received: list[tuple[int, int, FloodGroup]] = []

    @classmethod
    async def open(
        cls,
        config: Any,
        router_id: str,
        *,
        persist: Callable[[Event], None] | None,
        mesh_cache: MeshCache | None,
    ) -> LocalSinks:
        """The sinks of a router with *config* (`RouterConfig`): the event log is started
        when it has a data folder and a log config. Raises what `EventLog.start` raises."""
        elog = None
        if config.event_log is not None and config.data_dir is not None:
            elog = EventLog(config.event_log, data_dir=config.data_dir, router_id=router_id)
            await elog.start()
        return cls(persist=persist, mesh_cache=mesh_cache, event_log=elog)

    async def aclose(self) -> None:
        """Hand over what was collected, then close the event log."""
        self.flush()
        elog, self.event_log = self.event_log, None
        if elog is not None:
            await elog.aclose()

    def sink(self) -> Callable[[Sequence[Event], FloodGroup | None], None] | None:
        """One function for the three, given the events of a batch in order, specialised on
        which of them exist (None: none)."""
        persist = self._persist
        log_on = self.event_log is not None
        cache_on = self.mesh_cache is not None
        if persist is None and not cache_on and not log_on:
            return None
        log_pending = self._log_pending
        pending = self._cache_pending
        received_at = self._received
        log_received_at = self._log_received
        call_soon = asyncio.get_running_loop().call_soon
        flush = self.flush

        def sink(events: Sequence[Event], received: FloodGroup | None = None) -> None:
            start = len(pending)
            log_start = len(log_pending)
            for event in events:
                meta = event.meta
                if persist is not None and META_PERSIST in meta:
                    try:
                        persist(event)
                    except Exception:  # the event's other sinks and the batch's rest go on
                        log.exception("the store's sink failed for event %s", event.id)
                cached = cache_on and meta.get(META_MESH_CACHE) is not False
                if not pending and not log_pending and (cached or log_on):
                    call_soon(flush)
                if cached:
                    pending.append(event)
                if log_on:
                    log_pending.append(event)
            # The group's bytes serve the cache when it takes every one of its events, and
            # the event log, which takes them all.
            if received is not None:
                if len(pending) - start == len(events):
                    received_at.append((start, len(pending), received))
                if log_on:
                    log_received_at.append((log_start, len(log_pending), received))

        return sink

    def flush(self) -> None:
        """Put the events collected for the mesh cache into it now, and hand the event log
        those collected for it. Both lists fill and empty together, the cache's holding the
        log's events but those opted out of it: when they are as long, they are the same
        events (the usual case), each part encoded once for both, or kept as the flood
        group's bytes it came in."""
        pending, log_pending = self._cache_pending, self._log_pending
        cache, elog = self.mesh_cache, self.event_log
        shared = elog is not None and cache is not None and len(log_pending) == len(pending)
        if pending and cache is not None:
            for events, blob, hop in _parts(pending, self._received):
                if blob is None:
                    blob = encode_events(events)
                    cache.add_many(events, encoded=blob)
                else:
                    cache.add_many(events, encoded=blob, hop=hop)
                if shared:
                    assert elog is not None
                    elog.extend(events, encoded=blob, hop=hop)
        if log_pending and elog is not None and not shared:
            for events, blob, hop in _parts(log_pending, self._log_received):
                elog.extend(events, encoded=blob, hop=hop)
        self._received.clear()
        self._log_received.clear()
        pending.clear()
        log_pending.clear()


def _parts(
    events: list[Event], received: list[tuple[int, int, FloodGroup]]
) -> list[tuple[list[Event], bytes | None, _Hop | None]]:
    """*events* in runs: each flood group received whole, with its bytes and hop, and the
    events between them, without."""
    if not received:
        return [(events, None, None)]
    out: list[tuple[list[Event], bytes | None, _Hop | None]] = []
    at = 0
    for start, end, group in received:
        if at < start:
            out.append((events[at:start], None, None))
        out.append((events[start:end], group.blob, (group.ttl, group.path)))
        at = end
    if at < len(events):
        out.append((events[at:], None, None))
    return out
