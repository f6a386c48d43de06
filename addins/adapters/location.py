"""The location adapter: turns radio scans into location events with the mined radio →
place table (`aa.tools.mining.location`).

For a scan ``{Node, Radios: [{Id, Rssi}, ...]}``: each known radio votes for its building and
floor with weight confidence × received power (10^(dBm/10), relative to −40 dBm), so the
loudest radios decide; the floor with most weight wins, and the position is the weighted
mean of that floor's radios' places. Published::

    location {"Node": str, "Building": str, "Floor": int, "X": float, "Y": float,
              "Confidence": float (the winning floor's share of the weight), "Radios": int}
"""

from __future__ import annotations

from typing import Any

from aa.mesh import Event

from .artefact import Artefact
from .base import Adapter, Output

__all__ = ["LocationAdapter", "LOCATION_TYPE"]

#: Type of the events published.
LOCATION_TYPE = "location"


class LocationAdapter(Adapter):
    """Radio scans → location events."""

    task = "location"
    name = "location"

    def __init__(self, adapters: Any, *, min_radio_confidence: float = 0.5) -> None:
        super().__init__(adapters)
        self.min_radio_confidence = min_radio_confidence
        self.radios: dict[str, tuple[str, int, float, float, float]] = {}  # id → (b, f, x, y, conf)
        self.scan_types: set[str] = set()
        self.node_attr = "Node"
        self.radios_attr = "Radios"

    def input_types(self) -> set[str]:
        return set(self.scan_types)

    def _load(self, artefact: Artefact) -> None:
        data = artefact.data
        radios = {}
        for rid, r in dict(data["radios"]).items():
            if float(r["confidence"]) >= self.min_radio_confidence:
                radios[str(rid)] = (
                    str(r["building"]),
                    int(r["floor"]),
                    float(r["x"]),
                    float(r["y"]),
                    float(r["confidence"]),
                )
        attrs = data.get("attributes", {})
        self.radios = radios
        self.scan_types = set(data.get("scan_types", ()))
        self.node_attr = attrs.get("node", "Node")
        self.radios_attr = attrs.get("radios", "Radios")

    def locate(self, heard: list[tuple[str, float]]) -> dict[str, Any] | None:
        """Where a node that heard *heard* [(radio id, dBm)] is, or None if no radio is known."""
        floors: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        total = 0.0
        for rid, rssi in heard:
            known = self.radios.get(rid)
            if known is None:
                continue
            b, f, x, y, conf = known
            w = conf * 10.0 ** ((rssi + 40.0) / 10.0)
            floors.setdefault((b, f), []).append((w, x, y))
            total += w
        if not floors or total <= 0:
            return None
        (b, f), votes = max(floors.items(), key=lambda kv: sum(v[0] for v in kv[1]))
        w = sum(v[0] for v in votes)
        return {
            "Building": b,
            "Floor": f,
            "X": round(sum(v[0] * v[1] for v in votes) / w, 2),
            "Y": round(sum(v[0] * v[2] for v in votes) / w, 2),
            "Confidence": round(w / total, 4),
            "Radios": len(votes),
        }

    def _handle(self, event: Event, now: float | None) -> list[Output]:
        if event.type not in self.scan_types:
            return []
        node, radios = event.values.get(self.node_attr), event.values.get(self.radios_attr)
        if type(node) is not str or type(radios) is not list:
            return []
        heard = []
        for r in radios:
            if type(r) is not dict:
                continue
            rid, rssi = r.get("Id"), r.get("Rssi")
            if type(rid) is str and (type(rssi) is int or type(rssi) is float):
                heard.append((rid, float(rssi)))
        where = self.locate(heard)
        return [] if where is None else [(LOCATION_TYPE, {"Node": node, **where})]
