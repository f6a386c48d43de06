"""The presence adapter: publishes which nodes are together, from their radio scans, with
the window, distance threshold, homes and rooms mined from the logs
(`aa.tools.mining.presence`), by the rule the mining used.

Per node, the scan fingerprint of the current window (mean dBm per radio); on each scan, the
node's fingerprint is compared with the other nodes' of the same window (RMS difference in
dB over the union of radios, an unheard radio counting as the floor; at least `min_common`
radios in common). Each node is at home (its fingerprint within ``home_threshold_db`` of
the home the mining learned for it) or away, and two nodes are together only if both are
at home or both away: both at home, when the mining put their desks in one room (or, if it
placed either desk in none, when their distance is within the threshold); both away, when
their distance is within the threshold. A node the mining did not know is always away; an
artefact without homes (``home_threshold_db`` 0 or absent) decides by distance alone. A
presence event is published when a node's company changes (not on every scan)::

    presence {"Node": str, "With": [node, ...], "Window": datetime (the window's start)}

Time is the scan's ``time`` stamp (set by its router), else the *now* passed in: tests and
replays move it. Nodes whose fingerprint is older than the previous window are forgotten,
and at most `MAX_NODES` are tracked.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Any, Final

from aa.mesh import Event

from .artefact import Artefact
from .base import Adapter, Output

__all__ = ["PresenceAdapter", "PRESENCE_TYPE", "MAX_NODES", "fingerprint_distance"]

log = logging.getLogger("aa.addins.adapters")

#: Type of the events published.
PRESENCE_TYPE: Final = "presence"
#: Nodes tracked at most: every scanning node costs a fingerprint; a mesh of phones could
#: otherwise grow it without bound. 10,000 nodes × ~20 radios is a few MB.
MAX_NODES: Final = 10_000


def fingerprint_distance(
    a: dict[str, float], b: dict[str, float], floor_dbm: float
) -> tuple[float, int]:
    """(RMS dB difference over the union of radios, radios in common)."""
    keys = a.keys() | b.keys()
    if not keys:
        return math.inf, 0
    common = len(a.keys() & b.keys())
    s = sum((a.get(k, floor_dbm) - b.get(k, floor_dbm)) ** 2 for k in keys)
    return math.sqrt(s / len(keys)), common


class PresenceAdapter(Adapter):
    """Radio scans → presence events."""

    task = "presence"
    name = "presence"

    def __init__(self, adapters: Any) -> None:
        super().__init__(adapters)
        self.window_seconds = 300
        self.threshold_db = 8.0
        self.floor_dbm = -95.0
        self.min_common = 2
        self.scan_types: set[str] = set()
        self.home_threshold_db = 0.0
        self.homes: dict[str, dict[str, float]] = {}
        self.rooms: dict[str, str] = {}
        self.node_attr = "Node"
        self.radios_attr = "Radios"
        self._fp: dict[
            str, tuple[int, dict[str, list[float]]]
        ] = {}  # node → (window, radio → [sum, n])
        self._company: dict[str, tuple[str, ...]] = {}

    def input_types(self) -> set[str]:
        return set(self.scan_types)

    def _load(self, artefact: Artefact) -> None:
        d = artefact.data
        self.window_seconds = int(d["window_seconds"])
        self.threshold_db = float(d["threshold_db"])
        self.floor_dbm = float(d["floor_dbm"])
        self.min_common = int(d["min_common"])
        self.scan_types = set(d.get("scan_types", ()))
        self.home_threshold_db = float(d.get("home_threshold_db") or 0.0)
        homes, rooms = d.get("homes") or {}, d.get("rooms") or {}
        self.homes = {
            node: {r: float(v) for r, v in fp.items() if type(v) in (int, float)}
            for node, fp in (homes.items() if isinstance(homes, dict) else ())
            if isinstance(fp, dict)
        }
        self.rooms = {
            node: room
            for node, room in (rooms.items() if isinstance(rooms, dict) else ())
            if type(room) is str
        }
        attrs = d.get("attributes", {})
        self.node_attr = attrs.get("node", "Node")
        self.radios_attr = attrs.get("radios", "Radios")

    def _fingerprint(self, node: str) -> dict[str, float]:
        return {r: s / n for r, (s, n) in self._fp[node][1].items()}

    def _handle(self, event: Event, now: float | None) -> list[Output]:
        if event.type not in self.scan_types:
            return []
        node, radios = event.values.get(self.node_attr), event.values.get(self.radios_attr)
        stamp = event.meta.get("time")
        t = stamp.timestamp() if isinstance(stamp, datetime) else now
        if type(node) is not str or type(radios) is not list or t is None:
            return []
        w = math.floor(t / self.window_seconds)
        entry = self._fp.get(node)
        if entry is None or entry[0] != w:
            if entry is None and len(self._fp) >= MAX_NODES:
                self._forget(w)
                if len(self._fp) >= MAX_NODES:
                    log.warning(
                        "presence adapter: tracking %d nodes already; %s ignored", MAX_NODES, node
                    )
                    return []
            entry = self._fp[node] = (w, {})
        for r in radios:
            if type(r) is not dict:
                continue
            rid, rssi = r.get("Id"), r.get("Rssi")
            if type(rid) is str and (type(rssi) is int or type(rssi) is float):
                acc = entry[1].setdefault(rid, [0.0, 0])
                acc[0] += rssi
                acc[1] += 1
        mine = self._fingerprint(node)
        home = self._at_home(node, mine)
        room = self.rooms.get(node) if home else None
        near = []
        for other, (ow, _) in self._fp.items():
            if other == node or ow != w:
                continue
            theirs = self._fingerprint(other)
            if self._at_home(other, theirs) != home:
                continue  # one at their desk, the other away: not together, however near
            d, common = fingerprint_distance(mine, theirs, self.floor_dbm)
            if common < self.min_common:
                continue
            other_room = self.rooms.get(other) if home else None
            if room is not None and other_room is not None:
                if room == other_room:
                    near.append(other)
            elif d <= self.threshold_db:
                near.append(other)
        company = tuple(sorted(near))
        if self._company.get(node) == company:
            return []
        self._company[node] = company
        start = datetime.fromtimestamp(w * self.window_seconds, UTC)
        return [(PRESENCE_TYPE, {"Node": node, "With": list(company), "Window": start})]

    def _at_home(self, node: str, fp: dict[str, float]) -> bool:
        home = self.homes.get(node)
        if home is None or self.home_threshold_db <= 0:
            return False
        return fingerprint_distance(fp, home, self.floor_dbm)[0] <= self.home_threshold_db

    def _forget(self, window: int) -> None:
        for node in [n for n, (w, _) in self._fp.items() if w < window - 1]:
            del self._fp[node]
            self._company.pop(node, None)
