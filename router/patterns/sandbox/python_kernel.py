"""The `python` kernel: `expr` (a boolean expression) and `script` (statements with `state`
and `forward()`), both compiled once per distinct source and run once per params bucket.

Errors versus violations. A pattern is a filter over events that differ in shape, so an
error is an answer, not a fault: a missing name, comparing a str with an int, a KeyError, a
ZeroDivisionError... make the operand of an expression's `and`/`or`/`not` they are in
unknown (`_decide`: `A > 1 or B == "x"` matches an event with only B; an expression that
ends unknown does not match), and make a script run forward nothing
for that event (deliveries it made before the error are dropped too, so a run either
completes or has no effect on deliveries; `state` changes are kept). Such an error is also
counted for the bucket and told to its subscribers, rate-limited (`runerrors.py`), except a
missing value (a NameError of a name the pattern does not call). Only a `SandboxStop`
(time, memory, forbidden access) stops the pattern; it propagates to the engine, and so
does MemoryError, as a memory stop (in a worker, the address-space limit raises it).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from aa.mesh import Event, check_values

from .assembly import Sandbox
from .budget import MEMORY, SandboxStop
from .compiler import Logic
from .limits import (
    MAX_DERIVED_EVENT_BYTES,
    MAX_DERIVED_EVENTS,
    MAX_DERIVED_TOTAL_BYTES,
    MAX_FORWARDS,
)
from .runerrors import called_names
from .views import EventView, SubscriberView, event_size, private_values

if TYPE_CHECKING:
    from ..index import Bucket

__all__ = ["ExprProgram", "ScriptProgram", "Forwards"]

#: What a script run produced: subscriber key → events to deliver, in forward order.
Forwards = dict[Hashable, list[Event]]

_PASS_THROUGH = (KeyboardInterrupt, SystemExit)  # never raised by pattern code: not reachable
#: The pattern language's own names: no event value changes what they mean.
_CONTEXT_NAMES = frozenset({"type", "meta", "event", "params"})


class ExprProgram:
    """A compiled `python`/`expr` pattern."""

    kind = "expr"
    #: The names the source calls, read at the first need (`called`).
    _called: frozenset[str]

    def __init__(self, sandbox: Sandbox, source: str) -> None:
        self.sandbox = sandbox
        self.source = source
        compiled = sandbox.compile(source, expression=True)
        self.code = compiled.code
        self.names = compiled.names
        self.mentions = compiled.mentions
        self.loops = compiled.loops
        self.uses_type = "type" in compiled.names
        self.uses_meta = "meta" in compiled.names
        self.uses_event = "event" in compiled.names
        #: Its `and`/`or`/`not` evaluated here in three values (`_decide`), or None.
        self.logic = sandbox.compile_tests(source)

    def prepare(self, bucket: Bucket) -> None:
        """Build the bucket's globals: builtins, then params as bare names, then `params`,
        then the guards. Event values are the locals of eval(), so they take precedence over
        builtins (as in Python); but not over the params, `type`, `meta`, `event` or `params`
        (`patterns/__init__.py`): an event value of one of those names the code reads is left
        out of its locals. (A value named as a guard, `_getiter_`, only makes its own event
        fail to match: a value cannot be called.)"""
        g: dict[str, Any] = {"__builtins__": self.sandbox.expr_builtins}
        g.update(bucket.params)
        g["params"] = MappingProxyType(bucket.params)
        g.update(self.sandbox.guard_names)
        kept = tuple((bucket.params.keys() | _CONTEXT_NAMES) & self.names)
        bucket.context = (g, kept)

    def run(self, bucket: Bucket, event: Event) -> bool:
        g, kept = bucket.context
        values = event.values
        for name in kept:  # (a few names, whatever the size of the event)
            if name in values:  # a value named as a param or `type`: not the pattern's
                values = {k: v for k, v in values.items() if k not in kept}
                break
        if self.uses_type:
            g["type"] = event.type
        if self.uses_meta:
            g["meta"] = event.meta
        if self.uses_event:
            g["event"] = EventView._make(event, event.values)
        budget = self.sandbox.budget
        if self.loops:
            budget.start()
        else:
            budget.allocated = 0
        if self.logic is not None:
            return self._run_logic(self.logic, bucket, g, values)
        try:
            result = eval(self.code, g, values)
        except SandboxStop:
            raise
        except _PASS_THROUGH:
            raise
        except MemoryError:  # the worker's address-space limit: a stop, not an answer
            raise SandboxStop(MEMORY, "pattern stopped: it ran out of memory") from None
        except BaseException as exc:
            if budget.violation is None:
                self.sandbox.errors.failed(bucket, exc, self.source, self.called, expression=True)
            return False
        if self.loops and (budget.violation is not None or budget.overran()):
            budget.raise_violation()
        if self.sandbox.errors.tallies:
            self.sandbox.errors.clean(bucket)
        try:
            return bool(result)
        except Exception:
            return False

    def _run_logic(self, logic: Logic, bucket: Bucket, g: dict[str, Any], values: Any) -> bool:
        budget = self.sandbox.budget
        errors: list[BaseException] = []
        decided = _decide(logic, g, values, errors)
        if self.loops and (budget.violation is not None or budget.overran()):
            budget.raise_violation()
        if decided is None:  # unknown: no match, and its first error told as before
            if budget.violation is None:
                self.sandbox.errors.failed(
                    bucket, errors[0], self.source, self.called, expression=True
                )
            return False
        if self.sandbox.errors.tallies:
            self.sandbox.errors.clean(bucket)
        return decided

    def called(self) -> frozenset[str]:
        """The names the source calls (read once, at its first NameError)."""
        return _called(self)


def _decide(
    logic: Logic, g: dict[str, Any], values: Any, errors: list[BaseException]
) -> bool | None:
    """*logic*'s truth in three values: True, False or None (unknown). An operand that
    raises is unknown (its error is added to *errors*); `and` is false if one operand is
    false, `or` true if one is true, and otherwise unknown if one is unknown; `not` keeps
    unknown unknown (SQL's three-valued logic: an event without ``A`` matches neither
    ``A > 1`` nor ``not (A > 1)``)."""
    kind, x = logic
    if kind == "leaf":
        try:
            return bool(eval(x, g, values))
        except SandboxStop:
            raise
        except _PASS_THROUGH:
            raise
        except MemoryError:  # the worker's address-space limit: a stop, not an answer
            raise SandboxStop(MEMORY, "pattern stopped: it ran out of memory") from None
        except BaseException as exc:
            errors.append(exc)
            return None
    if kind == "not":
        r = _decide(x, g, values, errors)
        return None if r is None else not r
    decisive = kind == "or"  # the operand value that decides the whole
    unknown = False
    for part in x:
        r = _decide(part, g, values, errors)
        if r is None:
            unknown = True
        elif r is decisive:
            return decisive
    return None if unknown else not decisive


class ScriptProgram:
    """A compiled `python`/`script` pattern."""

    kind = "script"
    #: The names the source calls, read at the first need (`called`).
    _called: frozenset[str]

    def __init__(self, sandbox: Sandbox, source: str) -> None:
        self.sandbox = sandbox
        self.source = source
        compiled = sandbox.compile(source, expression=False)
        self.code = compiled.code
        self.mentions = compiled.mentions
        #: Estimated bytes of the distinct derived events the last run forwarded.
        self.last_derived_bytes = 0

    def prepare(self, bucket: Bucket) -> None:
        """The bucket's fixed names: builtins, params as bare names, and the group's views."""
        params = private_values(bucket.params)
        base: dict[str, Any] = {"__builtins__": self.sandbox.script_builtins}
        base.update(params)
        bucket.context = (
            base,
            MappingProxyType(params),
            [SubscriberView._make(key, sub.params) for key, sub in bucket.members.items()],
        )

    def run(self, bucket: Bucket, event: Event, state: dict[str, Any] | None = None) -> Forwards:
        """Run the script for *event* with the bucket's state (or *state*, for a dry run)."""
        sandbox = self.sandbox
        budget = sandbox.budget
        base, params, subscribers = bucket.context
        members = bucket.members
        out: Forwards = {}
        count = derived_bytes = 0
        derived: set[int] = set()

        def check(derived: Event) -> None:
            size = event_size(derived, MAX_DERIVED_EVENT_BYTES)
            if size > MAX_DERIVED_EVENT_BYTES:
                budget.stop(
                    MEMORY,
                    f"pattern stopped: derived an event of about {size:,} bytes (limit "
                    f"{MAX_DERIVED_EVENT_BYTES:,})",
                )

        view = EventView._make(event, private_values(event.values), check)

        def forward(ev: Any = None, to: Any = None) -> None:
            """Forward *ev* (default: this event) to the group, or to the subscriber(s) *to*."""
            nonlocal count, derived_bytes
            if ev is None or ev is view:
                chosen = event
            elif type(ev) is EventView and type(ev._event) is Event:
                chosen = ev._event
                if chosen is not event and id(chosen) not in derived:
                    # Checked and measured again as it leaves, and counted against the run's
                    # totals: what a derivation checked is not trusted to be what is sent.
                    check_values(chosen.values)
                    check_values(chosen.meta, "meta")
                    size = event_size(chosen, MAX_DERIVED_EVENT_BYTES)
                    if size > MAX_DERIVED_EVENT_BYTES:
                        budget.stop(
                            MEMORY,
                            f"pattern stopped: forwarded an event of about {size:,} bytes (limit "
                            f"{MAX_DERIVED_EVENT_BYTES:,})",
                        )
                    derived.add(id(chosen))
                    derived_bytes += size
                    if len(derived) > MAX_DERIVED_EVENTS:
                        budget.stop(
                            MEMORY,
                            f"pattern stopped: forwarded more than {MAX_DERIVED_EVENTS:,} derived "
                            "events for one event",
                        )
                    if derived_bytes > MAX_DERIVED_TOTAL_BYTES:
                        budget.stop(
                            MEMORY,
                            f"pattern stopped: forwarded more than {MAX_DERIVED_TOTAL_BYTES:,} "
                            "bytes of derived events for one event",
                        )
            else:
                raise TypeError(
                    "forward() takes an event: the current one, event.copy(...) or new_event(...)"
                )
            keys = members.keys() if to is None else _targets(to, members)
            for key in keys:
                count += 1
                if count > MAX_FORWARDS:
                    budget.stop(
                        MEMORY,
                        f"pattern stopped: forwarded more than {MAX_FORWARDS:,} deliveries for one "
                        "event",
                    )
                out.setdefault(key, []).append(chosen)

        def new_event(values: Mapping[str, Any], type: str | None = None) -> EventView:
            """A new event with these values and type (meta from the current event)."""
            return view.copy(values=values, type=type)

        ns = dict(view._values)  # then the params over them: a publisher cannot change them
        ns.update(base)
        ns["state"] = bucket.state if state is None else state
        ns["params"] = params
        ns["event"] = view
        ns["forward"] = forward
        ns["new_event"] = new_event
        ns["subscribers"] = list(subscribers)
        ns["router"] = sandbox.router
        ns.update(sandbox.guard_names)
        budget.start()
        try:
            exec(self.code, ns)
        except SandboxStop:
            raise
        except _PASS_THROUGH:
            raise
        except MemoryError:  # the worker's address-space limit: a stop, not an answer
            raise SandboxStop(MEMORY, "pattern stopped: it ran out of memory") from None
        except BaseException as exc:
            out = {}
            if budget.violation is None:
                sandbox.errors.failed(bucket, exc, self.source, self.called)
        else:
            if sandbox.errors.tallies:
                sandbox.errors.clean(bucket)
        if budget.violation is not None or budget.overran():
            budget.raise_violation()
        self.last_derived_bytes = (
            derived_bytes  # what the run sends back (the worker tier charges it)
        )
        if state is None:
            bucket.state_countdown -= 1
            if bucket.state_countdown <= 0:
                objects = sandbox.check_state(bucket.state)
                # Re-measure after about 1,000 objects' worth of runs: a small state is
                # checked every run, a large one every few runs (at most every 16th).
                bucket.state_countdown = 1 + min(16, objects // 1024)
        return out

    def called(self) -> frozenset[str]:
        """The names the source calls (read once, at its first NameError)."""
        return _called(self)


def _called(program: ExprProgram | ScriptProgram) -> frozenset[str]:
    names: frozenset[str] | None = getattr(program, "_called", None)
    if names is None:
        names = program._called = called_names(program.source)
    return names


def _targets(to: Any, members: Any) -> Iterable[Hashable]:
    # *members*: a bucket's members, a dict or a lone `Member` (read like a one-entry dict)
    items = [to] if isinstance(to, (SubscriberView, str)) else list(to)
    by_id: dict[str, Hashable] | None = None
    keys = []
    for item in items:
        if isinstance(item, SubscriberView):
            key = item._key
        elif isinstance(item, str):
            if by_id is None:
                by_id = {str(k): k for k in members}
            key = by_id.get(item, item)
        else:
            raise TypeError(
                "forward(to=...) takes a subscriber, a subscriber id, or a list of them"
            )
        if key not in members:
            raise ValueError(f"{item!r} is not a subscriber of this pattern group")
        keys.append(key)
    return keys
