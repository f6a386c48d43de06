"""What the engine needs from the worker tier besides the pool: the stand-in program of a
pattern compiled only in its worker, and the default way a worker's deliveries reach their
subscribers."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol, cast

from aa.mesh import Event, PatternSpec

from ..index import Bucket, Matcher
from .config import PRECHECK_MAX_SOURCE
from .slots import MATCHER

if TYPE_CHECKING:
    from .tier import WorkerTier

__all__ = ["RemoteMatcher", "RemoteProgram", "deliver_each", "missed_each", "prechecked"]

log = logging.getLogger("aa.router.patterns.workers")

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


class _Deliverable(Protocol):
    """A subscriber key that takes its deliveries (`aa.router.seams.Subscriber`)."""

    def deliver(self, event: Event) -> None: ...


def deliver_each(items: list[tuple[Hashable, Event]]) -> None:
    """Hand each (subscriber key, event) to `key.deliver`. A router passes its own
    `on_deliveries` to the engine, which also writes what that queued (`Router`)."""
    for key, event in cast("list[tuple[_Deliverable, Event]]", items):
        key.deliver(event)


def missed_each(keys: list[Hashable], count: int) -> None:
    """Tell each subscriber key that *count* events went unmatched for it (a worker's
    backlog was full): `key.missed_events(count)` where the key has it (a TCP client's
    subscription: a `Missed` frame before its next delivery)."""
    for key in keys:
        missed = getattr(key, "missed_events", None)
        if missed is not None:
            missed(count)


class RemoteMatcher(Matcher):
    """A standalone matcher (`PatternEngine.matcher`) whose pattern is code: it never runs
    in the router. Called as a predicate it answers False; the events it accepts come
    back later, from a worker:

    - standing (a client cache's): `start(on_accept, client)` places it on a worker, which
      evaluates it on every dispatched event, as it does subscribers, and hands each event
      it accepts to *on_accept*, in dispatch order; `close()` removes it;
    - one-shot (a history or cache query): `await select(events)`, the events it accepts.

    A pattern that breaks the sandbox is stopped (`stopped` says why) and accepts nothing
    more, as an in-process matcher."""

    __slots__ = ("_tier", "_spec", "_params", "_on_accept", "placed", "scope")

    def __init__(
        self,
        tier: WorkerTier,
        spec: PatternSpec,
        params: dict[str, Any],
        bucket: Bucket,
        scope: tuple[str, ...] | None = None,
    ) -> None:
        super().__init__(None, bucket)  # type: ignore[arg-type]  # never reaches the engine
        self._tier, self._spec, self._params = tier, spec, params
        self._on_accept: Callable[[Event], None] | None = None
        #: Placed on a worker (standing or for a query).
        self.placed = False
        #: The event types it may see (its owner's, `scope.py`; None: any type): its worker
        #: runs it over those only, and `select` leaves the others out (its instance's
        #: `receives` checks them).
        self.scope = scope

    remote = True

    def __call__(self, event: Event) -> bool:
        return False

    def start(self, on_accept: Callable[[Event], None], client: str) -> None:
        """Evaluate it on every dispatched event from now on, in a worker; each accepted
        event goes to *on_accept*. *client*: whose CPU share it is charged to."""
        self._on_accept = on_accept
        if not self.placed and self.stopped is None:
            self.placed = True
            self._tier.open().subscribe(
                self, self._spec, self._params, client, MATCHER, scope=self.scope
            )

    def close(self) -> None:
        """Remove it from its worker (no-op if not placed)."""
        self._on_accept = None
        if self.placed:
            self.placed = False
            self._tier.unsubscribe(self)

    async def select(self, events: list[Event], client: str = "query") -> list[Event]:
        """The *events* it accepts, evaluated in a worker (awaited; the router's loop goes
        on). Placed for the query only if not standing already."""
        receives = self.bucket.instance.receives
        if receives is not None:
            events = [e for e in events if receives(e.type)]
        if self.stopped is not None or not events:
            return []
        standing = self.placed
        if not standing:
            self.placed = True
            self._tier.open().subscribe(
                self, self._spec, self._params, client, MATCHER, scope=self.scope
            )
        try:
            pool = self._tier.pool
            if pool is None or self not in pool:  # refused by its worker, or stopped
                return []
            answers = await pool.probe(self, events)
        finally:
            if not standing:
                self.close()
        return [e for e, ok in zip(events, answers) if ok]

    # -- what the pool calls (it takes this matcher for a subscriber key) -----------------

    def deliver(self, event: Event) -> None:
        if self._on_accept is not None and self.stopped is None:
            self._on_accept(event)

    def pattern_failed(self, code: str, message: str) -> None:
        self.stopped = message
        self.placed = False

    def missed_events(self, count: int) -> None:
        log.warning("%d events were not matched for %r: its worker fell behind", count, self)
