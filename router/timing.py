"""How long the router holds an event: a histogram of the time from the dispatch of a batch
of events to the write of its deliveries, for ``aa_dispatch_seconds`` at ``GET /metrics``.

The event path must not pay for metrics, so the dispatcher times one batch in
`SAMPLE_EVERY` (a client's publish frame, or one event of a peer's flood) with two clock
reads, and this histogram is a list of counts the scraper reads when it asks. What it
measures is the synchronous part: matching, the sinks (store queue, caches, event log) and
the writes of every subscriber's delivery frame. Deliveries of patterns run in worker
processes come back later and are not in it.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Final

__all__ = ["DispatchTimes", "DISPATCH_BUCKETS", "SAMPLE_EVERY"]

#: Upper bounds of the histogram's buckets, in seconds: from a small batch of predicate
#: matches (tens of microseconds) to a stalled loop (a second); +Inf follows.
DISPATCH_BUCKETS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
#: Batches (or a peer's events) dispatched per one timed: at 10,000 events/s in batches of
#: ten, sixty samples a second, plenty for quantiles over a minute.
SAMPLE_EVERY: Final = 16


class DispatchTimes:
    """Counts per bucket (not cumulative; the last is +Inf), their sum and their number."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...] = DISPATCH_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it) per bucket, ending with +Inf."""
        out = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out
