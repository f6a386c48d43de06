"""The posting lists of the predicate index (`predicate_index.py`): which entries a key holds.

An entry is one conjunction of one bucket; a posting is the entries filed under one key
(an equality's constant, an interval's cell, a prefix): one entry alone, a list of a few, or
an ordered set (dict) of more, so that a million narrow subscriptions, most alone under
their key, cost no container each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..predicates import Access
    from .buckets import Bucket

__all__ = ["Entry", "Posting", "MAX_LIST_POSTING", "post", "unpost", "posting_size"]

#: A posting list: one entry, a list of a few, or an ordered set (dict) of more. Memory:
#: most postings hold one or a few entries, and a dict of two costs 224 bytes, a list 72.
Posting = Any
#: Longest posting kept as a list (removal scans it); past this, a dict.
MAX_LIST_POSTING = 16


class Entry:
    """One conjunction of one bucket: its checks left (`rest`, flat), or None when a hit
    means evaluating the whole pattern of the bucket; and the access it is filed under (an
    `Access`'s kind, src and keys, kind None on the scan list), kept here rather than as an
    object of its own: a million subscriptions hold a million objects fewer for the
    collector to walk. The index files an entry by these."""

    __slots__ = ("bucket", "rest", "kind", "src", "keys")
    kind: Any
    src: Any
    keys: Any

    def __init__(self, bucket: Bucket, rest: tuple[Any, ...] | None, access: Access | None) -> None:
        self.bucket = bucket
        self.rest = rest
        if access is None:
            self.kind = self.src = self.keys = None
        else:
            self.kind, self.src, self.keys = access.kind, access.src, access.keys

    def __lt__(self, other: Entry) -> bool:
        """Orders range bounds that tie on (bound, flag) in a sorted list: any fixed order."""
        return id(self) < id(other)


def post(table: dict[Any, Posting], key: Any, entry: Entry) -> None:
    old = table.get(key)
    if old is None:
        table[key] = entry
    elif type(old) is Entry:
        table[key] = [old, entry]
    elif type(old) is list:
        if len(old) < MAX_LIST_POSTING:
            old.append(entry)
        else:
            table[key] = dict.fromkeys(old)
            table[key][entry] = None
    else:
        old[entry] = None


def unpost(table: dict[Any, Posting], key: Any, entry: Entry) -> None:
    old = table.get(key)
    if old is entry:
        del table[key]
    elif type(old) is list:
        if entry in old:
            old.remove(entry)
            if len(old) == 1:
                table[key] = old[0]
    elif old is not None and type(old) is not Entry:
        old.pop(entry, None)
        if not old:
            del table[key]


def posting_size(posting: Posting) -> int:
    return 0 if posting is None else 1 if type(posting) is Entry else len(posting)
