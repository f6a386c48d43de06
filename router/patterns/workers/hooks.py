"""What the engine needs from the worker tier besides the pool: the stand-in program of a
pattern compiled only in its worker, and the default way a worker's deliveries reach their
subscribers."""

from __future__ import annotations

import re
from typing import Any, Hashable

from aa.mesh import Event, PatternSpec

from .limits import PRECHECK_MAX_SOURCE

__all__ = ["RemoteProgram", "deliver_each", "prechecked"]

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def prechecked(spec: PatternSpec) -> bool:
    """Is a worker-tier *spec* also compiled in the router, for an immediate refusal?
    Python sources up to `PRECHECK_MAX_SOURCE` characters (compiling them is bounded work);
    never XPath, whose parser evaluates constant sub-expressions while it parses."""
    return spec.kernel == "python" and len(spec.source) <= PRECHECK_MAX_SOURCE


class RemoteProgram:
    """A worker-tier pattern too long to pre-compile in the router (`PRECHECK_MAX_SOURCE`).
    Matching happens in its worker; the router's own uses (quench dry-runs, history replay,
    client caches) get the cautious answer "may match"."""

    def __init__(self, spec: PatternSpec) -> None:
        self.kind = spec.format if spec.kernel == "python" else "xpath"
        self.mentions = frozenset(_WORD.findall(spec.source[:65536]))

    def prepare(self, bucket: Any) -> None:
        bucket.context = None

    def run(self, bucket: Any, event: Event, state: Any = None) -> bool:
        return True


def deliver_each(items: list[tuple[Hashable, Event]]) -> None:
    """Hand each (subscriber key, event) to `key.deliver`. A router passes its own
    `on_deliveries` to the engine, which also writes what that queued (`Router`)."""
    for key, event in items:
        key.deliver(event)  # type: ignore[attr-defined]