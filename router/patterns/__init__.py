"""aa.router.patterns — the pattern engine of a router (Å §4.3): shared pattern instances
and their three tiers (predicates the router evaluates itself, pattern code in worker
processes, pattern code in the sandbox).

>>> from datetime import datetime, timezone
>>> from aa.mesh import Event, PatternSpec
>>> host = HostFacts(router_id="r1", router_name="lab", clock=lambda: datetime.now(timezone.utc),
...                  peer_count=lambda: 0)
>>> engine = PatternEngine(host=host, on_failure=lambda keys, code, message: None)
>>> engine.subscribe("alice", PatternSpec(source='Temperature > 100 and Sensor.startswith("lab")'))
>>> [key for key, ev in engine.match(Event(values={"Temperature": 101, "Sensor": "lab3"}))]
['alice']

Three tiers
-----------
- **predicate** (`PREDICATE_TIER`): a `python`/`expr` pattern inside the closed grammar
  (`predicates/`: comparisons of event values, `type`, `meta["k"]` and params with
  constants, chained; `and`/`or`/`not`; `in` over constants; bounded arithmetic;
  `startswith`, `endswith`, `lower`, `upper`, `len`; `"X" in event`) is compiled from the
  AST into closures the router evaluates itself, with the kernel's semantics, and filed in
  the index (`index/`: access predicates, Fabret et al. 2001 / BE-Tree): an event costs the
  candidates its fields select, not one evaluation per distinct pattern.
- **worker** (`WORKER_TIER`): scripts, XPath and expressions outside the grammar, in a
  router: pattern code, run for every event in sandbox worker processes (`workers/`).
- **sandbox** (`SANDBOX_TIER`): the same pattern code run in the engine's own process, in
  the sandbox (`sandbox/`), where no worker tier is used (`isolation="in-process"`, or an
  engine used without a running event loop). `PatternEngine.tier(spec)` tells which.

Rooms
-----
Each sub-package has one owner and imports only the rooms before it in this list (held by
`tests/test_exports.py`):

- `sandbox/`: pattern code in the router's process: the `python` and `xpath` kernels, the
  budget, guards, compiler, module proxies and views that confine them, the engine's limits
  and host facts, and run-time errors;
- `predicates/`: the predicate tier: the grammar, the fast path, plans and the program;
- `index/`: the engine's instances and buckets, and the predicate index over them;
- `workers/`: the worker tier (its child process alone imports the engine it runs);
- at the top, `engine.py` (`PatternEngine`), `patternset.py` (`PatternSet`), `advice.py`
  and `scope.py`, which may use every room.

`PatternSet` matches non-subscriber patterns (client caches, HTTP patterns) through the same
index; `PatternEngine.keys_matching(prototype)` finds the subscribers a quench prototype
matches; `PatternEngine.pattern_warnings(spec, seen)` (`advice.py`) says why a pattern may
never match.

Kernels and formats
-------------------
- `python`/`expr`: a boolean expression; its names are `type`, `meta`, `event` (a read-only
  view) and `params`, then the subscriber's params, then the event's values, then the
  builtins (`len`, `max`: an event value of such a name is read instead, as in Python). A
  publisher cannot change what the first two mean: an event carrying a value named `limit`
  does not move a subscriber's `limit` (it would have reached every subscriber of `Price <
  limit`, and made the index evaluate each of them whole: a million for one event), and is
  read as `event["limit"]`. A name missing from the event, or any ordinary error
  (TypeError, KeyError, ZeroDivisionError...), makes the operand of `and`/`or`/`not` it is
  in *unknown*: `A > 1 or B == "x"` matches an event with only `B`; `not` of unknown is
  unknown; a pattern that ends unknown does not match (SQL's three-valued logic).
- `python`/`script`: statements run once per event with the values as bare names plus
  `event`, `state` (kept between events), `forward(ev=None, to=None)`, `new_event(values,
  type=None)`, `params`, `subscribers` (`.id`, `.params`) and `router` (`.id`, `.name`,
  `.time`, `.peer_count`). In scripts those framework names and the params win over event
  values of the same name (read such a value as `event["state"]`). A run that raises
  forwards nothing.
- `xpath`/`expr`: XPath 2.0 over the event as XML, params as `$variables`
  (mapping in `sandbox/xpath_kernel.py`).

Decisions
---------
- **One instance per distinct pattern per router**: same (kernel, format, source) → one
  compilation; its subscribers form its group (Å §4.3).
- **Params are per subscriber; state is per params bucket.** Within an instance, subscribers
  with equal params share a bucket: an expression is evaluated once per bucket per event, a
  script runs once per bucket per event with that bucket's own `state` (so equal pattern and
  equal params, the common case, share state, and `forward()` reaches the bucket's members).
  `update(key, params)` merges the params and moves the subscriber to the matching bucket:
  if it was alone, its bucket (and state) moves with it; if others stay behind, the new
  bucket starts from a deep copy of the old state; if a bucket for the new params already
  exists, the subscriber joins it and its state. Updates happen between two `match` calls,
  so no event is missed or delivered twice. A bucket's state is dropped with its last member.
- **Stopping**: a pattern that breaks the sandbox (time, memory, forbidden access) is
  removed with all its subscribers, its deliveries for that event are dropped, and
  `on_failure(keys, code, message)` is called after the event is matched, with code
  `pattern-timeout`, `pattern-memory` or `pattern-forbidden`. Refusals at subscribe time
  raise `PatternError` with code `pattern-compile` or `pattern-refused`.
- **Run-time errors** (`sandbox/runerrors.py`): an error in pattern code is no match, and is also
  told to the bucket's subscribers through `on_errors(keys, ErrorNotice)`, at most once a
  second, counting the rest; a missing value (a NameError of a name not called) is not an
  error; a bucket whose last 1,000 runs all raised is stopped with code `pattern-errors`.
- **Derived events** (`event.copy`, `event.with_values`, `new_event`) keep the source's meta
  and have no id (None): the router decides how to identify them.
- **Standalone matchers** (`matcher(spec)`): a predicate that is no subscriber, for client
  caches and history queries; `match` never runs it. A script in one keeps its own state.
- **Quenching** (`matches_prototype`): scripts are dry-run on a deep copy of their state and
  match if they forward anything to anyone; `needs_names=True` also requires the pattern to
  mention one of the prototype's value names.

The sandbox, and what it does not cover, is described in `sandbox/budget.py` (time),
`sandbox/guards.py` (memory), `sandbox/compiler.py` (compile-time rules), `sandbox/calls.py`
and `sandbox/modules.py` (what is reachable).
Known limits of the sandbox alone: a single C-level call on adversarial but size-capped
data (sorting a million big equal strings, a catastrophic regular expression in `re` or
XPath `matches()`, `str()` of a container reached through an alias such as `map(str, ...)`)
runs to its end before the pattern is stopped. That is why, in a router, every pattern
outside the closed grammar runs in a worker process (`workers`), where the operating
system bounds memory and the router kills a call that does not return.
"""

from .advice import pattern_warnings
from .engine import (
    CPU_SAMPLE_EVERY,
    MAX_CPU_TOP,
    PREDICATE_TIER,
    SANDBOX_TIER,
    WORKER_TIER,
    PatternCost,
    PatternEngine,
)
from .index import Matcher
from .patternset import PatternSet
from .sandbox import Delivery, ErrorNotice, HostFacts, SandboxLimits
from .scope import admits, scope_filter
from .workers import WorkerConfig

__all__ = [
    "CPU_SAMPLE_EVERY",
    "Delivery",
    "ErrorNotice",
    "HostFacts",
    "MAX_CPU_TOP",
    "Matcher",
    "PatternCost",
    "PatternEngine",
    "PatternSet",
    "PREDICATE_TIER",
    "SANDBOX_TIER",
    "WORKER_TIER",
    "SandboxLimits",
    "WorkerConfig",
    "admits",
    "pattern_warnings",
    "scope_filter",
]
