"""Runs an adapter on a connected client: subscribes to the events it takes, publishes
what it makes (marked with `adapted_meta`), and reloads its artefact when it changes.

Reloading is a check of the task folder's ``current`` pointer every `reload_interval`
seconds (a stat and a small read; no inotify, so it works on any file system, network
shares included). When a new artefact changes the event types the adapter takes (a new
type mapping), the subscription is replaced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aa.mesh import Event

from .base import Adapter, adapted_meta

__all__ = ["AdapterRunner"]

log = logging.getLogger("aa.addins.adapters")


class AdapterRunner:
    """Feeds *adapter* from *client* (an `aa.client.AsyncClient`) and publishes its output.

    >>> async with AsyncClient(router) as client:
    ...     async with AdapterRunner(SchemaAdapter("adapters"), client):
    ...         ...   # quotes are republished as tickers and back, until the block ends
    """

    def __init__(
        self,
        adapter: Adapter,
        client: Any,
        *,
        reload_interval: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.adapter = adapter
        self.client = client
        self.reload_interval = reload_interval
        self.clock = clock
        #: Events handled and published so far.
        self.handled = 0
        self.published = 0
        self._sub: Any = None
        self._pattern: str | None = None
        self._timer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load the artefact (if there is one yet), subscribe, start watching for changes."""
        await self.check()
        self._timer = asyncio.get_running_loop().create_task(self.watch())

    async def check(self) -> bool:
        """Reload the artefact now if it changed (and re-subscribe if the input changed)."""
        changed = self.adapter.reload()
        if changed or self._sub is None:
            pattern = self.adapter.pattern()
            if pattern != self._pattern:
                if self._sub is not None:
                    await self._sub.aclose()
                    self._sub = None
                if self.adapter.ready:
                    self._sub = await self.client.subscribe(pattern, self._on_event)
                    self._pattern = pattern
        return changed

    async def watch(self) -> None:
        """Check for a new artefact every `reload_interval` seconds, until cancelled (`start`
        runs this as a task; an add-in hands it to its container instead)."""
        while True:
            await asyncio.sleep(self.reload_interval)
            try:
                await self.check()
            except Exception:  # a bad artefact or a lost router must not stop the adapter
                log.warning("%s adapter: reload failed", self.adapter.name, exc_info=True)

    def _on_event(self, event: Event) -> None:
        self.handled += 1
        for kind, values in self.adapter.handle(event, now=self.clock()):
            self.client.publish_nowait(
                values, type=kind, meta=adapted_meta(self.adapter.name, event)
            )
            self.published += 1

    async def aclose(self) -> None:
        """Stop watching and unsubscribe."""
        if self._timer is not None:
            self._timer.cancel()
            try:
                await self._timer
            except asyncio.CancelledError:
                pass
            self._timer = None
        if self._sub is not None:
            await self._sub.aclose()
            self._sub = None

    async def __aenter__(self) -> AdapterRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
