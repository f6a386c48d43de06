"""The adapters as add-ins of the container (`aa.addins.AddIn`).

To host one, drop a module into the container's folder that names it, e.g.
``schema_adapter.py``::

    from aa.addins.adapters.addin import SchemaAdapterAddIn as ADDIN

with settings beside it (``schema_adapter.toml``)::

    adapters = "/srv/aa/adapters"     # where 'aa mine --adapters' writes
    reload_interval = 30.0            # seconds between checks for a new artefact

The adapter loads its artefact, subscribes to the event types it takes, publishes what it
makes, and checks for a new artefact every ``reload_interval`` seconds in a task the
container supervises (a failure restarts the add-in). Until `aa mine` has written an
artefact the adapter subscribes to nothing and just keeps checking.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from aa.addins import AddIn, Context

from .base import Adapter
from .location import LocationAdapter
from .presence import PresenceAdapter
from .runner import AdapterRunner
from .schema import SchemaAdapter

__all__ = [
    "AdapterAddIn",
    "SchemaAdapterAddIn",
    "LocationAdapterAddIn",
    "PresenceAdapterAddIn",
    "SETTINGS",
]

#: Default settings (a settings file beside the add-in overrides them).
SETTINGS: dict[str, Any] = {"adapters": "adapters", "reload_interval": 30.0}


class AdapterAddIn(AddIn):
    """Runs one `Adapter` in the container."""

    adapter_class: ClassVar[type[Adapter]]

    def __init__(self) -> None:
        self.runner: AdapterRunner | None = None

    async def start(self, ctx: Context) -> None:
        settings = {**SETTINGS, **dict(ctx.settings)}
        adapter = self.adapter_class(Path(str(settings["adapters"])))
        self.runner = AdapterRunner(
            adapter, ctx.client, reload_interval=float(settings["reload_interval"])
        )
        await self.runner.check()
        ctx.log.info(
            "%s adapter: artefact %s in %s",
            adapter.name,
            f"v{adapter.version}" if adapter.ready else "not there yet",
            adapter.folder,
        )
        ctx.spawn(self.runner.watch(), name=f"aa-adapter-{adapter.name}")

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.aclose()


class SchemaAdapterAddIn(AdapterAddIn):
    """Republishes events under the mined equivalent schemas."""

    adapter_class = SchemaAdapter


class LocationAdapterAddIn(AdapterAddIn):
    """Radio scans → location events."""

    adapter_class = LocationAdapter


class PresenceAdapterAddIn(AdapterAddIn):
    """Radio scans → presence events."""

    adapter_class = PresenceAdapter
