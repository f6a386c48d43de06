"""Giving back the tables of dicts that grew for many caches once most of them went.

A dict never shrinks its table when keys are deleted: one sized for 10,000 client caches
keeps its few hundred kilobytes when they are all gone, and the router keeps a dozen such
dicts per cache (the caches, their groups, specs, versions, tombstones, the index). `shrunk`
gives such a dict a table sized for what it holds, so the old table is freed; callers assign
its result back after deleting. It keeps the dict object itself (only its table is made
anew, none at all when it is empty): a new object made after thousands of caches were freed
lands among their freed blocks, and one live object there keeps Python's allocator from
giving a whole arena back. Checking costs one
`sys.getsizeof` (O(1)); a copy happens only after the dict lost most of its entries since it
was last copied, so copying is amortised O(1) per deletion.
"""

from __future__ import annotations

import sys
from typing import Final, TypeVar

__all__ = ["shrunk"]

K = TypeVar("K")
V = TypeVar("V")

#: A dict whose table is smaller than this is left alone: copying would give back little.
MIN_TABLE_BYTES: Final = 16 * 1024
#: Bytes of table per entry past which a dict is copied. A dict sized for its entries
#: takes 30 to 90 bytes per entry (index, hash, key and value slots, two-thirds load).
MAX_BYTES_PER_ENTRY: Final = 400


def shrunk(d: dict[K, V]) -> dict[K, V]:
    """*d*, with a table for its size when most of its table was empty."""
    size = sys.getsizeof(d)
    if size < MIN_TABLE_BYTES or size < MAX_BYTES_PER_ENTRY * len(d):
        return d
    items = list(d.items())
    d.clear()  # back to the shared empty table
    d.update(items)
    return d
