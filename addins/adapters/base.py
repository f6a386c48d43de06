"""What the adapters share: loading their artefact when it changes, and marking what they
publish so that no adapter adapts an adapted event again.

An adapter is plain logic (no I/O but reading its artefact): `Adapter.handle` takes an
event and returns the events to publish, as ``(type, values)``; `Adapter.reload` loads the
artefact if ``current`` changed. The add-in (`aa.addins.adapters.addin`) feeds it from a
subscription and publishes what it returns, with `adapted_meta`.

Loops. The schema adapter republishes ``quote`` as ``ticker`` and ``ticker`` as ``quote``;
without a mark, each republished event would be republished back, forever. Every adapted
event carries ``meta["adapted_by"]`` (the adapter's name) and ``meta["adapted_from"]`` (the
source event's id), and every adapter ignores events that carry either (`Adapter.handle`
checks before the adapter's own logic runs; the bundled ticker adapter sets
``adapted_from`` too).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Final

from aa.mesh import Event

from .artefact import Artefact, ArtefactWatch

__all__ = ["Adapter", "ADAPTED_BY", "ADAPTED_FROM", "adapted_meta", "Output"]

log = logging.getLogger("aa.addins.adapters")

#: Meta key naming the adapter that made an event (loop guard, see the module docstring).
ADAPTED_BY: Final = "adapted_by"
#: Meta key with the id of the event it was made from.
ADAPTED_FROM: Final = "adapted_from"

#: What an adapter returns per published event: (type, values).
Output = tuple[str, dict[str, Any]]


def adapted_meta(adapter: str, source: Event) -> dict[str, Any]:
    """The meta an adapted event is published with."""
    meta: dict[str, Any] = {ADAPTED_BY: adapter}
    if source.id is not None:
        meta[ADAPTED_FROM] = source.id
    return meta


class Adapter:
    """Base of the adapters: an artefact folder, watched; `handle` per event."""

    #: The mining task whose artefact this adapter loads (its folder's name).
    task: ClassVar[str] = ""
    #: Name put in ``meta["adapted_by"]``.
    name: ClassVar[str] = ""

    def __init__(self, adapters: str | os.PathLike[str]) -> None:
        self.folder = Path(adapters) / self.task
        self._watch = ArtefactWatch(self.folder)
        #: The loaded artefact's version (None until one is loaded).
        self.version: int | None = None

    def reload(self) -> bool:
        """Load the artefact if it changed; True if a new one was loaded. A broken one is
        skipped (the adapter keeps working with the one it had)."""
        art = self._watch.poll()
        if art is None:
            return False
        try:
            self._load(art)
        except (KeyError, TypeError, ValueError):
            log.warning(
                "%s adapter: artefact %s is malformed; keeping version %s",
                self.name,
                art.path,
                self.version,
                exc_info=True,
            )
            return False
        self.version = art.version
        log.info("%s adapter: loaded %s", self.name, art.path)
        return True

    @property
    def ready(self) -> bool:
        """True once an artefact is loaded."""
        return self.version is not None

    def handle(self, event: Event, *, now: float | None = None) -> list[Output]:
        """The events to publish for *event* (none for an adapted event, or before an
        artefact is loaded). *now* is wall time in seconds, for adapters that keep state."""
        if not self.ready or ADAPTED_BY in event.meta or ADAPTED_FROM in event.meta:
            return []
        return self._handle(event, now)

    def pattern(self) -> str:
        """The subscription pattern (a python ``expr``) for the events this adapter takes."""
        types = sorted(self.input_types())
        return f"type in {tuple(types)!r}" if types else "False"

    # -- for subclasses --------------------------------------------------------------------

    def input_types(self) -> set[str]:
        raise NotImplementedError

    def _load(self, artefact: Artefact) -> None:
        raise NotImplementedError

    def _handle(self, event: Event, now: float | None) -> list[Output]:
        raise NotImplementedError

    @staticmethod
    def _data(artefact: Artefact) -> Mapping[str, Any]:
        return artefact.data
