"""Anti-entropy, sans I/O: the digests, comparisons and bounds that the store's sync
(`aa.router.store.sync`) and the client caches' sync (`aa.router.caches.sync`) share. No
socket, no asyncio, no clock: callers pass `now` in and send what these functions return.

A *digest* maps a bucket key (a (type, hour) of the store, a client cache) to (number of
ids, XOR of a 64-bit hash of each id). Two replicas that hold the same ids in a bucket have
the same entry; a differing entry names a bucket whose ids the two then exchange. XOR makes a
digest order-free and cheap to update, and 64 bits make a false "equal" (two different sets
with the same count and hash) negligible for the sizes at hand.

Bounds (a peer, or on an open mesh a stranger, sends these messages): a digest with more
entries than the caller's cap, an id list longer than its cap, or a malformed entry is
refused whole with `UsageError` — nothing of it is kept, and the work it causes is at most
one comparison of that capped size. `Exchanges` lets each peer have one exchange under way
at a time (an exchange scans a store or the caches): more messages meanwhile are dropped, not
queued, and a slot whose work never ended frees itself after `EXCHANGE_TIMEOUT`.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

from aa.mesh import UsageError

__all__ = [
    "EXCHANGE_TIMEOUT",
    "Exchanges",
    "chunks",
    "differing",
    "digest_entries",
    "ids_digest",
    "id_hash",
    "parse_digest",
    "parse_ids",
    "parse_slice",
    "in_slice",
    "slices_for",
    "MAX_SLICES",
    "IdHashes",
    "id_parts",
    "parse_id_parts",
]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

#: Seconds after which a peer's exchange slot is free again even if its work never ended (a
#: store read that hangs): long enough for a scan of a large store on a loaded machine.
EXCHANGE_TIMEOUT: Final = 120.0
#: Most slices a bucket's ids are cut into (`slices_for`): a million ids in slices of 1,000.
MAX_SLICES: Final = 1024


def id_hash(eid: str) -> int:
    """A 64-bit hash of an event id, the same on every router (not Python's `hash`)."""
    return int.from_bytes(hashlib.blake2b(eid.encode(), digest_size=8).digest(), "big")


class IdHashes:
    """`id_hash`, remembered for ids seen before: a store's exchanges hash the same ids again
    and again (every digest, every slice), ~1 µs each. At most *limit* are kept; past it the
    memory starts afresh. Safe to call from worker threads (dict operations)."""

    __slots__ = ("_known", "limit")

    def __init__(self, limit: int = 1 << 18) -> None:
        self._known: dict[str, int] = {}
        self.limit = limit

    def __call__(self, eid: str) -> int:
        h = self._known.get(eid)
        if h is None:
            if len(self._known) >= self.limit:
                self._known = {}
            h = self._known[eid] = id_hash(eid)
        return h


def ids_digest(
    items: Iterable[tuple[K, str]], hash: Callable[[str], int] = id_hash
) -> dict[K, tuple[int, int]]:
    """Per bucket key: (count, XOR of the ids' hashes) of the (key, id) *items*."""
    out: dict[K, list[int]] = defaultdict(lambda: [0, 0])
    for key, eid in items:
        entry = out[key]
        entry[0] += 1
        entry[1] ^= hash(eid)
    return {k: (c, x) for k, (c, x) in out.items()}


def differing(mine: Mapping[K, tuple[int, int]], theirs: Mapping[K, tuple[int, int]]) -> set[K]:
    """Keys whose entries differ, or that only one side has."""
    return {k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)}


def parse_digest(
    entries: Any, key_of: Callable[[Sequence[Any]], K], *, max_entries: int
) -> dict[K, tuple[int, int]]:
    """A digest from the wire: a list of ``[*key, count, "xor in hex"]``, where *key_of*
    reads a key from the leading fields (raising `UsageError`, `TypeError` or `ValueError`
    on a bad one). Raises `UsageError` for more than *max_entries* entries or a bad entry."""
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise UsageError("a digest is a list")
    if len(entries) > max_entries:
        raise UsageError(f"a digest of {len(entries)} entries (at most {max_entries})")
    out: dict[K, tuple[int, int]] = {}
    try:
        for entry in entries:
            if not isinstance(entry, list) or len(entry) < 3:
                raise UsageError("a digest entry is [*key, count, xor]")
            count, xor = entry[-2], entry[-1]
            if type(count) is not int or count < 0 or type(xor) is not str or len(xor) > 16:
                raise UsageError("a digest entry's count is an int, its xor 16 hex digits")
            out[key_of(entry[:-2])] = (count, int(xor, 16))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"a bad digest entry: {exc}") from exc
    return out


def digest_entries(
    digest: Mapping[K, tuple[int, int]], key_fields: Callable[[K], list[Any]]
) -> list[list[Any]]:
    """*digest* as the wire list `parse_digest` reads."""
    return [[*key_fields(k), c, f"{x:016x}"] for k, (c, x) in digest.items()]


def slices_for(n: int, max_ids: int) -> int:
    """Slices to cut *n* ids into so that one holds about *max_ids* at most.

    A bucket of more ids than one message carries is compared a slice at a time: the ids
    whose `id_hash` is *j* modulo *k*, on both sides alike. Sending only its first ids would
    make the peer send back every event of the bucket but those, most of them held already,
    round after round."""
    return min(MAX_SLICES, max(1, -(-n // max_ids)))


def in_slice(ids: Iterable[str], k: int, j: int, hash: Callable[[str], int] = id_hash) -> list[str]:
    """The *ids* of slice *j* of *k* (all of them when *k* is 1)."""
    if k == 1:
        return list(ids)
    return [eid for eid in ids if hash(eid) % k == j]


def parse_slice(value: Any) -> tuple[int, int]:
    """A slice from the wire, ``[k, j]`` (absent: the whole bucket, ``(1, 0)``). Raises
    `UsageError` unless 1 ≤ k ≤ `MAX_SLICES` and 0 ≤ j < k."""
    if value is None:
        return (1, 0)
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(type(v) is int for v in value)
        or not 1 <= value[0] <= MAX_SLICES
        or not 0 <= value[1] < value[0]
    ):
        raise UsageError(f"a slice is [k, j] with 1 <= k <= {MAX_SLICES} and 0 <= j < k")
    return (value[0], value[1])


def id_parts(ids: Sequence[str], part: int) -> list[str] | list[list[str]]:
    """*ids* for the wire: as they are, or in lists of at most *part* (a peer link decodes
    at most 65,536 items per list, `aa.router.links.MAX_PEER_FRAME_ITEMS`)."""
    if len(ids) <= part:
        return list(ids)
    return [list(ids[i : i + part]) for i in range(0, len(ids), part)]


def parse_id_parts(value: Any, *, max_ids: int, part: int) -> list[str]:
    """The ids of `id_parts`' wire form: one list of ids, or lists of at most *part* ids.
    Raises `UsageError` past *max_ids* in all, or for anything else."""
    if isinstance(value, list) and value and all(type(v) is list for v in value):
        if len(value) > -(-max_ids // part) or any(len(v) > part for v in value):
            raise UsageError(f"id lists hold at most {part} ids each, {max_ids} in all")
        value = [i for v in value for i in v]
    return parse_ids(value, max_ids=max_ids)


def parse_ids(value: Any, *, max_ids: int) -> list[str]:
    """An id list from the wire. Raises `UsageError` past *max_ids* or for a non-string."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > max_ids:
        raise UsageError(f"an id list is a list of at most {max_ids} ids")
    if not all(type(i) is str for i in value):
        raise UsageError("an id is a string")
    return value


def chunks(items: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    """*items* in slices of at most *size*."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Exchanges:
    """Which peers have an exchange under way (one each; see the module docstring).

    >>> ex = Exchanges()
    >>> ex.begin("b", now=0.0), ex.begin("b", now=1.0), ex.begin("b", now=EXCHANGE_TIMEOUT + 1)
    (True, False, True)
    """

    __slots__ = ("_since", "timeout")

    def __init__(self, *, timeout: float = EXCHANGE_TIMEOUT) -> None:
        self._since: dict[str, float] = {}
        self.timeout = timeout

    def begin(self, peer: str, now: float) -> bool:
        """Take *peer*'s slot; False (drop the message) when an exchange is under way."""
        since = self._since.get(peer)
        if since is not None and now - since < self.timeout:
            return False
        self._since[peer] = now
        return True

    def end(self, peer: str) -> None:
        self._since.pop(peer, None)

    def prune(self, now: float) -> None:
        """Forget slots that have freed themselves by time."""
        for peer in [p for p, since in self._since.items() if now - since >= self.timeout]:
            del self._since[peer]

    def __contains__(self, peer: object) -> bool:
        return peer in self._since
