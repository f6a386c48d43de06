"""Timings and caps of quenching on one router (a small frozen object, validated on
construction; `aa.router.quench` reads it). Tests shorten the intervals instead of sleeping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aa.mesh import UsageError

__all__ = ["QuenchConfig", "MAX_QUENCHES_PER_CLIENT", "MAX_QUENCH_TIMEOUT"]

#: Registrations one client may hold at once: each is evaluated against every subscription
#: of every router, so one client must not fill the mesh's tables.
MAX_QUENCHES_PER_CLIENT: Final = 100
#: Longest keep-alive timeout a router accepts in a flooded registration, seconds: a
#: registration whose owner vanished must go at last.
MAX_QUENCH_TIMEOUT: Final = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class QuenchConfig:
    """Timings and caps of quenching on one router.

    >>> QuenchConfig(keepalive=0.2, timeout=0.7).timeout
    0.7
    """

    #: Seconds between two keep-alive floods of the registrations owned here (also how often
    #: lapsed registrations and interest are swept).
    keepalive: float = 10.0
    #: Seconds a registration lives on other routers without a keep-alive, and a router's
    #: reported interest lives at the owner without a confirmation. Over twice `keepalive`,
    #: so that one lost flood loses nothing.
    timeout: float = 35.0
    #: Registrations one client may hold.
    max_per_client: int = MAX_QUENCHES_PER_CLIENT

    def __post_init__(self) -> None:
        for name in ("keepalive", "timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise UsageError(f"{name} must be a positive number of seconds")
        if self.timeout <= 2 * self.keepalive:
            raise UsageError("timeout must be over twice the keepalive")
        if self.timeout > MAX_QUENCH_TIMEOUT:
            raise UsageError(f"timeout must be at most {MAX_QUENCH_TIMEOUT:g} seconds")
        if type(self.max_per_client) is not int or self.max_per_client <= 0:
            raise UsageError("max_per_client must be a positive int")
