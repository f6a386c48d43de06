"""Bundled add-in: the office phones' positions and scans (``position``: Node, Building, Floor,
X, Y; ``wifi-scan`` and ``bt-scan``), from the simulated office world."""

from __future__ import annotations

from aa.addins.office import WorldPublisher

SETTINGS = {"seed": 0, "speed": 1.0, "tick": 1.0, "people": 12}


class Phones(WorldPublisher):
    kinds = frozenset({"position", "wifi-scan", "bt-scan"})
    node_prefix = "phone-"
