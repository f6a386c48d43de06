"""`WorkerTier`: the engine's one handle on the worker tier — which patterns go to it, and
the pool, made on first use (it needs the router's running event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

from aa.mesh import Event, PatternSpec, UsageError

from ..index import Bucket, Instance, freeze
from ..sandbox import HostFacts, SandboxLimits
from .config import WorkerConfig
from .hooks import RemoteMatcher, RemoteProgram
from .pool import Deliveries, WorkerPool

__all__ = ["WorkerTier", "ISOLATIONS"]

#: "workers": patterns outside the closed grammar run in worker processes; "in-process":
#: every pattern runs in the engine's own sandbox; "auto": workers when the engine lives in
#: a running event loop (a router), in-process otherwise (a bare engine, used synchronously).
ISOLATIONS = ("auto", "workers", "in-process")


class WorkerTier:
    def __init__(
        self,
        *,
        isolation: str,
        host: HostFacts,
        limits: SandboxLimits,
        config: WorkerConfig,
        deliver: Callable[[Deliveries], None],
        on_stop: Callable[[list[Hashable], str, str], None],
        on_errors: Callable[[list[Hashable], Any], None],
    ) -> None:
        if isolation not in ISOLATIONS:
            raise UsageError(f"isolation must be one of {', '.join(ISOLATIONS)}, not {isolation!r}")
        self.isolation = isolation
        self._args: dict[str, Any] = {
            "host": host,
            "limits": limits,
            "config": config,
            "deliver": deliver,
            "on_stop": on_stop,
            "on_errors": on_errors,
        }
        #: The pool, once a pattern went to a worker (else None).
        self.pool: WorkerPool | None = None

    def wants(self, spec: PatternSpec) -> bool:
        """Does *spec* — pattern code, outside the predicate grammar (the engine asks only
        for those) — run in a worker?"""
        if self.isolation == "in-process":
            return False
        if self.isolation == "auto":
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return False
        return True

    def open(self) -> WorkerPool:
        """The pool, made now if there is none (in the running event loop)."""
        if self.pool is None or self.pool.closed:
            self.pool = WorkerPool(**self._args)
        return self.pool

    def subscribe(
        self,
        key: Hashable,
        spec: PatternSpec,
        params: dict[str, Any],
        scope: tuple[str, ...] | None = None,
    ) -> None:
        """Place *key*'s pattern in a worker; it runs only over events *scope* admits."""
        client = getattr(key, "client_id", None) or key  # the placement unit (`pool.py`)
        self.open().subscribe(key, spec, params, str(client), scope=scope)

    def matcher(
        self,
        spec: PatternSpec,
        params: dict[str, Any],
        scope: tuple[str, ...] | None = None,
        receives: Callable[[str | None], bool] | None = None,
    ) -> RemoteMatcher:
        """A standalone matcher for *spec* that runs only in a worker (`RemoteMatcher`), over
        the event types *scope* admits (*receives*: the check of it)."""
        spec_key = (spec.kernel, spec.format, spec.source)
        instance = Instance(spec_key, RemoteProgram(spec), remote=True, receives=receives)
        bucket = Bucket(instance, params, freeze(params))
        return RemoteMatcher(self, spec, params, bucket, scope)

    async def select(self, key: Hashable, events: list[Event]) -> list[Event]:
        """The *events* subscriber *key*'s pattern lets through, dry-run in its worker.
        Raises `UsageError` if *key* has no worker-tier pattern (stopped meanwhile)."""
        if self.pool is None:
            raise UsageError(f"no worker-tier pattern {key!r}")
        answers = await self.pool.probe(key, events)
        return [e for e, ok in zip(events, answers) if ok]

    def unsubscribe(self, key: Hashable) -> None:
        if self.pool is not None:
            self.pool.unsubscribe(key)

    def update(self, key: Hashable, params: Any) -> None:
        if self.pool is not None:
            self.pool.update(key, params)

    async def aclose(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()
