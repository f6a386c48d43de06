"""`PatternEngine`: subscribers, their shared pattern instances and params buckets, and the
matching of events against all of them.

Structure (see the package docstring for the decisions)::

    engine ──► instance per distinct (kernel, format, source)    compiled once
                 └─► bucket per distinct params                  evaluated once per event
                       ├─ members: subscriber keys               (scripts: own `state`)
                       └─ context: kernel-prepared globals/variables

Each bucket is *placed* when created and unplaced when dropped: a predicate-tier bucket in
the index (`index/`, its plan from `predicates/program.py`), any other on the scan list. `match`
asks the index for the predicate buckets the event matches (each evaluated at most once per
event: a stamp per match call), runs every scan-list bucket, and delivers to the members of
the matching buckets sorted by subscription order. A parametric `update` unplaces and
re-places one bucket between two `match` calls. A `SandboxStop` from any bucket stops the
whole instance: its subscribers are removed, their deliveries for this event dropped, and
`on_failure` is called once per instance after the walk, so the callback may freely call
back into the engine. Run-time errors of pattern code are counted per bucket by the kernels
and told, rate-limited, through `on_errors` after the event (`sandbox/runerrors.py`); a bucket that
only errs is stopped like any other, with code `pattern-errors`.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from aa.mesh import Event, PatternSpec, UsageError, check_values, load_pyx

from .advice import pattern_warnings
from .index import (
    Bucket,
    Instance,
    Matcher,
    Member,
    PredicateIndex,
    add_bucket,
    add_member,
    copy_state,
    drop_bucket,
    drop_member,
    first,
    freeze,
    rekey_bucket,
    shared_strings,
)
from .predicates import Plan, PredicateProgram, parse_conjunction, parse_predicate, plan_spaced
from .sandbox import (
    ERRORS_CODE,
    Delivery,
    ErrorNotice,
    ExprProgram,
    HostFacts,
    Sandbox,
    SandboxLimits,
    SandboxStop,
    ScriptProgram,
    XmlCache,
    XPathProgram,
)
from .scope import scope_filter
from .workers import (
    MAX_STOP_MESSAGE,
    RemoteProgram,
    WorkerConfig,
    WorkerPool,
    WorkerTier,
    deliver_each,
    prechecked,
)

__all__ = [
    "PatternEngine",
    "PatternCost",
    "PREDICATE_TIER",
    "WORKER_TIER",
    "SANDBOX_TIER",
    "CPU_SAMPLE_EVERY",
    "MAX_CPU_TOP",
]

Program = PredicateProgram | ExprProgram | ScriptProgram | XPathProgram | RemoteProgram

#: The tier a pattern lands in: "predicate" (compiled to predicates the router evaluates
#: itself, indexed), "worker" (pattern code — scripts, XPath, expressions outside the
#: predicate grammar — run in a sandbox worker process, `workers`), or "sandbox" (pattern
#: code run in the router's own sandbox: an engine without workers, outside an event loop).
PREDICATE_TIER, WORKER_TIER, SANDBOX_TIER = "predicate", "worker", "sandbox"

#: One event in this many has the router's evaluations of it timed on the thread's CPU
#: clock, each charged this many times over to its pattern (`cpu_top`): the clock is a
#: system call, dearer than most predicates, so timing every event would slow the path.
CPU_SAMPLE_EVERY: Final = 16
#: Most patterns `cpu_top` lists.
MAX_CPU_TOP: Final = 100
#: Instances charged since the last ranking that make `cpu_top` rank again, so that the
#: set stays small whether or not anyone asks (a ranking costs a pass over them).
_RANK_AFTER: Final = 4096

#: The compiled matcher of the usual event (`_match.pyx`), or None: the reference runs.
_compiled: Any = load_pyx(
    __package__ or "aa.router.patterns", Path(__file__).resolve().parent, "_match"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PatternCost:
    """One pattern instance and the CPU its evaluations took (`PatternEngine.cpu_top`)."""

    spec: PatternSpec
    #: "predicate", "sandbox" or "worker" (`PatternEngine.tier`).
    tier: str
    #: Its subscribers on this router (standalone matchers included).
    subscribers: int
    #: Seconds of CPU since it was created: sampled in the router, counted per batch in the
    #: workers (`workers.child`).
    cpu: float


class PatternEngine:
    """The pattern engine of one router: single-threaded, synchronous, in-process.

    >>> from datetime import datetime, timezone
    >>> host = HostFacts(router_id="r1", router_name="r", clock=lambda: datetime.now(timezone.utc),
    peer_count=lambda: 0)
    >>> engine = PatternEngine(host=host, on_failure=lambda keys, code, message: None)
    >>> engine.subscribe("s1", PatternSpec(source="Temperature > threshold"), {"threshold": 100})
    >>> [key for key, ev in engine.match(Event(values={"Temperature": 101}))]
    ['s1']
    """

    def __init__(
        self,
        *,
        host: HostFacts,
        limits: SandboxLimits = SandboxLimits(),
        on_failure: Callable[[list[Hashable], str, str], None],
        isolation: str = "auto",
        workers: WorkerConfig = WorkerConfig(),
        on_deliveries: Callable[[list[Delivery]], None] = deliver_each,
        on_compiled: Callable[[PatternSpec, Program], None] | None = None,
        on_errors: Callable[[list[Hashable], ErrorNotice], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        #: Told the subscribers of a bucket whose pattern code raised (`runerrors.py`).
        self._on_errors = on_errors
        self._monotonic = monotonic
        # Patterns outside the predicate grammar run in worker processes (`workers.tier`).
        self._tier = WorkerTier(
            isolation=isolation,
            host=host,
            limits=limits,
            config=workers,
            deliver=on_deliveries,
            on_stop=self._remote_stopped,
            on_errors=self._remote_erred,
        )
        self._on_compiled = on_compiled
        self._sandbox = self.sandbox = Sandbox(host, limits)
        budget = self._sandbox.budget
        #: Predicate-tier buckets, indexed; every other bucket is on `_scan` (run per event).
        self._index = PredicateIndex(lambda: setattr(budget, "allocated", 0))
        self._scan: dict[Bucket, None] = {}
        self._xml = XmlCache()
        self._on_failure = on_failure
        self._subs: dict[Hashable, Member] = {}
        #: Subscribers per tier, kept at subscribe and at each removal (`by_tier`).
        self._tiers: dict[str, int] = dict.fromkeys((PREDICATE_TIER, WORKER_TIER, SANDBOX_TIER), 0)
        #: (kernel, format, source), and the scope after them for scoped pattern code.
        self._instances: dict[tuple[Any, ...], Instance] = {}
        self._stamp = 0
        self._seq = itertools.count()
        #: The dearest instances at the last ranking, and those charged since: an instance
        #: in neither took no more CPU than the ranked ones, so `cpu_top` never walks them all.
        self._dearest: list[Instance] = []
        self._charged: dict[Instance, None] = {}
        #: The compiled `match` of the usual event (`_match.pyx`), or None.
        self._fast: Any = None
        if _compiled is not None:
            self._fast = _compiled.Matcher(
                self,
                self._index,
                self._tier,
                self._scan,
                self._sandbox.errors.tallies,
                CPU_SAMPLE_EVERY,
            )

    # -- subscribers -----------------------------------------------------------------------

    def subscribe(
        self,
        key: Hashable,
        spec: PatternSpec,
        params: Mapping[str, Any] | None = None,
        *,
        scope: tuple[str, ...] | None = None,
    ) -> None:
        """Add subscriber *key* with pattern *spec* and its *params*.

        *scope* (default: the key's ``scope`` attribute, if any) is the event types its
        owner may receive (`scope.py`): pattern code of this subscriber runs only over those
        (an instance of its own, shared with subscribers of the same scope); a predicate
        delivers the event it matched, which the subscriber's delivery checks.

        Raises `UsageError` if *key* is already subscribed, `InvalidValue` for params outside
        the value model, and `PatternError` (code `pattern-compile` or `pattern-refused`) for
        a pattern that does not compile or breaks a sandbox rule.
        """
        if scope is None:
            scope = getattr(key, "scope", None)
        if scope is not None and "*" in scope:
            scope = None
        if key in self._subs:
            raise UsageError(f"subscriber {key!r} is already subscribed")
        own = (
            shared_strings(dict(params)) if params else _NO_PARAMS
        )  # shared: replaced, never changed
        if own:  # (checked, and frozen below, only if there are any)
            check_values(own, "params")
        spec_key: tuple[Any, ...] = (spec.kernel, spec.format, spec.source)
        instance = self._instances.get(spec_key)
        if scope is not None and (
            instance is None or not isinstance(instance.program, PredicateProgram)
        ):
            scoped = (*spec_key, tuple(scope))
            instance = self._instances.get(scoped)
        plan = None
        if instance is None:
            if (
                not own and spec.kernel == "python" and spec.format == "expr"
            ):  # the common subscribe: read and planned at once
                plan = plan_spaced(spec.source, self._sandbox.expr_builtins, self._index.posting)
            program: Program | None = (
                PredicateProgram(self._sandbox, spec.source, None)
                if plan is not None
                else self._predicate(spec)
            )
            remote = program is None and self._tier.wants(spec)
            if program is None:
                program = (
                    RemoteProgram(spec) if remote and not prechecked(spec) else self._compile(spec)
                )
            if scope is not None and not isinstance(program, PredicateProgram):
                instance = Instance(scoped, program, remote, scope_filter(scope))
            else:
                instance = Instance(spec_key, program, remote)
            self._instances[instance.spec_key] = instance
        sub = Member(key, own, None, next(self._seq))
        self._subs[key] = sub
        self._tiers[_tier_of(instance)] += 1
        self._join(sub, instance, freeze(own) if own else (), None, plan)
        if instance.remote:
            self._tier.subscribe(key, spec, own, None if instance.receives is None else scope)

    def unsubscribe(self, key: Hashable) -> None:
        """Remove subscriber *key* (no-op if unknown). A script's state goes with the last
        subscriber of its bucket."""
        sub = self._subs.pop(key, None)
        if sub is not None:
            self._tiers[_tier_of(sub.bucket.instance)] -= 1
            if sub.bucket.instance.remote:
                self._tier.unsubscribe(key)
            self._leave(sub)

    def update(self, key: Hashable, params: Mapping[str, Any]) -> None:
        """Merge *params* into subscriber *key*'s parameters (parametric subscription).

        The subscriber moves to the bucket of its new params. If it was alone in its old
        bucket, the bucket (and a script's state) moves with it; otherwise a new bucket starts
        from a deep copy of the old state; an existing bucket for the new params keeps its own
        state. Raises `UsageError` for an unknown key, `InvalidValue` for bad params.
        """
        sub = self._subs.get(key)
        if sub is None:
            raise UsageError(f"no subscriber {key!r} to update")
        check_values(params, "params")
        own = shared_strings(dict(params))  # (the others are shared already)
        merged = {**sub.params, **own}
        new_key = freeze(merged)
        old = sub.bucket
        instance = old.instance
        if instance.remote:
            self._tier.update(key, params)
        if new_key == old.params_key:
            sub.params = merged
            return
        into = instance.buckets.get(new_key)
        # The index reads none of the params changed (a limit checked when verifying): the
        # bucket needs no new plan (an update stays cheap, and no event is missed or seen twice).
        same = into is None and own.keys() <= old.params.keys() and self._index.movable(old, own)
        if into is None and type(old.members) is Member:  # alone: the bucket moves, state and all
            if same or own.keys() <= old.params.keys() and self._index.rekey(old, own, old.params):
                rekey_bucket(old, merged, new_key, placed=True)
            else:
                self._unplace(old)
                rekey_bucket(old, merged, new_key)
                self._prepare(old, force=True)
                self._place(old)
            sub.params = merged
            return
        drop_member(old, key)
        if into is not None and instance.program.kind != "script":  # most updates of a million
            if not old.members:  # (an expression's buckets share no state: nothing to prepare)
                self._unplace(old)
            add_member(into, sub)
            sub.bucket, sub.params = into, into.params
            return
        state = None if into is not None else copy_state(old.state)
        if old.members:
            self._prepare(old)
        else:
            self._unplace(old)
        sub.params = merged
        self._join(sub, instance, new_key, state, like=old if same else None)

    def _join(
        self,
        sub: Member,
        instance: Instance,
        params_key: Any,
        state: dict[str, Any] | None,
        plan: Plan | None = None,
        like: Bucket | None = None,
    ) -> None:
        """*plan*: the new bucket's, if it was planned already; *like*: a placed bucket of
        the instance whose place (accesses and checks) the new bucket can take."""
        bucket = instance.buckets.get(params_key)
        new = bucket is None
        if bucket is None:
            bucket = Bucket(instance, sub.params, params_key, state)
            add_bucket(instance, bucket)
        add_member(bucket, sub)
        sub.bucket = bucket
        self._prepare(bucket)
        if new:
            if like is not None:
                self._index.place_like(bucket, like)
            else:
                self._place(bucket, plan)

    def _leave(self, sub: Member) -> None:
        bucket = sub.bucket
        drop_member(bucket, sub.key)
        instance = bucket.instance
        if bucket.members:
            self._prepare(bucket)
            return
        self._unplace(bucket)
        if not instance.buckets:
            del self._instances[instance.spec_key]

    def _place(self, bucket: Bucket, plan: Plan | None = None) -> None:
        """Index a predicate-tier bucket (by *plan* if given); put any other on the scan list."""
        program = bucket.instance.program
        if isinstance(program, PredicateProgram):
            self._index.add(bucket, plan or program.plan(bucket.params, self._index.posting))
        elif not bucket.instance.remote:  # a worker's pattern is matched in its worker
            self._scan[bucket] = None

    def _unplace(self, bucket: Bucket) -> None:
        """Take *bucket* out of its instance, and out of the index or the scan list."""
        drop_bucket(bucket.instance, bucket.params_key)
        self._index.remove(bucket)
        self._scan.pop(bucket, None)
        if self._sandbox.errors.tallies:
            self._sandbox.errors.forget(bucket)

    def _prepare(self, bucket: Bucket, force: bool = False) -> None:
        """(Re)build the kernel's context of *bucket*: expressions depend on the params only,
        scripts also on the members (`subscribers`, in subscription order)."""
        program = bucket.instance.program
        if program.kind == "script":
            if type(bucket.members) is dict:
                bucket.members = dict(sorted(bucket.members.items(), key=lambda kv: kv[1].seq))
            program.prepare(bucket)
        elif force or bucket.context is None:
            program.prepare(bucket)

    def _predicate(self, spec: PatternSpec) -> PredicateProgram | None:
        """*spec* compiled to predicates, if it is an expression inside the closed grammar."""
        if spec.kernel != "python" or spec.format != "expr":
            return None
        sandbox = self._sandbox
        grammar = parse_conjunction(spec.source) or parse_predicate(
            spec.source, sandbox.expr_builtins, sandbox.guards, closures=False
        )
        return None if grammar is None else PredicateProgram(sandbox, spec.source, grammar)

    def _compile(self, spec: PatternSpec) -> Program:
        """*spec* as pattern code in the router's sandbox (also the check at subscribe of a
        pattern that runs in a worker: `workers.prechecked`)."""
        program: Program
        if spec.kernel == "python" and spec.format == "expr":
            program = ExprProgram(self._sandbox, spec.source)
        elif spec.kernel == "python" and spec.format == "script":
            program = ScriptProgram(self._sandbox, spec.source)
        elif spec.kernel == "xpath":
            program = XPathProgram(self._sandbox, spec.source, self._xml)
        else:
            raise UsageError(
                f"no kernel for {spec.kernel}/{spec.format}"
            )  # PatternSpec checks first
        if self._on_compiled is not None:
            self._on_compiled(spec, program)
        return program

    # -- the worker tier (`workers`) -------------------------------------------------------

    def _remote_stopped(self, keys: list[Hashable], code: str, message: str) -> None:
        """A worker stopped these subscribers' pattern (or it was killed running it)."""
        for key in keys:
            sub = self._subs.pop(key, None)
            if sub is not None:
                self._tiers[_tier_of(sub.bucket.instance)] -= 1
                self._leave(sub)
        self._on_failure(keys, code, message)

    def _remote_erred(self, keys: list[Hashable], notice: ErrorNotice) -> None:
        """A worker told these subscribers' pattern raised (rate-limited there)."""
        keys = [k for k in keys if k in self._subs]
        if keys and self._on_errors is not None:
            self._on_errors(keys, notice)

    def _errors_due(self) -> list[tuple[Bucket, SandboxStop]]:
        """Tell the notices that are due; the buckets that only err, to be stopped."""
        errors = self._sandbox.errors
        notices, stopping = errors.due(self._monotonic())
        subs = self._subs
        for bucket, notice in notices:
            keys = [k for k in bucket.members if k in subs]
            if not keys:
                errors.forget(bucket)  # a matcher's or a dry run's: nobody to tell
            elif self._on_errors is not None:
                self._on_errors(keys, notice)
        return [
            (
                bucket,
                SandboxStop(
                    ERRORS_CODE,
                    f"pattern stopped: its last {errors.stop_after:,} runs all raised, the "
                    f"latest {notice.where()}",
                ),
            )
            for bucket, notice in stopping
            if any(k in subs for k in bucket.members)
        ]

    @property
    def workers(self) -> WorkerPool | None:
        """The worker pool, once a pattern went to the worker tier (else None)."""
        return self._tier.pool

    async def aclose(self) -> None:
        """Stop the worker processes (subscribers stay registered). Idempotent."""
        await self._tier.aclose()

    # -- matching --------------------------------------------------------------------------

    def match(self, event: Event) -> list[Delivery]:
        """All deliveries for *event*, in subscription order: (subscriber key, event). For
        expressions the delivered event is *event* itself; for scripts, what they forwarded.
        Patterns the sandbox stops are removed and reported through `on_failure`.

        Predicate-tier buckets come from the index (`index/`): only the candidates the
        event's fields select are evaluated. Every other bucket is run once per event."""
        fast = self._fast
        if fast is not None:  # the usual event, the same way, compiled
            out: list[Delivery] | None = fast.match(event)
            if out is not None:
                return out
        self._stamp += 1
        pool = self._tier.pool
        if pool is not None and len(pool):
            pool.dispatch(event)  # deliveries come back through on_deliveries
        if not (self._index or self._scan or self._sandbox.errors.tallies):
            return []  # no pattern in this process (a router that only relays)
        timed = self._stamp % CPU_SAMPLE_EVERY == 0
        matched, stops = self._index.match(event, self._stamp, self._charge if timed else None)
        if not (stops or self._scan or self._sandbox.errors.tallies):
            # The usual event: predicates only, none stopped or raised. What `_matched`
            # makes of it, without its lists for scripts and failures.
            if not matched:
                return []
            if len(matched) == 1:
                members = matched[0].members
                if type(members) is Member:  # one subscriber: no walk over a one-item view
                    return [(members.key, event)]
                return [(sub.key, event) for sub in members.values()]
            hits = [(sub.seq, sub.key, event) for b in matched for sub in b.members.values()]
            hits.sort(key=first)
            return [(key, ev) for _, key, ev in hits]
        return self._matched(event, matched, stops, time.thread_time_ns if timed else None)

    def deliver_each(self, events: Iterable[Event]) -> None:
        """For an engine whose keys are subscribers (a router's: `deliver(event)`): each
        delivery `match` gives each of *events*, handed to its key, in order."""
        fast = self._fast
        if fast is not None:  # the same loop, compiled
            fast.deliver_each(events)
            return
        for event in events:
            for key, ev in self.match(event):
                cast(Any, key).deliver(ev)

    def _matched(
        self,
        event: Event,
        matched: list[Bucket],
        stops: list[tuple[Bucket, SandboxStop]],
        clock: Callable[[], int] | None,
    ) -> list[Delivery]:
        """`match` once the index has answered: run the other buckets (timed on *clock*, if
        given), order the deliveries, and remove what the sandbox stopped."""
        failures = list(stops)
        budget = self._sandbox.budget
        if failures:
            budget.violation = None
        scripted: list[tuple[Bucket, Any]] = []
        kind = event.type
        for bucket in self._scan:  # not changed during the walk: stops are deferred
            receives = bucket.instance.receives
            if receives is not None and not receives(kind):
                continue  # outside its owners' scope: the pattern never sees it
            if clock is not None:
                start = clock()
            try:
                result = bucket.run(bucket, event)
            except SandboxStop as stop:
                failures.append((bucket, stop))
                budget.violation = None
                continue
            finally:
                if clock is not None:
                    self._charge(bucket, clock() - start)
            if result is True:
                matched.append(bucket)
            elif result:
                scripted.append((bucket, result))
        hits: list[tuple[int, Hashable, Event]] = []
        append = hits.append
        for bucket in matched:
            for sub in bucket.members.values():
                append((sub.seq, sub.key, event))
        for bucket, forwards in scripted:
            for sub in bucket.members.values():
                for ev in forwards.get(sub.key, ()):
                    append((sub.seq, sub.key, ev))
        if len(matched) + len(scripted) > 1:
            hits.sort(key=first)  # stable: a script's forwards keep their order
        out: list[Delivery] = [(key, ev) for _, key, ev in hits]
        if self._sandbox.errors.tallies:
            failures += self._errors_due()
        if failures:
            out = self._stop_all(failures, out)
        return out

    def tier(self, spec: PatternSpec) -> str:
        """The tier *spec* lands in: `PREDICATE_TIER` ("predicate": evaluated by the router
        itself and indexed), `WORKER_TIER` ("worker": pattern code in a worker process) or
        `SANDBOX_TIER` ("sandbox": pattern code in this process). Does not subscribe;
        a pattern that does not compile is "sandbox" (subscribing it raises)."""
        instance = self._instances.get((spec.kernel, spec.format, spec.source))
        if instance is not None:
            if isinstance(instance.program, PredicateProgram):
                return PREDICATE_TIER
            return WORKER_TIER if instance.remote else SANDBOX_TIER
        if spec.kernel == "python" and spec.format == "expr":
            # As `_predicate` decides at subscribe: the common conjunction is read without
            # `ast`, which a client subscribing distinct patterns in a loop would make it pay.
            if parse_conjunction(spec.source) is not None or (
                parse_predicate(
                    spec.source, self._sandbox.expr_builtins, self._sandbox.guards, closures=False
                )
                is not None
            ):
                return PREDICATE_TIER
        return WORKER_TIER if self._tier.wants(spec) else SANDBOX_TIER

    def matches_prototype(self, key: Hashable, prototype: Event, needs_names: bool = False) -> bool:
        """Would subscriber *key*'s pattern let *prototype* through (quenching, Å §4.4)?

        Expressions are evaluated; scripts run on a deep copy of their state and count as
        matching if they forward anything (to any member of the group). Nothing of the
        pattern's state changes. With *needs_names*, a pattern also has to mention one of the
        prototype's value names (so `True` or `type == "x"` does not claim every publisher).
        Raises `UsageError` for an unknown key.
        """
        sub = self._subs.get(key)
        if sub is None:
            raise UsageError(f"no subscriber {key!r}")
        bucket = sub.bucket
        program = bucket.instance.program
        if needs_names and not (_mentioned(program) & prototype.values.keys()):
            return False
        receives = bucket.instance.receives
        if receives is not None and not receives(prototype.type):
            return False  # outside its owners' scope: never shown to the pattern
        if bucket.instance.remote:
            return True  # never run here: "may match" (`select`, quench dry-run it in its worker)
        try:
            if isinstance(program, ScriptProgram):
                try:
                    state = copy.deepcopy(bucket.state)
                except Exception:
                    return True  # cannot dry-run safely: assume it may forward
                return bool(program.run(bucket, prototype, state))
            return bool(program.run(bucket, prototype))
        except SandboxStop as stop:
            self._sandbox.budget.violation = None
            self._stop_all([(bucket, stop)], [])
            return False

    async def select(self, key: Hashable, events: list[Event]) -> list[Event]:
        """The *events* subscriber *key*'s pattern lets through, as `matches_prototype` for
        each (history replay); a worker's pattern is dry-run in its worker, awaited. Raises
        `UsageError` for an unknown key."""
        sub = self._subs.get(key)
        receives = None if sub is None else sub.bucket.instance.receives
        if receives is not None:
            events = [e for e in events if receives(e.type)]
        if sub is not None and sub.bucket.instance.remote:
            return await self._tier.select(key, events)
        return [e for e in events if self.matches_prototype(key, e)]

    def keys_matching(self, prototype: Event, needs_names: bool = False) -> list[Hashable]:
        """The subscribers whose pattern would let *prototype* through (quenching, Å §4.4), in
        subscription order: `matches_prototype` for every key at once, through the index."""
        self._stamp += 1  # a fresh evaluation mark
        buckets, stops = self._index.match(prototype, self._stamp)
        if stops:
            self._sandbox.budget.violation = None
            self._stop_all(stops, [])
        stopped = {id(b) for b, _ in stops}
        found = {sub.key for b in buckets if id(b) not in stopped for sub in b.members.values()}
        # Pattern code (here, or a worker's, dry-run here) is asked one bucket at a time; the
        # list is copied first: a dry run may stop a pattern.
        scan = list(self._scan) + [
            b for i in self._instances.values() if i.remote for b in i.buckets.values()
        ]
        for bucket in scan:
            key = next(iter(bucket.members), None)
            if key is not None and key in self._subs and self.matches_prototype(key, prototype):
                found.update(bucket.members)
        keys = [k for k in self.keys() if k in found]
        if needs_names:
            names = prototype.values.keys()
            keys = [k for k in keys if self._subs[k].bucket.instance.program.mentions & names]
        return keys

    def pattern_warnings(
        self, spec: PatternSpec, seen: Collection[str], params: Mapping[str, Any] | None = None
    ) -> list[str]:
        """Why *spec* may never match, given the value names *seen* on the mesh: unseen names
        (with the closest seen one) and bare names meant as text (`advice.py`)."""
        known = self._sandbox.expr_builtins.keys() | self._sandbox.script_builtins.keys()
        return pattern_warnings(spec, seen, params, known)

    def bucket_of(self, key: Hashable) -> Bucket | None:
        """Subscriber *key*'s bucket (its params and a script's `state`), or None."""
        sub = self._subs.get(key)
        return sub.bucket if sub is not None else None

    def pattern_of(self, key: Hashable) -> PatternSpec:
        """Subscriber *key*'s pattern (quenching reads its declared needs). Raises
        `UsageError` for an unknown key."""
        sub = self._subs.get(key)
        if sub is None:
            raise UsageError(f"no subscriber {key!r}")
        kernel, format, source = sub.bucket.instance.spec_key
        return PatternSpec(kernel=kernel, format=format, source=source)

    def matcher(
        self,
        spec: PatternSpec,
        params: Mapping[str, Any] | None = None,
        *,
        scope: tuple[str, ...] | None = None,
    ) -> Matcher:
        """A predicate for *spec* that is not a subscriber: `match` never evaluates it, so it
        costs nothing until called (`hot = engine.matcher(spec); hot(event) -> bool`).
        Client caches and history queries use it.
        Shares the compiled program with subscribers of the same pattern when there are any;
        has its own params bucket, so a script keeps its own `state` (a script "accepts" an
        event when it forwards anything). Evaluation is side-effect free for expressions.
        If the sandbox stops the pattern, the predicate answers False from then on and its
        `stopped` says why. Raises `PatternError` (`pattern-compile`, `pattern-refused`) and
        `InvalidValue` like `subscribe`. Pattern code bound for the workers gets a
        `workers.RemoteMatcher` instead: it runs only in a worker (`start`, `select`).

        *scope*, as for `subscribe`: pattern code runs only over the event types it admits
        (an instance shared only within that scope); a predicate answers for any type, and
        its caller keeps what the scope admits.
        """
        own = dict(params or {})
        check_values(own, "params")
        if scope is not None and "*" in scope:
            scope = None
        spec_key = (spec.kernel, spec.format, spec.source)
        existing = self._instances.get(spec_key)
        program = existing.program if existing is not None else self._predicate(spec)
        receives = scope_filter(scope)
        if existing.remote if existing is not None else program is None and self._tier.wants(spec):
            if existing is None and prechecked(spec):
                self._compile(spec)  # refused now if it breaks a rule; it runs only in a worker
            return self._tier.matcher(spec, own, scope, receives)  # `workers.RemoteMatcher`
        program = program or self._compile(spec)
        if scope is not None and not isinstance(program, PredicateProgram):
            scoped = (*spec_key, scope)
            instance = self._instances.get(scoped) or Instance(scoped, program, False, receives)
        else:
            instance = existing if existing is not None else Instance(spec_key, program)
        bucket = Bucket(instance, own, freeze(own))  # detached: not in instance.buckets
        m = Matcher(self, bucket)
        # A member to forward to, so scripts (`forward()` reaches members) can accept.
        add_member(bucket, Member(m, own, bucket, -1))
        instance.program.prepare(bucket)
        return m

    def _stop_all(
        self, failures: list[tuple[Bucket, SandboxStop]], out: list[Delivery]
    ) -> list[Delivery]:
        """Stop each failed bucket (its params, its state); the pattern's other buckets go
        on: their subscribers do not pay for params they did not choose."""
        reports = []
        stopped: set[Hashable] = set()
        for bucket, stop in failures:
            instance = bucket.instance
            if instance.buckets.get(bucket.params_key) is not bucket:
                continue  # stopped already (twice in one event)
            self._unplace(bucket)
            keys = [k for k in bucket.members if k in self._subs]
            self._tiers[_tier_of(instance)] -= len(keys)
            for k in keys:
                del self._subs[k]
                if instance.remote:
                    self._tier.unsubscribe(k)
            if not instance.buckets:
                self._instances.pop(instance.spec_key, None)
            stopped.update(keys)
            reports.append((keys, stop.code, stop.message[:MAX_STOP_MESSAGE]))
        if stopped:
            out = [d for d in out if d[0] not in stopped]
        for keys, code, message in reports:
            self._on_failure(keys, code, message)
        return out

    # -- introspection ---------------------------------------------------------------------

    def __len__(self) -> int:  # subscribers
        return len(self._subs)

    def by_tier(self) -> dict[str, int]:
        """Subscribers in each tier ("predicate", "worker", "sandbox"): O(1), for metrics."""
        return dict(self._tiers)

    @property
    def instance_count(self) -> int:
        """Number of distinct compiled pattern instances."""
        return len(self._instances)

    def keys(self) -> list[Hashable]:
        """The subscriber keys, in subscription order."""
        return list(self._subs)

    def _charge(self, bucket: Bucket, ns: int) -> None:
        instance = bucket.instance
        instance.cpu_ns += ns * CPU_SAMPLE_EVERY
        self._charged[instance] = None
        if len(self._charged) > _RANK_AFTER:
            self._rank()

    def _rank(self) -> None:
        live = self._instances
        both = dict.fromkeys(self._dearest)
        both.update(self._charged)
        self._charged.clear()
        alive = (i for i in both if live.get(i.spec_key) is i)
        self._dearest = heapq.nlargest(MAX_CPU_TOP, alive, key=_cpu_ns)

    def cpu_top(self, n: int, keys: Iterable[Hashable] | None = None) -> list[PatternCost]:
        """The *n* (at most `MAX_CPU_TOP`) pattern instances whose evaluations took the most
        CPU, the dearest first; of the patterns of *keys* only, unless None. A pattern in
        the worker tier is charged what the workers reported (`WorkerPool.cpu_ns`).

        Costs the ranked and recently charged instances, the worker tier's and *keys*'s:
        not a pass over every instance of a router with a million patterns."""
        pool = self._tier.pool
        instances: Iterable[Instance]
        if keys is None:
            self._rank()
            remote = pool.spec_keys() if pool is not None else ()
            live = self._instances
            instances = [
                *self._dearest,
                *(i for k in remote if (i := live.get(k)) is not None and i.remote),
            ]
        else:
            subs = self._subs
            instances = {
                subs[k].bucket.instance: None for k in keys if k in subs
            }.keys()  # in order, once each

        def cost(i: Instance) -> int:
            return pool.cpu_ns(i.spec_key) if i.remote and pool is not None else i.cpu_ns

        top = heapq.nlargest(max(0, min(n, MAX_CPU_TOP)), instances, key=cost)
        return [
            PatternCost(
                spec=PatternSpec(kernel=i.spec_key[0], format=i.spec_key[1], source=i.spec_key[2]),
                tier=_tier_of(i),
                subscribers=sum(len(b.members) for b in i.buckets.values()),
                cpu=cost(i) / 1e9,
            )
            for i in top
        ]


def _cpu_ns(instance: Instance) -> int:
    return instance.cpu_ns


def _tier_of(instance: Instance) -> str:
    if isinstance(instance.program, PredicateProgram):
        return PREDICATE_TIER
    return WORKER_TIER if instance.remote else SANDBOX_TIER


_NO_PARAMS: dict[
    str, Any
] = {}  # of every subscriber without any (an empty dict costs 64 bytes each)


def _mentioned(program: Program) -> frozenset[str]:
    return program.mentions
