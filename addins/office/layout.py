"""The office's floor plan: buildings, floors, rooms, Wi-Fi access points and Bluetooth beacons,
and how strongly a radio is heard from a place (pure: no I/O, no clock).

Every floor of every building is the same 40 m × 20 m rectangle with four rooms::

    y=20 ┌──────────────────┬──────────────────┐
         │     meeting      │ canteen (B1, 0)  │
         │                  │ lounge elsewhere │
    y=10 ├──────────────────┼──────────────────┤
         │     office-1     │     office-2     │
    y=0  └──────────────────┴──────────────────┘
        x=0               x=20               x=40

A room's name is ``"<building>/<floor>/<room>"``, e.g. ``"B1/2/meeting"``. Buildings are
``"B1"``, ``"B2"``…; floors count from 0. A radio is heard only in its own building.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "Place",
    "Radio",
    "FLOOR_WIDTH",
    "FLOOR_DEPTH",
    "ROOMS",
    "room_name",
    "room_center",
    "building_name",
    "make_radios",
    "RadioModel",
    "WIFI",
    "BLUETOOTH",
]

#: Size of every floor, metres (x across, y deep).
FLOOR_WIDTH: Final = 40.0
FLOOR_DEPTH: Final = 20.0
#: Room → (x0, y0, x1, y1) on every floor; the (20, 10)-(40, 20) corner is the canteen on the
#: ground floor of the first building and a lounge elsewhere.
ROOMS: Final = {
    "office-1": (0.0, 0.0, 20.0, 10.0),
    "office-2": (20.0, 0.0, 40.0, 10.0),
    "meeting": (0.0, 10.0, 20.0, 20.0),
    "lounge": (20.0, 10.0, 40.0, 20.0),
}
CANTEEN: Final = "canteen"


@dataclass(frozen=True, slots=True, kw_only=True)
class Place:
    """A point in the office."""

    #: Building name, "B1", "B2", …
    building: str
    #: Floor number, 0 = ground floor.
    floor: int
    #: Metres from the floor's west wall (0..40).
    x: float
    #: Metres from the floor's south wall (0..20).
    y: float
    #: The room's full name, "B1/0/canteen".
    room: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Radio:
    """A fixed radio: a Wi-Fi access point or a Bluetooth beacon."""

    #: Its id as scans report it (a MAC-like string, unique in the world).
    id: str
    kind: Literal["wifi", "bluetooth"]
    #: Its advertised name (SSID, beacon name).
    name: str
    #: Where it hangs (ground truth: what a location miner should find).
    place: Place


def building_name(index: int) -> str:
    return f"B{index + 1}"


def room_name(building: str, floor: int, room: str) -> str:
    """ "B1", 0, "lounge" → "B1/0/canteen" (the first building's ground-floor lounge is the
    canteen)."""
    if room == "lounge" and building == "B1" and floor == 0:
        room = CANTEEN
    return f"{building}/{floor}/{room}"


def room_center(room: str) -> tuple[float, float]:
    kind = room.rsplit("/", 1)[1]
    x0, y0, x1, y1 = ROOMS["lounge" if kind == CANTEEN else kind]
    return (x0 + x1) / 2, (y0 + y1) / 2


def place_in(building: str, floor: int, room: str, dx: float = 0.0, dy: float = 0.0) -> Place:
    """A place in *room* ("office-1", "meeting", …), *dx*/*dy* metres from its centre."""
    full = room_name(building, floor, room)
    cx, cy = room_center(full)
    return Place(
        building=building, floor=floor, x=round(cx + dx, 2), y=round(cy + dy, 2), room=full
    )


def make_radios(
    rng: random.Random, *, buildings: int, floors: int, aps_per_floor: int, beacons_per_floor: int
) -> tuple[list[Radio], list[Radio]]:
    """Access points spread over each floor in a grid, beacons one per room from the meeting
    room on; each placed up to 2 m from its nominal spot (seeded)."""
    aps: list[Radio] = []
    beacons: list[Radio] = []
    cols = max(1, math.ceil(math.sqrt(aps_per_floor * 2)))
    rows = max(1, math.ceil(aps_per_floor / cols))
    beacon_rooms = ["meeting", "lounge", "office-1", "office-2"]
    for b in range(buildings):
        bname = building_name(b)
        for f in range(floors):
            for i in range(aps_per_floor):
                col, row = i % cols, i // cols
                x = FLOOR_WIDTH * (col + 0.5) / cols + rng.uniform(-2, 2)
                y = FLOOR_DEPTH * (row + 0.5) / rows + rng.uniform(-2, 2)
                x, y = min(max(x, 0.5), FLOOR_WIDTH - 0.5), min(max(y, 0.5), FLOOR_DEPTH - 0.5)
                room = _room_at(x, y)
                aps.append(
                    Radio(
                        id=f"02:a0:{b:02x}:{f:02x}:00:{i:02x}",
                        kind="wifi",
                        name=f"office-{bname}",
                        place=Place(
                            building=bname,
                            floor=f,
                            x=round(x, 2),
                            y=round(y, 2),
                            room=room_name(bname, f, room),
                        ),
                    )
                )
            for i in range(beacons_per_floor):
                room = beacon_rooms[i % len(beacon_rooms)]
                p = place_in(bname, f, room, rng.uniform(-2, 2), rng.uniform(-2, 2))
                beacons.append(
                    Radio(
                        id=f"02:b0:{b:02x}:{f:02x}:00:{i:02x}",
                        kind="bluetooth",
                        name=f"beacon-{p.room.replace('/', '-')}",
                        place=p,
                    )
                )
    return aps, beacons


def _room_at(x: float, y: float) -> str:
    for name, (x0, y0, x1, y1) in ROOMS.items():
        if x0 <= x < x1 and y0 <= y < y1:
            return name
    return "lounge"


@dataclass(frozen=True, slots=True, kw_only=True)
class RadioModel:
    """Log-distance path loss: rssi = at_1m − 10·exponent·log10(d) − floor_loss·Δfloors,
    plus Gaussian noise of `noise` dB; heard when at or above `threshold`."""

    #: dBm heard at one metre.
    at_1m: float
    exponent: float
    #: dB lost per floor between radio and listener.
    floor_loss: float
    #: Weakest dBm a scan reports.
    threshold: float
    #: Standard deviation of the per-scan noise, dB.
    noise: float

    def base_rssi(self, radio: Place, listener: Place) -> float | None:
        """The noiseless signal, or None when it is out of reach even with noise (other
        building, or 3 σ under the threshold)."""
        if radio.building != listener.building:
            return None
        d = math.hypot(radio.x - listener.x, radio.y - listener.y)
        dz = abs(radio.floor - listener.floor)
        d = math.sqrt(d * d + (3.0 * dz) ** 2)  # 3 m per storey
        rssi = self.at_1m - 10 * self.exponent * math.log10(max(d, 1.0)) - self.floor_loss * dz
        return rssi if rssi >= self.threshold - 3 * self.noise else None


#: Wi-Fi: strong, far-reaching, one floor of concrete costs 15 dB.
WIFI: Final = RadioModel(at_1m=-40.0, exponent=3.0, floor_loss=15.0, threshold=-90.0, noise=4.0)
#: Bluetooth beacons: weak, a room or two.
BLUETOOTH: Final = RadioModel(
    at_1m=-59.0, exponent=2.2, floor_loss=20.0, threshold=-92.0, noise=3.0
)
