"""Removed client caches remembered apart from everything else: a table of tombstones that
holds no Python object per tombstone.

A removed cache's tombstone (its key, the removal's version, the time it may be forgotten) is
kept for the cache's timeout, up to an hour or more. Kept as a str, a tuple, an int and a
float each, the tombstones are allocated among the removed caches' freed objects, and a few
survivors per page (or per allocator arena) keep the whole page from going back to the
system: 10,000 removed caches kept their tens of megabytes resident. Here every tombstone
lives in a few flat buffers instead (the keys' and tags' bytes in one `bytearray`, numbers in
`array`s), which grow and are freed as whole blocks of their own.

Lookup is an open-addressing table of entry numbers keyed by the key's hash (linear probing);
a removed entry leaves a mark, and the buffers are rebuilt without the dead entries once
those outnumber the live ones, so space stays proportional to what is kept. Pure: no I/O;
time is the caller's `now`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Final

__all__ = ["Tombstones"]

#: Slots of an empty table (a power of two).
_MIN_SLOTS: Final = 16
_EMPTY: Final = -1
_DELETED: Final = -2


class Tombstones:
    """Key → (version µs, version tag, until), with no object per entry.

    >>> t = Tombstones()
    >>> t.put("alice/phone", 5, "r1", until=100.0)
    >>> t.get("alice/phone"), len(t), "alice/phone" in t
    ((5, 'r1'), 1, True)
    >>> t.expire(now=101.0), len(t)
    (1, 0)
    """

    __slots__ = ("_blob", "_start", "_key_len", "_tag_len", "_us", "_until", "_slots", "_live")

    def __init__(self) -> None:
        self._blob = bytearray()
        self._start = array("q")
        self._key_len = array("q")  # -1: a removed entry
        self._tag_len = array("q")
        self._us = array("q")
        self._until = array("d")
        self._slots = array("q", [_EMPTY]) * _MIN_SLOTS
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def __bool__(self) -> bool:
        return self._live > 0

    def __contains__(self, key: object) -> bool:
        return type(key) is str and self._find(key)[1] >= 0

    def _key_at(self, i: int) -> bytes:
        start = self._start[i]
        return bytes(self._blob[start : start + self._key_len[i]])

    def _find(self, key: str) -> tuple[int, int]:
        """(slot, entry) of *key*; entry -1 when absent, slot then the first free one seen."""
        data = key.encode()
        slots = self._slots
        mask = len(slots) - 1
        s = hash(key) & mask
        free = -1
        while True:
            i = slots[s]
            if i == _EMPTY:
                return (s if free < 0 else free), -1
            if i == _DELETED:
                if free < 0:
                    free = s
            elif self._key_len[i] == len(data) and self._key_at(i) == data:
                return s, i
            s = (s + 1) & mask

    def get(self, key: str) -> tuple[int, str] | None:
        """The version *key* was removed at, or None."""
        i = self._find(key)[1]
        if i < 0:
            return None
        end = self._start[i] + self._key_len[i]
        return self._us[i], self._blob[end : end + self._tag_len[i]].decode()

    def put(self, key: str, us: int, tag: str, *, until: float) -> None:
        """Remember *key* removed at version (*us*, *tag*) until *until* (replacing any)."""
        self.pop(key)
        if (len(self._start) + 1) * 2 > len(self._slots):
            self._rebuild(extra=1)
        s, _ = self._find(key)
        i = len(self._start)
        data, tag_data = key.encode(), tag.encode()
        self._start.append(len(self._blob))
        self._blob += data
        self._blob += tag_data
        self._key_len.append(len(data))
        self._tag_len.append(len(tag_data))
        self._us.append(us)
        self._until.append(until)
        self._slots[s] = i
        self._live += 1

    def pop(self, key: str) -> bool:
        """Forget *key*; whether it was kept."""
        s, i = self._find(key)
        if i < 0:
            return False
        self._slots[s] = _DELETED
        self._key_len[i] = -1
        self._live -= 1
        self._maybe_compact()
        return True

    def oldest(self) -> str | None:
        """The key forgotten first (the earliest *until*), or None when empty."""
        best, key = -1, None
        for i in range(len(self._start)):
            if self._key_len[i] >= 0 and (best < 0 or self._until[i] < self._until[best]):
                best = i
        if best >= 0:
            key = self._key_at(best).decode()
        return key

    def expire(self, now: float) -> int:
        """Forget the tombstones whose *until* is before *now*; how many went."""
        gone = 0
        for i in range(len(self._start)):
            if self._key_len[i] >= 0 and self._until[i] < now:
                self._key_len[i] = -1
                gone += 1
        if gone:
            self._live -= gone
            self._rebuild()
        return gone

    def items(self) -> Iterator[tuple[str, tuple[int, str]]]:
        """(key, version) of every tombstone kept."""
        blob = self._blob
        for i in range(len(self._start)):
            n = self._key_len[i]
            if n >= 0:
                start = self._start[i]
                yield (
                    blob[start : start + n].decode(),
                    (self._us[i], blob[start + n : start + n + self._tag_len[i]].decode()),
                )

    def _maybe_compact(self) -> None:
        dead = len(self._start) - self._live
        if dead > 64 and dead > self._live:
            self._rebuild()

    def _rebuild(self, extra: int = 0) -> None:
        """The buffers holding only the live entries, with a table sized for them. The
        buffers' objects stay (only their contents are copied): objects made anew after
        thousands of caches were removed would land among the freed caches' blocks and keep
        Python's allocator from giving their arenas back."""
        blob, start = bytes(self._blob), self._start[:]
        key_len, tag_len, us, until = (
            self._key_len[:],
            self._tag_len[:],
            self._us[:],
            self._until[:],
        )
        slots = _MIN_SLOTS
        while slots < (self._live + extra) * 2:
            slots *= 2
        for buffer in (self._blob, self._start, self._key_len, self._tag_len, self._us):
            del buffer[:]
        del self._until[:]
        del self._slots[slots:]
        self._slots[:] = array("q", [_EMPTY]) * slots  # grows in place when it must
        self._live = 0
        for i in range(len(start)):
            n = key_len[i]
            if n < 0:
                continue
            a = start[i]
            key = blob[a : a + n].decode()
            s, _ = self._find(key)
            self._slots[s] = len(self._start)
            self._start.append(len(self._blob))
            self._blob += blob[a : a + n + tag_len[i]]
            self._key_len.append(n)
            self._tag_len.append(tag_len[i])
            self._us.append(us[i])
            self._until.append(until[i])
            self._live += 1
