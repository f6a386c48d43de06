"""The persisted topology: known routers and their poison state, in a JSON file.

Å §4.1: "Mesh topology information is periodically persisted to disk so the router can quickly
reintegrate into the mesh should it restart." A router (or a client) saves its `PeerTable`
now and then and loads it at start. The file is small and written atomically (a temporary
file in the same folder, then `os.replace`), so a crash leaves the old file or the new one,
never half of one. A missing, unreadable or corrupt file is logged and the table starts empty:
the mesh is found again by discovery, only more slowly.

Times in the file are wall-clock (seconds since the epoch), since monotonic time means nothing
after a restart; they are converted on load. Blocking file I/O: call from a thread
(`asyncio.to_thread`) in an event loop.

Format 1::

    {"format": 1, "saved_at": 1790000000.0,
     "routers": [{"address": "10.0.0.2:7447", "router_id": "…" | null, "source": "discovered",
                  "failures": 2, "next_attempt": 1790000030.0, "last_useful": 1789990000.0}]}
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Final

from .endpoints import parse_endpoint
from .errors import InvalidValue
from .event import MAX_ID_LENGTH
from .peers import PeerEntry, PeerState, PeerTable, Source

__all__ = [
    "save_topology",
    "load_topology",
    "TOPOLOGY_FILE",
    "TOPOLOGY_FORMAT",
    "MAX_TOPOLOGY_BYTES",
]

log = logging.getLogger(__name__)

#: The file's name in a data folder.
TOPOLOGY_FILE: Final = "topology.json"
#: Version of the file's layout; a file of another version is ignored (and overwritten).
TOPOLOGY_FORMAT: Final = 1
#: Largest file read, in bytes: a full table (1024 entries of ~200 bytes) is ~200 KB, so a
#: bigger file is not ours and is not worth reading into memory.
MAX_TOPOLOGY_BYTES: Final = 4 * 1024 * 1024
#: Most failures kept per entry on load: enough to reach the longest back-off.
_MAX_FAILURES: Final = 64


def save_topology(
    path: str | os.PathLike[str], table: PeerTable, *, now: float, wall_now: float
) -> None:
    """Write *table* to *path* atomically. *now* is monotonic time, *wall_now* wall-clock time
    (`time.time()`) at the same instant. Raises `OSError` if the folder cannot be written."""
    path = Path(path)
    routers = []
    for e in table:
        failures = e.failures
        if e.connected_since is not None and now - e.connected_since >= table.stable_after:
            failures = 0  # a stable link forgives, as the table itself would
        connected = e.state is PeerState.CONNECTED or e.state is PeerState.CONNECTING
        routers.append(
            {
                "address": e.address,
                "router_id": e.router_id,
                "source": e.source.value,
                "failures": failures,
                # Connected now: dial it first thing after a restart.
                "next_attempt": wall_now if connected else wall_now + (e.next_attempt - now),
                "last_useful": wall_now + (e.last_useful - now),
            }
        )
    data = {"format": TOPOLOGY_FORMAT, "saved_at": wall_now, "routers": routers}
    text = json.dumps(data, indent=1)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_topology(
    path: str | os.PathLike[str], table: PeerTable, *, now: float, wall_now: float
) -> int:
    """Put the entries saved in *path* into *table*; returns how many were restored.

    Never raises for a bad file: a missing one is normal at first start; an unreadable,
    corrupt or foreign one is logged as a warning and ignored, and so is each bad entry.
    Saved times are converted to monotonic time; a next attempt never lies more than the
    table's `retry_max` ahead (the wall clock may have been set back). Routers of no use for
    the table's `forget_after` are not restored: a router stopped long ago is not dialled
    again at every start.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOPOLOGY_BYTES + 1)
    except FileNotFoundError:
        log.debug("no topology file at %s: starting with an empty peer table", path)
        return 0
    except OSError as exc:
        log.warning(
            "cannot read topology file %s (%s): starting with an empty peer table", path, exc
        )
        return 0
    if len(raw) > MAX_TOPOLOGY_BYTES:
        log.warning("topology file %s is over %d bytes: ignored", path, MAX_TOPOLOGY_BYTES)
        return 0
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        log.warning("topology file %s is corrupt (%s): ignored", path, exc)
        return 0
    if (
        type(data) is not dict
        or data.get("format") != TOPOLOGY_FORMAT
        or type(data.get("routers")) is not list
    ):
        log.warning("topology file %s is not format %d: ignored", path, TOPOLOGY_FORMAT)
        return 0
    restored = bad = stale = 0
    # The file lists the least useful first; `restore` puts each entry in front of what the
    # table knows, so going backwards keeps the file's order.
    for item in reversed(data["routers"]):
        try:
            entry = _entry(item, table, now=now, wall_now=wall_now)
        except (InvalidValue, KeyError, TypeError, ValueError):
            bad += 1
            continue
        if now - entry.last_useful >= table.forget_after:
            stale += 1
            continue
        restored += table.restore(entry)
    if bad:
        log.warning("topology file %s: %d bad entries ignored", path, bad)
    if stale:
        log.info(
            "topology file %s: %d router(s) of no use for %g s forgotten",
            path,
            stale,
            table.forget_after,
        )
    return restored


def _entry(item: Any, table: PeerTable, *, now: float, wall_now: float) -> PeerEntry:
    if type(item) is not dict:
        raise TypeError("entry is not a map")
    address = item["address"]
    parse_endpoint(address)
    router_id = item.get("router_id")
    if router_id is not None and (
        type(router_id) is not str or not 0 < len(router_id) <= MAX_ID_LENGTH
    ):
        raise ValueError("bad router id")
    Source(item.get("source", "persisted"))  # ValueError when not a source we know
    failures = item.get("failures", 0)
    if type(failures) is not int or failures < 0:
        raise ValueError("bad failures")
    next_wall = _number(item.get("next_attempt", wall_now))
    useful_wall = _number(item.get("last_useful", wall_now))
    next_attempt = min(max(now, now + (next_wall - wall_now)), now + table.retry_max)
    return PeerEntry(
        address=address,
        # Whatever it was when saved, it is hearsay now: only today's configuration makes an
        # address configured (the owner adds those again at start).
        source=Source.PERSISTED,
        router_id=router_id,
        failures=min(failures, _MAX_FAILURES),
        next_attempt=next_attempt,
        last_useful=min(now, now + (useful_wall - wall_now)),
    )


def _number(value: Any) -> float:
    if type(value) not in (int, float) or value != value or value in (float("inf"), float("-inf")):
        raise ValueError("bad time")
    return float(value)
