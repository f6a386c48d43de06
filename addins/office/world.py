"""A small simulated office with ground truth: what the bundled publishers report, and what a
miner (`aa mine`) should be able to find again (pure: no I/O, no clock; time is passed in).

>>> from datetime import datetime, timedelta, timezone
>>> world = OfficeWorld(seed=1)
>>> t0 = datetime(2030, 1, 7, 9, tzinfo=timezone.utc)            # a Monday, 09:00 UTC
>>> events = list(world.events(t0, t0 + timedelta(hours=1)))
>>> sorted({kind for _, kind, _ in events})
['bt-scan', 'position', 'quote', 'ticker', 'weather', 'wifi-scan']
>>> truth = world.ground_truth                  # covers what events() was asked for
>>> ("quote", "StockSymbol", "ticker", "Symbol") in truth.correspondences
True

The world
---------
`buildings` × `floors` identical floors (plan in `aa.addins.office.layout`), each with
`aps_per_floor` Wi-Fi access points and `beacons_per_floor` Bluetooth beacons, and `people`
people with a laptop and a phone each, whose days (arrival, meetings, lunch in the canteen,
leaving; Monday–Friday, UTC) are in `aa.addins.office.schedule`. The phone is always with its
owner; the laptop goes to meetings but stays on the desk over lunch (and still scans there).

Events — ``events(start, end, step=…)`` yields ``(time, type, values)``
----------------------------------------------------------------------
Times are aware UTC datetimes, in non-decreasing order; naive datetimes given are taken as
UTC. Each `step` (60 s by default, on a grid counted from the Unix epoch) every person in the
office causes, at a fixed offset of their own within the step:

=============  =================================================================================
type           values
=============  =================================================================================
``wifi-scan``  ``{"Node": str, "Radios": [{"Id": str, "Name": str, "Rssi": int}, ...]}`` — from
               the laptop (``laptop-<name>``) and from the phone (``phone-<name>``): the access
               points heard, strongest first; Rssi in dBm from the distance (log-distance
               path loss, 15 dB per floor, same building only) plus Gaussian noise (σ 4 dB),
               those under −90 dBm left out
``bt-scan``    the same shape, for the Bluetooth beacons (σ 3 dB, −92 dBm floor)
``position``   ``{"Node": "phone-<name>", "Building": "B1", "Floor": int, "X": float,
               "Y": float}`` — the phone's position in metres, with Gaussian noise (σ 1.5 m),
               kept on the floor plan
=============  =================================================================================

and, whatever the step, at fixed instants of the epoch grid:

=============  =================================================================================
``weather``    ``{"City": str, "TemperatureC": float, "Humidity": int, "Condition": str}``
               every 600 s per city (Oslo, Zurich); Condition one of clear, cloudy, rain, snow
``quote``      ``{"StockSymbol": str, "Price": float, "Currency": str}`` every 60 s per
               symbol (ABB, EQNR, NHY, TEL)
``ticker``     ``{"Symbol": str, "Last": float, "Ccy": str}`` — a second publisher of the
               same market data under another schema, 2 s after each quote, same values
=============  =================================================================================

Determinism: everything follows from the seed and the time, step by step, so a span's
events are the same whether asked for at once or in pieces on the same step grid.

Ground truth (`ground_truth`)
-----------------------------
- ``radio_place``: radio id → `Place` (building, floor, x, y, room) where it hangs.
- ``colocated``: ``(person_a, person_b, window_start)`` with ``person_a < person_b``, one per
  step window in which both people (their phones) were in the same room (``Place.room``), for
  every step window overlapping a span `events()` was asked for so far (a person's events of
  a step all come from where they were at the window's start); ``intervals()`` merges
  consecutive windows into (person_a, person_b, start, end).
- ``correspondences``: ``(type_a, attr_a, type_b, attr_b)``: quote↔ticker attributes.
- ``node_person``: node id → person name.
`ground_truth_for(start, end, step=…)` gives the same for an explicit span.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

from .layout import (
    BLUETOOTH,
    FLOOR_DEPTH,
    FLOOR_WIDTH,
    ROOMS,
    WIFI,
    Place,
    Radio,
    RadioModel,
    building_name,
    make_radios,
    place_in,
)
from .schedule import DayPlan, Person, locate, make_people, plan_day

__all__ = [
    "OfficeWorld",
    "GroundTruth",
    "Place",
    "Radio",
    "Person",
    "CORRESPONDENCES",
    "SYMBOLS",
    "CITIES",
]

#: Seconds between weather readings, per city.
WEATHER_INTERVAL: Final = 600
#: Seconds between market quotes, per symbol.
QUOTE_INTERVAL: Final = 60
#: Seconds the ticker publisher runs behind the quote publisher.
TICKER_DELAY: Final = 2
#: Symbol → (currency, base price).
SYMBOLS: Final = {
    "ABB": ("CHF", 45.0),
    "EQNR": ("NOK", 280.0),
    "NHY": ("NOK", 60.0),
    "TEL": ("NOK", 130.0),
}
#: City → mean temperature, °C.
CITIES: Final = {"Oslo": 6.0, "Zurich": 10.0}
#: The attributes of `quote` and `ticker` that carry the same data (ground truth).
CORRESPONDENCES: Final = (
    ("quote", "StockSymbol", "ticker", "Symbol"),
    ("quote", "Price", "ticker", "Last"),
    ("quote", "Currency", "ticker", "Ccy"),
)
#: The event types people's devices cause.
PEOPLE_KINDS: Final = frozenset({"wifi-scan", "bt-scan", "position"})
#: Standard deviation of reported phone positions, metres.
POSITION_NOISE: Final = 1.5
_DAY: Final = 86400
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroundTruth:
    """What really was so; see the module docstring."""

    radio_place: dict[str, Place]
    colocated: frozenset[tuple[str, str, datetime]]
    correspondences: list[tuple[str, str, str, str]]
    node_person: dict[str, str]
    #: Length of a co-location window (the step of the events asked for).
    window: timedelta = timedelta(seconds=60)
    _steps: dict[datetime, timedelta] = field(default_factory=dict, repr=False)

    def intervals(self) -> list[tuple[str, str, datetime, datetime]]:
        """Co-locations as (person_a, person_b, start, end), consecutive windows merged."""
        out: list[tuple[str, str, datetime, datetime]] = []
        for a, b, t in sorted(self.colocated):
            end = t + self._steps.get(t, self.window)
            if out and out[-1][0] == a and out[-1][1] == b and out[-1][3] == t:
                out[-1] = (a, b, out[-1][2], end)
            else:
                out.append((a, b, t, end))
        return out


class OfficeWorld:
    """The simulated office; see the module docstring."""

    def __init__(
        self,
        *,
        seed: int = 0,
        people: int = 12,
        buildings: int = 2,
        floors: int = 3,
        aps_per_floor: int = 4,
        beacons_per_floor: int = 2,
    ) -> None:
        for name, value, low in (
            ("people", people, 0),
            ("buildings", buildings, 1),
            ("floors", floors, 1),
            ("aps_per_floor", aps_per_floor, 0),
            ("beacons_per_floor", beacons_per_floor, 0),
        ):
            if type(value) is not int or value < low:
                raise ValueError(f"{name} must be an int >= {low}")
        self.seed = seed
        self.buildings = buildings
        self.floors = floors
        rng = random.Random(seed)
        self.access_points, self.beacons = make_radios(
            rng,
            buildings=buildings,
            floors=floors,
            aps_per_floor=aps_per_floor,
            beacons_per_floor=beacons_per_floor,
        )
        self.people: list[Person] = make_people(rng, people, buildings=buildings, floors=floors)
        #: Every room of the office, as the place at its centre (offices, meeting rooms,
        #: lounges, the canteen), sorted by room name.
        self.places: list[Place] = sorted(
            (
                place_in(building_name(b), f, room)
                for b in range(buildings)
                for f in range(floors)
                for room in ROOMS
            ),
            key=lambda p: p.room,
        )
        #: Each person's offset within a step, as a fraction of it (fixed for the seed).
        self._offset = [rng.random() * 0.8 for _ in self.people]
        self._order = sorted(range(len(self.people)), key=lambda i: self._offset[i])
        self._plans: dict[date, dict[str, DayPlan | None]] = {}
        self._heard: dict[tuple[Place, str], list[tuple[Radio, float]]] = {}
        self._spans: list[tuple[datetime, datetime, timedelta]] = []

    # -- where people are ------------------------------------------------------------------

    def plan(self, day: date) -> dict[str, DayPlan | None]:
        """Every person's plan for *day* (cached for a few days)."""
        plan = self._plans.get(day)
        if plan is None:
            if len(self._plans) > 8:
                self._plans.clear()
            plan = self._plans[day] = plan_day(
                self.seed, day, self.people, buildings=self.buildings, floors=self.floors
            )
        return plan

    def where(self, person: Person, at: datetime) -> tuple[Place | None, Place | None]:
        """(where *person* and their phone are, where their laptop is) at *at*; None outside
        the office."""
        at = _utc(at)
        second = (at - at.replace(hour=0, minute=0, second=0, microsecond=0)).total_seconds()
        return locate(person, self.plan(at.date()).get(person.name), second)

    # -- events ----------------------------------------------------------------------------

    def events(
        self,
        start: datetime,
        end: datetime,
        *,
        step: timedelta = timedelta(seconds=60),
        kinds: Collection[str] | None = None,
    ) -> Iterator[tuple[datetime, str, dict[str, Any]]]:
        """The events of [*start*, *end*) in time order; see the module docstring. *kinds*
        keeps only those types (the others are not even computed; what is kept is the same
        as without it)."""
        start, end = _utc(start), _utc(end)
        step_s = step.total_seconds()
        if step_s <= 0:
            raise ValueError("step must be positive")
        if end > start and (kinds is None or PEOPLE_KINDS & set(kinds)):
            self._note_span(start, end, step)
        wanted = None if kinds is None else frozenset(kinds)
        t0, t1 = (start - _EPOCH).total_seconds(), (end - _EPOCH).total_seconds()
        for k in range(math.floor(t0 / step_s), math.ceil(t1 / step_s)):
            for ts, kind, values in self._step(k, step_s, wanted):
                if t0 <= ts < t1 and (wanted is None or kind in wanted):
                    yield _EPOCH + timedelta(seconds=ts), kind, values

    def _note_span(self, start: datetime, end: datetime, step: timedelta) -> None:
        """Remember a span asked for (ground truth covers it); a span that continues the
        last one extends it, so a live feed asking every second keeps one entry."""
        if self._spans:
            s0, e0, st0 = self._spans[-1]
            if st0 == step and s0 <= start <= e0:
                self._spans[-1] = (s0, max(e0, end), step)
                return
        self._spans.append((start, end, step))

    def _step(
        self, k: int, step_s: float, wanted: frozenset[str] | None = None
    ) -> list[tuple[float, str, dict[str, Any]]]:
        base = k * step_s
        out: list[tuple[float, str, dict[str, Any]]] = []
        if wanted is None or wanted & PEOPLE_KINDS:
            self._people_step(k, step_s, out)
        end = base + step_s
        if wanted is None or "weather" in wanted:
            for n in range(math.ceil(base / WEATHER_INTERVAL), math.ceil(end / WEATHER_INTERVAL)):
                for c, city in enumerate(CITIES):
                    out.append(
                        (n * WEATHER_INTERVAL + 5 + c * 0.1, "weather", self._weather(city, n))
                    )
        if wanted is None or "quote" in wanted:
            for n in range(
                math.ceil((base - 1) / QUOTE_INTERVAL), math.ceil((end - 1) / QUOTE_INTERVAL)
            ):
                for s, (symbol, price, ccy) in enumerate(self._quotes(n)):
                    out.append(
                        (
                            n * QUOTE_INTERVAL + 1 + s * 0.1,
                            "quote",
                            {"StockSymbol": symbol, "Price": price, "Currency": ccy},
                        )
                    )
        if wanted is None or "ticker" in wanted:
            for n in range(
                math.ceil((base - 1 - TICKER_DELAY) / QUOTE_INTERVAL),
                math.ceil((end - 1 - TICKER_DELAY) / QUOTE_INTERVAL),
            ):
                for s, (symbol, price, ccy) in enumerate(self._quotes(n)):
                    out.append(
                        (
                            n * QUOTE_INTERVAL + 1 + TICKER_DELAY + s * 0.1,
                            "ticker",
                            {"Symbol": symbol, "Last": price, "Ccy": ccy},
                        )
                    )
        out.sort(key=lambda e: e[0])
        return out

    def _people_step(
        self, k: int, step_s: float, out: list[tuple[float, str, dict[str, Any]]]
    ) -> None:
        base = k * step_s
        rng = random.Random((self.seed * 1_000_003 + k) * 7 + 1)
        when = _EPOCH + timedelta(seconds=base)
        plans = self.plan(when.date())
        second = base % _DAY
        for i in self._order:
            person = self.people[i]
            here, laptop = locate(person, plans.get(person.name), second)
            if here is None or laptop is None:
                continue
            t = base + step_s * self._offset[i]
            dt = step_s * 0.02
            out.append(
                (t, "wifi-scan", self._scan(rng, person.laptop, laptop, self.access_points, WIFI))
            )
            out.append(
                (t + dt, "bt-scan", self._scan(rng, person.laptop, laptop, self.beacons, BLUETOOTH))
            )
            out.append((t + 2 * dt, "position", self._position(rng, person.phone, here)))
            out.append(
                (
                    t + 3 * dt,
                    "wifi-scan",
                    self._scan(rng, person.phone, here, self.access_points, WIFI),
                )
            )
            out.append(
                (
                    t + 4 * dt,
                    "bt-scan",
                    self._scan(rng, person.phone, here, self.beacons, BLUETOOTH),
                )
            )

    def _scan(
        self, rng: random.Random, node: str, at: Place, radios: list[Radio], model: RadioModel
    ) -> dict[str, Any]:
        heard = self._heard.get((at, model is WIFI and "w" or "b"))
        if heard is None:
            heard = []
            for r in radios:
                base = model.base_rssi(r.place, at)
                if base is not None:
                    heard.append((r, base))
            self._heard[(at, model is WIFI and "w" or "b")] = heard
        gauss, threshold, noise = rng.gauss, model.threshold, model.noise
        found = []
        for r, base in heard:
            rssi = round(base + gauss(0.0, noise))
            if rssi >= threshold:
                found.append((rssi, r))
        found.sort(key=lambda x: -x[0])
        return {
            "Node": node,
            "Radios": [{"Id": r.id, "Name": r.name, "Rssi": rssi} for rssi, r in found],
        }

    @staticmethod
    def _position(rng: random.Random, node: str, at: Place) -> dict[str, Any]:
        x = min(max(at.x + rng.gauss(0.0, POSITION_NOISE), 0.0), FLOOR_WIDTH)
        y = min(max(at.y + rng.gauss(0.0, POSITION_NOISE), 0.0), FLOOR_DEPTH)
        return {
            "Node": node,
            "Building": at.building,
            "Floor": at.floor,
            "X": round(x, 1),
            "Y": round(y, 1),
        }

    def weather_now(self, at: datetime) -> list[tuple[datetime, dict[str, Any]]]:
        """The current conditions at *at*: each city's latest reading (time, values), the
        same values `events()` gave for that reading.

        >>> world = OfficeWorld(seed=1)
        >>> at = datetime(2030, 1, 7, 9, 7, tzinfo=timezone.utc)
        >>> [(t.strftime("%H:%M:%S"), v["City"]) for t, v in world.weather_now(at)]
        [('09:00:05', 'Oslo'), ('09:00:05', 'Zurich')]
        """
        ts = (_utc(at) - _EPOCH).total_seconds()
        out = []
        for c, city in enumerate(CITIES):
            offset = 5 + c * 0.1  # as in _step: the reading of instant n comes a little after it
            n = math.floor((ts - offset) / WEATHER_INTERVAL)
            out.append(
                (_EPOCH + timedelta(seconds=n * WEATHER_INTERVAL + offset), self._weather(city, n))
            )
        return out

    def _weather(self, city: str, n: int) -> dict[str, Any]:
        t = n * WEATHER_INTERVAL
        rng = random.Random((self.seed * 1_000_003 + n) * 11 + len(city))
        day = 2 * math.pi * (t % _DAY) / _DAY
        year = 2 * math.pi * (t % (365.25 * _DAY)) / (365.25 * _DAY)
        temp = (
            CITIES[city] - 9 * math.cos(year) - 4 * math.cos(day - math.pi / 6) + rng.gauss(0, 0.5)
        )
        humidity = int(
            min(100, max(20, 70 + 20 * math.sin(t / 20000.0 + len(city)) + rng.gauss(0, 3)))
        )
        if humidity > 85:
            condition = "snow" if temp < 0 else "rain"
        elif humidity > 70:
            condition = "cloudy"
        else:
            condition = "clear"
        return {
            "City": city,
            "TemperatureC": round(temp, 1),
            "Humidity": humidity,
            "Condition": condition,
        }

    def _quotes(self, n: int) -> list[tuple[str, float, str]]:
        """The market at quote instant *n*: a smooth swing per symbol plus a little noise, a
        function of time alone (so quotes and tickers agree, whatever was asked before)."""
        rng = random.Random((self.seed * 1_000_003 + n) * 13 + 5)
        t = n * QUOTE_INTERVAL
        out = []
        for s, (symbol, (ccy, base)) in enumerate(SYMBOLS.items()):
            swing = 0.04 * math.sin(t / (5400.0 + 900 * s) + s) + 0.015 * math.sin(
                t / (700.0 + 90 * s) + 2 * s
            )
            out.append((symbol, round(base * (1 + swing + rng.gauss(0, 0.001)), 2), ccy))
        return out

    # -- ground truth ----------------------------------------------------------------------

    @property
    def ground_truth(self) -> GroundTruth:
        """Ground truth for every span `events()` was asked for so far."""
        colocated: set[tuple[str, str, datetime]] = set()
        steps: dict[datetime, timedelta] = {}
        window = self._spans[-1][2] if self._spans else timedelta(seconds=60)
        for start, end, step in self._spans:
            colocated |= self._colocated(start, end, step, steps)
        return self._truth(frozenset(colocated), window, steps)

    def ground_truth_for(
        self, start: datetime, end: datetime, *, step: timedelta = timedelta(seconds=60)
    ) -> GroundTruth:
        """Ground truth for [*start*, *end*) on the grid of *step*, whatever was generated."""
        steps: dict[datetime, timedelta] = {}
        return self._truth(
            frozenset(self._colocated(_utc(start), _utc(end), step, steps)), step, steps
        )

    def _truth(
        self,
        colocated: frozenset[tuple[str, str, datetime]],
        window: timedelta,
        steps: dict[datetime, timedelta],
    ) -> GroundTruth:
        nodes = {p.laptop: p.name for p in self.people} | {p.phone: p.name for p in self.people}
        return GroundTruth(
            radio_place={r.id: r.place for r in (*self.access_points, *self.beacons)},
            colocated=colocated,
            correspondences=list(CORRESPONDENCES),
            node_person=nodes,
            window=window,
            _steps=steps,
        )

    def _colocated(
        self, start: datetime, end: datetime, step: timedelta, steps: dict[datetime, timedelta]
    ) -> set[tuple[str, str, datetime]]:
        """Pairs in one room, per step window overlapping [start, end)."""
        step_s = step.total_seconds()
        t0, t1 = (start - _EPOCH).total_seconds(), (end - _EPOCH).total_seconds()
        out: set[tuple[str, str, datetime]] = set()
        for k in range(math.floor(t0 / step_s), math.ceil(t1 / step_s)):
            base = k * step_s
            when = _EPOCH + timedelta(seconds=base)
            plans = self.plan(when.date())
            rooms: dict[str, list[str]] = {}
            for p in self.people:
                here, _ = locate(p, plans.get(p.name), base % _DAY)
                if here is not None:
                    rooms.setdefault(here.room, []).append(p.name)
            for names in rooms.values():
                if len(names) > 1:
                    names.sort()
                    for i, a in enumerate(names):
                        for b in names[i + 1 :]:
                            out.add((a, b, when))
                    steps[when] = step
        return out


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
