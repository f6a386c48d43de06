"""What the pattern engine is given: the host's facts, the sandbox's limits, and the named
constants behind the limits that are not configurable.

Every cap here bounds something a subscriber controls (Å §4.3 lets any client send code to
every router of the mesh), so each comes with its unit and the reason for its value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeAlias

from aa.mesh import Event, UsageError

__all__ = [
    "Delivery",
    "HostFacts",
    "SandboxLimits",
    "MAX_INT_BITS",
    "MAX_CALL_DEPTH",
    "MAX_STATE_DEPTH",
    "ALLOCATION_FACTOR",
    "CHARGE_THRESHOLD",
    "MAX_FORMAT_WIDTH",
    "MAX_DERIVED_EVENT_BYTES",
    "MAX_FORWARDS",
    "MAX_DERIVED_EVENTS",
    "MAX_DERIVED_TOTAL_BYTES",
    "MAX_XPATH_RANGE",
    "COMPILE_TIME_FACTOR",
]

#: One delivery: (subscriber key, event to deliver).
Delivery: TypeAlias = tuple[Hashable, Event]

#: Largest int, in bits, that `*`, `**`, `<<`, `pow()` and friends may produce. CPython
#: multiplies big ints in C without ever returning to the interpreter, so a 10**8-digit
#: product stalls the router for seconds where no time check can run. 65,536 bits (about
#: 19,700 decimal digits) multiply in microseconds and exceed any sensor arithmetic.
MAX_INT_BITS = 1 << 16

#: Deepest nesting of calls to functions a pattern defines (def and lambda). The interpreter's
#: own limit (1,000 frames) is shared with the router's stack; 64 leaves it ample room.
MAX_CALL_DEPTH = 64

#: Deepest nesting of containers in a script's `state`. Deeper structures break deep copies
#: and size estimates (which run on the router's stack) and serve no pattern.
MAX_STATE_DEPTH = 64

#: One evaluation may build at most ALLOCATION_FACTOR × `max_sequence` elements through the
#: guarded operations (`*`, `+`, join, formatting, ...), added up. A single operation is
#: capped by `max_sequence`; this bounds the sum, so a loop of big allocations is refused
#: before the time budget would notice it.
ALLOCATION_FACTOR = 16

#: Results shorter than this many elements are not charged to the evaluation's allocation
#: total: small strings and lists are what patterns build all the time, and the per-
#: operation cap already bounds them.
CHARGE_THRESHOLD = 4096

#: Widest field a format spec (`f"{x:>N}"`, `"%Nd" % x`, `format(x, spec)`) may ask for,
#: in characters. Widths are the classic way to turn a one-character value into gigabytes.
MAX_FORMAT_WIDTH = 10_000

#: Largest event a script may derive (`new_event`, `event.copy`) and forward, as estimated
#: serialised size in bytes. A derived event goes to clients over the wire, so it must stay
#: well inside the frame cap; estimating counts shared references once per use, which is
#: what the encoder will write.
MAX_DERIVED_EVENT_BYTES = 1_000_000

#: Most deliveries one script run may make (forward() calls × subscribers reached). Each
#: delivery becomes an item in a frame to a client; a script forwarding in a loop must not
#: flood the router's output queues.
MAX_FORWARDS = 10_000

#: Most distinct derived events one script run may forward. Each is encoded by the worker
#: and decoded and checked by the router (a few µs each, on the router's loop); forwarding
#: the current event to many subscribers costs neither.
MAX_DERIVED_EVENTS = 1_000

#: Total estimated bytes of the distinct derived events one script run may forward: one
#: run must not make a worker's reply, or the router's output queues, grow by more.
MAX_DERIVED_TOTAL_BYTES = 4_000_000

#: Longest integer range (`1 to N`) an XPath pattern may build. elementpath materialises
#: ranges as Python lists, even at parse time.
MAX_XPATH_RANGE = 100_000

#: Compiling a pattern may take this many evaluation budgets (elementpath evaluates constant
#: sub-expressions at parse time).
COMPILE_TIME_FACTOR = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class HostFacts:
    """Read-only facts about the host router that a script may read (as `router`)."""

    #: The router's id (unique in the mesh).
    router_id: str
    #: The router's human-readable name.
    router_name: str
    #: Returns the current time, an aware UTC datetime (`router.time`).
    clock: Callable[[], datetime]
    #: Returns how many peer routers are connected (`router.peer_count`).
    peer_count: Callable[[], int]


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxLimits:
    """The budgets every pattern runs under. A pattern that exceeds one is stopped.

    >>> SandboxLimits(time_budget=0.01).max_sequence
    1000000

    Raises `UsageError` for a value out of its range.
    """

    #: Seconds of CPU one evaluation of one pattern may use (checked in every loop
    #: iteration and function call of the pattern; `while True: pass` is stopped after it).
    time_budget: float = 0.02
    #: Rough cap, in bytes, of a script's `state` (estimated after script runs).
    max_state_bytes: int = 1_000_000
    #: Largest list, str, bytes or range (in elements) one operation of a pattern may build
    #: (`*`, `+`, `range`, joins, formatting, ...).
    max_sequence: int = 1_000_000
    #: Most patterns one owner (client) may subscribe; the router enforces it per client.
    max_patterns_per_owner: int = 100

    def __post_init__(self) -> None:
        t = self.time_budget
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise UsageError(f"time_budget must be a number of seconds, not {t!r}")
        if not 0 < t <= 10:
            raise UsageError(f"time_budget must be in (0, 10] seconds, not {t}")
        for name, low in (
            ("max_state_bytes", 1024),
            ("max_sequence", 1024),
            ("max_patterns_per_owner", 1),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UsageError(f"{name} must be an int >= {low}, not {v!r}")

    @property
    def max_allocation(self) -> int:
        """Elements one evaluation may build in total through guarded operations."""
        return ALLOCATION_FACTOR * self.max_sequence
