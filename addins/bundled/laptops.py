"""Bundled add-in: the office laptops' Wi-Fi and Bluetooth scans (``wifi-scan``, ``bt-scan``:
Node, Radios [{Id, Name, Rssi}]), from the simulated office world."""

from __future__ import annotations

from aa.addins.office import WorldPublisher

SETTINGS = {"seed": 0, "speed": 1.0, "tick": 1.0, "people": 12}


class Laptops(WorldPublisher):
    kinds = frozenset({"wifi-scan", "bt-scan"})
    node_prefix = "laptop-"
