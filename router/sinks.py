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
by the two. Events relayed from a peer, when the cache takes all of a flood group's events
and no event log shares the encoding, are not encoded at all: the cache keeps the group's
bytes with this router's hop (`aa.router.caches.meshcache`). Client caches attach a sink
of their own (`aa.router.caches`), only while a cache exists.

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
        call_soon = asyncio.get_running_loop().call_soon
        flush = self.flush

        def sink(events: Sequence[Event], received: FloodGroup | None = None) -> None:
            start = len(pending)
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
            # The group's bytes serve the cache when it takes every one of its events and
            # the event log (which needs them encoded as dispatched) does not share them.
            if received is not None and not log_on and len(pending) - start == len(events):
                received_at.append((start, len(pending), received))

        return sink

    def flush(self) -> None:
        """Put the events collected for the mesh cache into it now, and hand the event log
        those collected for it. Both lists fill and empty together, the cache's holding the
        log's events but those opted out of it: when they are as long, they are the same
        events (the usual case), encoded once for both."""
        pending, log_pending = self._cache_pending, self._log_pending
        encoded = None
        cache = self.mesh_cache
        if pending and cache is not None:
            if self._received:
                at = 0
                for start, end, group in self._received:
                    if at < start:
                        cache.add_many(pending[at:start])
                    cache.add_many(
                        pending[start:end], encoded=group.blob, hop=(group.ttl, group.path)
                    )
                    at = end
                if at < len(pending):
                    cache.add_many(pending[at:])
            else:
                encoded = encode_events(pending)
                cache.add_many(pending, encoded=encoded)
        self._received.clear()
        if log_pending and self.event_log is not None:
            same = len(log_pending) == len(pending)
            self.event_log.extend(log_pending, encoded=encoded if same else None)
        pending.clear()
        log_pending.clear()
