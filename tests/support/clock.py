"""A clock tests move: everything with a deadline takes `now`, so tests move time instead of
sleeping."""

from __future__ import annotations

__all__ = ["Clock"]


class Clock:
    """Monotonic seconds and wall seconds together; `advance` moves both."""

    def __init__(self, start: float = 1_000.0, wall: float = 1_800_000_000.0) -> None:
        self.t = start
        self.w = wall

    def __call__(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.w

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.w += seconds
