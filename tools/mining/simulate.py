"""Event logs without routers: the simulated office (`aa.addins.office.OfficeWorld`) run over
a span of days, its events written by the real event log writer (`aa.router`'s
`EventLog`), as one or more routers would have logged them.

Layout written::

    <out>/world.json              # the world's parameters and the span: ground truth again
    <out>/r1/eventlog/date=…/hour=…/part-r1-….parquet
    <out>/r2/eventlog/…

Each event is logged by its publisher's home router (a stable hash of the client id over
the routers) and, with probability `SimulateConfig.overlap`, also by each other router, as
flooding would: the same ``id`` then sits in several routers' folders, and a miner must
de-duplicate. ``overlap=1`` is a fully connected mesh in which every router logs everything.
"""

from __future__ import annotations

import asyncio
import json
import random
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from aa.mesh import Event, UsageError
from aa.router import EventLogConfig

__all__ = [
    "SimulateConfig",
    "SimulateResult",
    "simulate",
    "load_world",
    "WORLD_FILE",
    "DEFAULT_START",
]

#: The file describing the simulated world and span, beside the routers' folders.
WORLD_FILE: Final = "world.json"
#: A Monday.
DEFAULT_START: Final = datetime(2030, 1, 7, tzinfo=UTC)
#: Rows between two waits for the writers: bounds memory and keeps the writers (threads)
#: from falling `EventLogConfig.max_pending_rows` behind, which would drop rows.
_BATCH: Final = 20_000
#: Simulated latency between an event's time and its logging, seconds.
_LATENCY: Final = 0.05
_LOG_CONFIG: Final = EventLogConfig(
    row_group_rows=50_000,
    flush_interval=3600.0,
    max_file_age=7200.0,  # files close at each hour's end: one file per router and hour
    max_total_bytes=2**62,
    max_total_age=1e12,  # simulated time is far from now: never age anything out
    defer_bytes=0,  # no router to make way for: write while the next rows are simulated
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateConfig:
    """What to simulate and how to log it."""

    #: Folder to write (routers' folders and `WORLD_FILE`).
    out: str
    #: First instant (aware UTC) and number of days.
    start: datetime = DEFAULT_START
    days: float = 1.0
    #: The world: see `OfficeWorld`.
    seed: int = 0
    people: int = 12
    buildings: int = 2
    floors: int = 3
    aps_per_floor: int = 4
    beacons_per_floor: int = 2
    #: Seconds per simulation step (each person's scans and position once per step).
    step_seconds: float = 60.0
    #: Router names: one folder each.
    routers: tuple[str, ...] = ("r1", "r2")
    #: Chance that a router other than the home router logs an event too.
    overlap: float = 0.3
    #: Stop after this many events (None: at the span's end).
    max_events: int | None = None

    def __post_init__(self) -> None:
        if self.days <= 0 or self.step_seconds <= 0:
            raise UsageError("days and step_seconds must be positive")
        if not self.routers or len(set(self.routers)) != len(self.routers):
            raise UsageError("routers must be distinct names, at least one")
        if not 0.0 <= self.overlap <= 1.0:
            raise UsageError("overlap must be in [0, 1]")
        if self.max_events is not None and self.max_events < 1:
            raise UsageError("max_events must be at least 1")
        if self.start.tzinfo is None:
            raise UsageError("start must be an aware datetime")

    @property
    def end(self) -> datetime:
        return self.start + timedelta(days=self.days)

    def world_params(self) -> dict[str, int]:
        return {
            "seed": self.seed,
            "people": self.people,
            "buildings": self.buildings,
            "floors": self.floors,
            "aps_per_floor": self.aps_per_floor,
            "beacons_per_floor": self.beacons_per_floor,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateResult:
    """What was written."""

    #: Events the world produced (each once).
    events: int
    #: Rows written, per router (events plus duplicates).
    rows: dict[str, int]
    #: The routers' folders (each holds ``eventlog/``).
    folders: list[str]


def _world(params: dict[str, int]) -> Any:
    from aa.addins.office import OfficeWorld

    return OfficeWorld(**params)


def load_world(folder: str | Path) -> tuple[Any, datetime, datetime, timedelta]:
    """(world, start, end, step) of a simulated folder, from its `WORLD_FILE`."""
    path = Path(folder) / WORLD_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"no simulated world in {folder}: {exc}") from None
    return (
        _world(doc["world"]),
        datetime.fromisoformat(doc["start"]),
        datetime.fromisoformat(doc["end"]),
        timedelta(seconds=doc["step_seconds"]),
    )


def simulate(config: SimulateConfig) -> SimulateResult:
    """Run the world over the span and write the routers' event logs (blocking)."""
    return asyncio.run(_simulate(config))


async def _simulate(cfg: SimulateConfig) -> SimulateResult:
    from aa.router import EventLog  # the real writer

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (before any task runs)
    world = _world(cfg.world_params())
    clock = [cfg.start.timestamp()]
    logs = [
        EventLog(_LOG_CONFIG, data_dir=out / r, router_id=r, clock=lambda: clock[0])
        for r in cfg.routers
    ]
    rows = dict.fromkeys(cfg.routers, 0)
    rng = random.Random(cfg.seed * 7919 + 1)
    n_routers = len(cfg.routers)
    n = 0
    # Ids unique across runs of other spans (and seeds), so their logs can be mined together.
    prefix = f"s{cfg.seed}-{int(cfg.start.timestamp()) // 60:x}-"
    for elog in logs:
        await elog.start()
    try:
        step = timedelta(seconds=cfg.step_seconds)
        for t, kind, values in world.events(cfg.start, cfg.end, step=step):
            client = values.get("Node") if type(values.get("Node")) is str else f"{kind}-publisher"
            home = zlib.crc32(client.encode()) % n_routers
            meta = {"time": t, "client": client, "router": cfg.routers[home]}
            event = Event.trusted(values, kind, meta, f"{prefix}{n:x}")
            now = t.timestamp() + _LATENCY
            clock[0] = now
            for i, elog in enumerate(logs):
                if i == home or (cfg.overlap and rng.random() < cfg.overlap):
                    elog.append(event, now=now)
                    rows[cfg.routers[i]] += 1
            n += 1
            if n == cfg.max_events:
                break
            if n % _BATCH == 0:
                # Each log's writer is one thread, first in first out: waiting for a
                # housekeeping pass waits for every row handed to it before.
                await asyncio.gather(*(elog.maintain() for elog in logs))
    finally:
        for elog in logs:
            await elog.aclose()
    dropped = sum(elog.stats().dropped for elog in logs)
    if dropped:
        raise RuntimeError(f"the event log writers dropped {dropped} rows")
    doc = {
        "world": cfg.world_params(),
        "start": cfg.start.isoformat(),
        "end": cfg.end.isoformat(),
        "step_seconds": cfg.step_seconds,
        "routers": list(cfg.routers),
        "overlap": cfg.overlap,
        "events": n,
        "rows": rows,
    }
    (out / WORLD_FILE).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return SimulateResult(events=n, rows=rows, folders=[str(out / r) for r in cfg.routers])
