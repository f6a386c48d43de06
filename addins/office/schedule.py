"""People and their days in the office (pure: no I/O, no clock).

A person works Monday to Friday (a day off now and then), arrives between 07:30 and 09:30,
leaves between 15:30 and 17:30 (UTC), sits at a desk in a two-person office, goes to the
day's meetings they are invited to (30 or 60 minutes, 2–5 people, in one of the meeting
rooms) and, on most days, has lunch in the canteen (``B1/0/canteen``) around 11:30–13:00.
The phone is always with its owner; the laptop goes to meetings but stays on the desk over
lunch. Everything follows from the world's seed and the date, so any day can be asked for on
its own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import date
from typing import Final

from .layout import Place, building_name, place_in

__all__ = ["Person", "DayPlan", "NAMES", "make_people", "plan_day"]

#: First names, in order; more people than names get a number after theirs.
NAMES: Final = (
    "alice",
    "bob",
    "carol",
    "dave",
    "erin",
    "frank",
    "grace",
    "heidi",
    "ivan",
    "judy",
    "mallory",
    "niaj",
    "olivia",
    "peggy",
    "rupert",
    "sybil",
    "trent",
    "victor",
    "walter",
    "yves",
)
#: Share of working days a person is away.
DAY_OFF_RATE: Final = 0.05
#: Share of days a person skips the canteen.
SKIP_LUNCH_RATE: Final = 0.2
#: Half-hour slots (from 08:00) that may hold a meeting, and the chance that one does, per
#: meeting room.
MEETING_SLOTS: Final = tuple(range(2, 18))  # 09:00 .. 16:30
MEETING_RATE: Final = 0.3
#: People per desk office.
DESKS_PER_OFFICE: Final = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Person:
    """Someone in the office, and their devices."""

    name: str
    #: Node id of their laptop (as in `wifi-scan`/`bt-scan` ``Node``).
    laptop: str
    #: Node id of their phone (`position` and scans).
    phone: str
    #: Where their desk is.
    desk: Place
    #: Position in the world's list (stable for a seed).
    index: int


@dataclass(frozen=True, slots=True)
class DayPlan:
    """One person's day: seconds after midnight (UTC)."""

    arrive: float
    leave: float
    #: (start, end, place of the person, laptop with them?) outside the desk, sorted.
    away_from_desk: tuple[tuple[float, float, Place, bool], ...]


def make_people(rng: random.Random, n: int, *, buildings: int, floors: int) -> list[Person]:
    """*n* people, two to an office, the offices drawn at random (seeded)."""
    offices = [
        (building_name(b), f, r)
        for f in range(floors)
        for b in range(buildings)
        for r in ("office-1", "office-2")
    ]
    rng.shuffle(offices)
    people = []
    for i in range(n):
        name = NAMES[i % len(NAMES)] + (str(i // len(NAMES) + 1) if i >= len(NAMES) else "")
        b, f, room = offices[(i // DESKS_PER_OFFICE) % len(offices)]
        seat = i % DESKS_PER_OFFICE
        desk = place_in(
            b,
            f,
            room,
            dx=-4.5 + 9.0 * seat + (i // (DESKS_PER_OFFICE * len(offices))) * 1.5,
            dy=rng.uniform(-2.0, 2.0),
        )
        people.append(
            Person(name=name, laptop=f"laptop-{name}", phone=f"phone-{name}", desk=desk, index=i)
        )
    return people


def _day_rng(seed: int, day: date, stream: int) -> random.Random:
    return random.Random((seed * 1_000_003 + day.toordinal()) * 101 + stream)


def plan_day(
    seed: int, day: date, people: list[Person], *, buildings: int, floors: int
) -> dict[str, DayPlan | None]:
    """Every person's plan for *day* (None: not in the office)."""
    out: dict[str, DayPlan | None] = {}
    if day.weekday() >= 5:
        return {p.name: None for p in people}
    rng = _day_rng(seed, day, 0)
    present: list[Person] = []
    hours: dict[str, tuple[float, float]] = {}
    for p in people:
        off = rng.random() < DAY_OFF_RATE
        arrive = 7.5 * 3600 + rng.uniform(0, 2 * 3600)
        leave = 15.5 * 3600 + rng.uniform(0, 2 * 3600)
        if not off:
            present.append(p)
            hours[p.name] = (arrive, leave)
    away: dict[str, list[tuple[float, float, Place, bool]]] = {p.name: [] for p in present}
    # Lunch: most people, in the canteen, each at their own table spot.
    for p in present:
        if rng.random() >= SKIP_LUNCH_RATE:
            start = 11.5 * 3600 + rng.uniform(0, 1800)
            spot = place_in(
                "B1", 0, "lounge", dx=-8 + (p.index % 9) * 2.0, dy=-3 + (p.index // 9 % 4) * 2.0
            )
            away[p.name].append((start, start + rng.choice((1800, 2400, 2700)), spot, False))
    # Meetings: per meeting room and half-hour slot, now and then, 2–5 of those present.
    rooms = [(building_name(b), f) for b in range(buildings) for f in range(floors)]
    for b, f in rooms:
        for slot in MEETING_SLOTS:
            if rng.random() >= MEETING_RATE or len(present) < 2:
                continue
            start = 8 * 3600 + slot * 1800
            length = rng.choice((1800, 3600))
            size = min(len(present), rng.randint(2, 5))
            for k, p in enumerate(rng.sample(present, size)):
                seat = place_in(b, f, "meeting", dx=-6 + (k % 5) * 3.0, dy=-2 + (k // 5) * 2.0)
                away[p.name].append((start, start + length, seat, True))
    for p in people:
        if p.name not in hours:
            out[p.name] = None
            continue
        arrive, leave = hours[p.name]
        taken: list[tuple[float, float, Place, bool]] = []
        for seg in sorted(away[p.name], key=lambda s: s[0]):
            # One place at a time: a segment overlapping an earlier one is skipped.
            if (
                seg[0] >= arrive
                and seg[1] <= leave
                and all(seg[0] >= t[1] or seg[1] <= t[0] for t in taken)
            ):
                taken.append(seg)
        out[p.name] = DayPlan(arrive, leave, tuple(sorted(taken, key=lambda s: s[0])))
    return out


def locate(
    person: Person, plan: DayPlan | None, second: float
) -> tuple[Place | None, Place | None]:
    """(where the person and their phone are, where their laptop is) at *second* of the day;
    None when not in the office."""
    if plan is None or not plan.arrive <= second < plan.leave:
        return None, None
    for start, end, place, laptop_along in plan.away_from_desk:
        if start <= second < end:
            return place, (place if laptop_along else person.desk)
        if start > second:
            break
    return person.desk, person.desk
