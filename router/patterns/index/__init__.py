"""aa.router.patterns.index — the engine's shared instances and their buckets, and the
index that finds which predicate-tier buckets an event can match without evaluating each.

Who owns what:

- `buckets.py`: the data of the pattern engine: a pattern's compiled `Instance`, its
  `Bucket`s of subscribers with equal params, each subscriber's `Member`ship, a standalone
  `Matcher`, and the helpers that keep them consistent (`add_member`, `drop_member`,
  `add_bucket`, `drop_bucket`, `rekey_bucket`, `copy_state`, `freeze`, `shared_strings`,
  `first`); the engine holds the logic;
- `predicate_index.py` (`PredicateIndex`): the index over buckets of the predicate tier,
  each conjunction filed under one access predicate;
- `postings.py`: the index's posting lists.

It uses the predicates room (plans) and the sandbox room (`SandboxStop`, the errors that
are no match); the buckets name the engine's types for type checking only.
"""

from .buckets import (
    Bucket,
    Instance,
    Matcher,
    Member,
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
from .predicate_index import PredicateIndex

__all__ = [
    "Bucket",
    "Instance",
    "Matcher",
    "Member",
    "PredicateIndex",
    "add_bucket",
    "add_member",
    "copy_state",
    "drop_bucket",
    "drop_member",
    "first",
    "freeze",
    "rekey_bucket",
    "shared_strings",
]
