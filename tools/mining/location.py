"""Location mining: where each radio (Wi-Fi access point, Bluetooth beacon) is, from scans
joined in time with the same node's position events.

A scan (``wifi-scan``/``bt-scan``: ``{Node, Radios: [{Id, Name, Rssi}]}``) says what a node
heard; a position event (``position``: ``{Node, Building, Floor, X, Y}``) says where that node
was. Nodes that publish both (phones) teach us where radios are.

The join in time, the step most easily got wrong. Scans and positions come from separate
publishers and are never at the same instant, and a node moves. Each scan is paired with the
same node's position *nearest in time*, and only if that is at most `max_gap_seconds` away
(a scan far from any position says nothing about where it was made). As an equi-join: time
is cut into buckets `max_gap_seconds` wide; each position is copied into its own bucket and
the two next to it, scans join on (node, bucket), so every position within the gap shares a
bucket with the scan. Each position carries the midpoints to its node's positions before
and after it, and a scan keeps only the position whose stretch between midpoints holds it:
the nearest (of two as near, the earlier), one row per scan, with no aggregate over the
candidates. (A range join on time would be a cross product per node.)

Then the observations of each radio are pooled in `LocationConfig.cell_m` square cells
(count, mean signal, mean position), the only data brought to the driver: its size is
bounded by the floor area, not by the log. On the driver (`aa.tools.mining.pathloss`):

1. a first guess per radio: the floor where it is loudest (90th percentile) and the
   power-weighted centroid of the cells there;
2. a log-distance path-loss model per scan type, fitted on the radios whose loudest floor is
   clear (by 6 dB or more);
3. each radio placed where that model best explains all its cells (grid search per floor of
   its building). Its confidence grows with how much worse the next floor explains them,
   ``1 − e^(−Δrmse / margin_db)``, and with the observations, ``min(1, n / min_observations)``.

Step 3 is what gets a radio on a floor nobody visits right: people one floor up may hear
it louder than anyone on its own floor does, but not as loud as it would be if it were
on theirs.

``data`` of the artefact::

    {"radios": {id: {"kind": "wifi-scan", "name": "office-B1", "building": "B1", "floor": 2,
                     "x": 12.3, "y": 4.5, "confidence": 0.97, "observations": 812,
                     "rmse_db": 3.1}},
     "models": {"wifi-scan": {"at_1m": -51.0, "exponent": 2.1, "floor_loss": 11.5}, ...},
     "scan_types": [...], "position_types": [...], "attributes": {...}}
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aa.mesh import UsageError

from .pathloss import Cell, fit, place

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["LocationConfig", "mine_location", "scans", "fixed_sum", "RADIOS_SCHEMA"]

#: How the ``Radios`` list of a scan is read (typed JSON, see `aa.router.eventlog.codec`).
RADIOS_SCHEMA = "array<struct<Id:string,Name:string,Rssi:double>>"
#: Units the sums of signals (dB) and positions (m) are taken in (see `fixed_sum`): far
#: finer than a radio or a position is measured, coarse enough that a sum of a billion
#: observations stays inside a long.
SIGNAL_UNIT = 1e-4
POSITION_UNIT = 1e-4


def fixed_sum(column: Any, unit: float) -> Any:
    """Spark's sum of *column* (doubles) in whole *unit*s, a long: exact, so it does not
    depend on the order the rows are added in (a sum of doubles does, in its last bits,
    and so on how Spark partitions them; a mean derived from one can tip a grid search or
    a threshold). Divide by the count and multiply by *unit* for the mean."""
    from pyspark.sql import functions as F

    return F.sum(F.round(column / unit).cast("long"))


@dataclass(frozen=True, slots=True, kw_only=True)
class LocationConfig:
    """Settings of location mining (and the event shapes it reads)."""

    #: Event types that are radio scans.
    scan_types: tuple[str, ...] = ("wifi-scan", "bt-scan")
    #: Event types that are positions.
    position_types: tuple[str, ...] = ("position",)
    #: Attribute naming the node, in both.
    node: str = "Node"
    #: The scans' list of radios ({Id, Name, Rssi}).
    radios: str = "Radios"
    #: Position attributes.
    building: str = "Building"
    floor: str = "Floor"
    x: str = "X"
    y: str = "Y"
    #: Longest time between a scan and the position it is paired with, seconds.
    max_gap_seconds: int = 60
    #: Observations are pooled in square cells this wide, metres.
    cell_m: float = 2.0
    #: Observations for full confidence.
    min_observations: int = 20
    #: How much better (RMS, dB) the chosen floor must explain the signals than the next
    #: for confidence 1 − 1/e.
    margin_db: float = 1.0
    #: Radios placed with less confidence are left out.
    min_confidence: float = 0.5

    def __post_init__(self) -> None:
        if not self.scan_types or not self.position_types:
            raise UsageError("LocationConfig needs scan_types and position_types")
        if self.max_gap_seconds < 1 or self.min_observations < 1:
            raise UsageError(
                "LocationConfig.max_gap_seconds and min_observations must be at least 1"
            )
        if not 0.0 <= self.min_confidence <= 1.0:
            raise UsageError("LocationConfig.min_confidence must be in [0, 1]")


def scans(events: DataFrame, scan_types: tuple[str, ...], node: str, radios: str) -> DataFrame:
    """Scans, one row per event: id, type, time, node, radios (array of Id, Name, Rssi)."""
    from pyspark.sql import functions as F

    return (
        events.where(F.col("type").isin(*scan_types))
        .select(
            "id",
            "type",
            "time",
            F.col("values")[node].alias("node"),
            F.from_json(F.col("values")[radios], RADIOS_SCHEMA).alias("radios"),
        )
        .where(F.col("node").isNotNull() & F.col("radios").isNotNull())
    )


def _observations(
    events: DataFrame, cfg: LocationConfig, parsed: DataFrame | None = None
) -> DataFrame:
    """(radio, kind, name, rssi, building, floor, x, y): each radio a scan heard, where the
    scanning node was."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    gap = cfg.max_gap_seconds
    v = F.col("values")
    pos = (
        events.where(F.col("type").isin(*cfg.position_types))
        .select(
            v[cfg.node].alias("node"),
            F.unix_micros("time").alias("tp"),
            v[cfg.building].alias("building"),
            v[cfg.floor].cast("long").alias("floor"),
            v[cfg.x].cast("double").alias("x"),
            v[cfg.y].cast("double").alias("y"),
        )
        .where(
            F.col("node").isNotNull() & F.col("building").isNotNull() & F.col("floor").isNotNull()
        )
    )
    # One position per node and instant (of two at one instant, the least), and the instants
    # of the node's positions before and after it: the scans a position is the nearest to
    # lie between the midpoints to those (a midpoint itself goes to the earlier position).
    pos = pos.groupBy("node", "tp").agg(F.min(F.struct("building", "floor", "x", "y")).alias("at"))
    along = Window.partitionBy("node").orderBy("tp")
    pos = pos.select(
        "node",
        "tp",
        "at",
        (F.lag("tp").over(along) + F.col("tp")).alias("after2"),
        (F.lead("tp").over(along) + F.col("tp")).alias("upto2"),
    )
    # Each position in its bucket and both neighbours: every position within `gap` of a
    # scan shares a bucket with it (see the module docstring).
    pos = pos.withColumn("d", F.explode(F.sequence(F.lit(-1), F.lit(1)))).withColumn(
        "bucket", F.floor(F.col("tp") / (gap * 1_000_000)) + F.col("d")
    )
    sc = (
        (parsed if parsed is not None else scans(events, cfg.scan_types, cfg.node, cfg.radios))
        .select("type", "node", "radios", F.unix_micros("time").alias("ts"))
        .withColumn("bucket", F.floor(F.col("ts") / (gap * 1_000_000)))
    )
    # The nearest position in time of each scan (of two as near, one before and one after,
    # the earlier): the one whose stretch between midpoints holds it, within the gap. A scan
    # lies in one stretch of its node, and meets that position in one bucket, so the join
    # gives each scan at most one row, and nothing is aggregated per scan (an aggregate of
    # its radio list and the position's building, neither of fixed width, would sort every
    # candidate row).
    ts2 = 2 * F.col("ts")
    paired = (
        sc.join(pos, ["node", "bucket"])
        .where(
            (F.abs(F.col("ts") - F.col("tp")) <= gap * 1_000_000)
            & (F.col("after2").isNull() | (ts2 > F.col("after2")))
            & (F.col("upto2").isNull() | (ts2 <= F.col("upto2")))
        )
        .select(F.col("type").alias("kind"), "radios", "at")
    )
    return _radio_rows(paired)


def _radio_rows(paired: DataFrame) -> DataFrame:
    """One row per radio heard in a scan paired with its position *at* (a struct of
    building, floor, x, y): radio, kind, name, rssi and the position's fields; radios
    without an id or a level left out."""
    from pyspark.sql import functions as F

    return (
        paired.select("kind", F.explode("radios").alias("r"), "at")
        .select(
            F.col("r.Id").alias("radio"),
            "kind",
            F.col("r.Name").alias("name"),
            F.col("r.Rssi").alias("rssi"),
            "at.building",
            "at.floor",
            "at.x",
            "at.y",
        )
        .where(F.col("radio").isNotNull() & F.col("rssi").isNotNull())
    )


def _heuristic(cells: list[Any]) -> tuple[int, float, float, float]:
    """(floor, x, y, margin dB): the floor where the radio is loudest (90th percentile of the
    cells' signals, weighted by observations) and the power-weighted centroid there."""
    loud: dict[int, float] = {}
    for floor in {c.floor for c in cells}:
        mine = sorted((c for c in cells if c.floor == floor), key=lambda c: -c.rssi)
        need, acc = 0.1 * sum(c.n for c in mine), 0
        for c in mine:
            acc += c.n
            if acc >= need:
                loud[floor] = c.rssi
                break
    ranked = sorted(loud.items(), key=lambda kv: -kv[1])
    floor = ranked[0][0]
    margin = ranked[0][1] - ranked[1][1] if len(ranked) > 1 else 20.0
    on = [c for c in cells if c.floor == floor]
    w = [c.n * 10.0 ** ((c.rssi + 40.0) / 10.0) for c in on]
    tw = sum(w)
    return (
        floor,
        sum(wi * c.x for wi, c in zip(w, on)) / tw,
        sum(wi * c.y for wi, c in zip(w, on)) / tw,
        margin,
    )


def _merge_cells(rows: list[Any]) -> list[dict[str, Any]]:
    """One row per (radio, building, floor, cx, cy) of rows also split by kind and name:
    n and the sums added (a sum of nulls is null, as in Spark), kind and name the least
    that is not null (Spark's min)."""
    cells: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = (r["radio"], r["building"], r["floor"], r["cx"], r["cy"])
        cell = cells.get(key)
        if cell is None:
            cells[key] = r.asDict()
            continue
        cell["n"] += r["n"]
        for col in ("rssi", "x", "y"):
            if r[col] is not None:
                cell[col] = r[col] if cell[col] is None else cell[col] + r[col]
        for col in ("kind", "name"):
            if r[col] is not None and (cell[col] is None or r[col] < cell[col]):
                cell[col] = r[col]
    return list(cells.values())


def mine_location(
    events: DataFrame,
    config: LocationConfig,
    *,
    parsed: DataFrame | None = None,
    tick: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """The location artefact's ``data`` (see the module docstring) from de-duplicated events
    (and their scans, already parsed by `scans`, if the caller has them); *tick* is called
    after the Spark action (for progress)."""
    from pyspark.sql import functions as F

    obs = _observations(events, config, parsed)
    cm = config.cell_m
    # Grouped by kind and name too, not aggregated with min: a min of strings has no
    # fixed-width buffer, so Spark would sort every observation instead of hashing it. The
    # groups of a cell (nearly always one) are merged here: counts and sums of whole units
    # add exactly, and the least kind and name are what min gives.
    collected = _merge_cells(
        obs.groupBy(
            "radio",
            "building",
            "floor",
            F.floor(F.col("x") / cm).alias("cx"),
            F.floor(F.col("y") / cm).alias("cy"),
            "kind",
            "name",
        )
        .agg(
            F.count(F.lit(1)).alias("n"),
            fixed_sum(F.col("rssi"), SIGNAL_UNIT).alias("rssi"),
            fixed_sum(F.col("x"), POSITION_UNIT).alias("x"),
            fixed_sum(F.col("y"), POSITION_UNIT).alias("y"),
        )
        .collect()
    )
    tick()
    # In a fixed order: the model is fitted over the cells in the order they come, and a
    # radio's kind and name are its first cell's.
    rows = sorted(
        (
            {
                "radio": r["radio"],
                "building": r["building"],
                "floor": r["floor"],
                "n": r["n"],
                "rssi": r["rssi"] / r["n"] * SIGNAL_UNIT,
                "x": r["x"] / r["n"] * POSITION_UNIT,
                "y": r["y"] / r["n"] * POSITION_UNIT,
                "kind": r["kind"],
                "name": r["name"],
                "cell": (r["cx"], r["cy"]),
            }
            for r in collected
            if r["x"] is not None and r["y"] is not None  # a position without coordinates
        ),
        key=lambda r: (r["radio"], r["building"], r["floor"], r["cell"]),
    )
    by_radio: dict[str, list[tuple[str, Cell]]] = {}
    meta: dict[str, tuple[str, str]] = {}  # radio → (kind, name)
    floors: dict[str, set[int]] = {}
    bounds: dict[str, list[float]] = {}
    for r in rows:
        by_radio.setdefault(r["radio"], []).append(
            (r["building"], Cell(int(r["floor"]), r["x"], r["y"], r["rssi"], r["n"]))
        )
        meta.setdefault(r["radio"], (r["kind"], r["name"]))
        floors.setdefault(r["building"], set()).add(int(r["floor"]))
        box = bounds.setdefault(r["building"], [r["x"], r["y"], r["x"], r["y"]])
        box[:] = [
            min(box[0], r["x"]),
            min(box[1], r["y"]),
            max(box[2], r["x"]),
            max(box[3], r["y"]),
        ]
    radios: dict[str, Any] = {}
    # A radio hangs in one building: the one it is heard in most (walls between buildings).
    building: dict[str, str] = {}
    cells: dict[str, list[Cell]] = {}
    for rid, found in by_radio.items():
        votes: dict[str, int] = {}
        for bld, c in found:
            votes[bld] = votes.get(bld, 0) + c.n
        building[rid] = min(votes.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        cells[rid] = [c for bld, c in found if bld == building[rid]]
    first = {rid: _heuristic(cs) for rid, cs in cells.items()}
    # Fit the model per kind of scan (Wi-Fi and Bluetooth differ), on the radios whose loud
    # floor is clear, at their centroid; then place every radio with it.
    models = {}
    for kind in sorted({m[0] for m in meta.values()}):
        samples = [
            (math.hypot(c.x - fx, c.y - fy), abs(c.floor - ff), c.rssi, c.n)
            for rid, (ff, fx, fy, margin) in first.items()
            if meta[rid][0] == kind and margin >= 6.0
            for c in cells[rid]
        ]
        models[kind] = fit(samples)
    for rid, cs in sorted(cells.items()):
        kind, name = meta[rid]
        b = building[rid]
        x0, y0, x1, y1 = bounds[b]
        ranked = place(cs, models[kind], sorted(floors[b]), (x0, y0, x1, y1))
        best = ranked[0]
        margin = ranked[1].rmse - best.rmse if len(ranked) > 1 else 10.0
        n = sum(c.n for c in cs)
        conf = (1.0 - math.exp(-margin / config.margin_db)) * min(1.0, n / config.min_observations)
        if conf < config.min_confidence:
            continue
        radios[rid] = {
            "kind": kind,
            "name": name,
            "building": b,
            "floor": best.floor,
            "x": round(best.x, 2),
            "y": round(best.y, 2),
            "confidence": round(conf, 4),
            "observations": n,
            "rmse_db": round(best.rmse, 2),
        }
    return {
        "radios": radios,
        "models": {
            k: {
                "at_1m": round(m.at_1m, 2),
                "exponent": round(m.exponent, 3),
                "floor_loss": round(m.floor_loss, 2),
            }
            for k, m in sorted(models.items())
        },
        "scan_types": list(config.scan_types),
        "position_types": list(config.position_types),
        "attributes": {"node": config.node, "radios": config.radios},
    }
