"""What pattern code may see: a *scope* is the tuple of type patterns its owner may receive
(the ``subscribe`` list of the permissions file, `aa.router.security.permissions`), None for
any type.

A pattern sees only events inside its owner's scope: the events are left out before it
runs, on every tier (the router's scan list, the worker processes, history replay, the mesh
cache), so no script can read, count or relabel an event its owner may not receive.
Instances of pattern code are shared only by subscribers with the same scope.
"""

from __future__ import annotations

from collections.abc import Callable
from fnmatch import fnmatchcase
from functools import lru_cache

__all__ = ["admits", "scope_filter"]


#: Answers of `admits` remembered, in (scope, type) pairs: it is asked per event and per
#: subscription of a restricted user (a glob match each), and event types are few; bounded,
#: since a publisher picks them.
ADMITS_REMEMBERED = 4096


@lru_cache(maxsize=ADMITS_REMEMBERED)
def admits(scope: tuple[str, ...], type_: str | None) -> bool:
    """Whether *scope* admits events of *type_*: glob patterns; ``"*"`` is any type, untyped
    events included; ``""`` is the untyped events only."""
    if type_ is None:
        return "*" in scope or "" in scope
    return any(fnmatchcase(type_, p) for p in scope if p)


def scope_filter(scope: tuple[str, ...] | None) -> Callable[[str | None], bool] | None:
    """A check of event types for *scope* (None: any type, nothing to check)."""
    if scope is None or "*" in scope:
        return None
    frozen = tuple(scope)
    return lambda type_: admits(frozen, type_)
