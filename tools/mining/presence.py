"""Presence mining: which nodes were together, from seeing the same radios at the same
strengths in the same time windows.

Per node and time window (`window_seconds`), a scan fingerprint: the mean signal of each
radio the node heard. Two nodes' fingerprints are compared by their RMS difference in dB
over the union of their radios, a radio one of them did not hear counting as `floor_dbm`.
Only pairs that share one of their `block_radios` loudest radios are compared (blocking: a
self-join on (window, loud radio) instead of every pair of nodes that heard anything in
common, which grows with the square of the nodes in a building), and only if they heard at
least `min_common` radios in common. Fingerprints are maps radio → dBm, compared by
column expressions Spark compiles (no Python UDF, and no lambda for the usual sizes; see
`_rms`).

Signals fall with distance, not at walls, so nearness alone cannot tell a desk-mate five
metres away from a colleague in the meeting room through the wall. Each node has a home
(the fingerprint of the place it is in most windows, see `_homes`), and in each window it is
at home or away; two nodes count as together only if both are at home or both are away.
Two nodes both at home are together when their desks are in one room: desks are the nodes'
mean positions at home (from position events), grouped per building and floor by complete
linkage into rooms no wider than `room_span_m` (`group_rooms`, on the driver); nodes
without positions are decided by distance.

The threshold below which two nodes count as together is learned from the data: distances
of nodes in one room and in different rooms form two humps, and Otsu's method (the cut that
best separates the histogram into two classes) finds the valley, kept within
[`min_threshold_db`, `max_threshold_db`].

Co-located windows of a pair are merged into episodes (consecutive windows, gaps-and-
islands: window number minus its rank is constant along a run).

``data`` of the artefact::

    {"window_seconds": 300, "threshold_db": 7.5, "floor_dbm": -95.0, "min_common": 2,
     "home_threshold_db": 5.0, "room_span_m": 15.0,
     "homes": {node: {radio: dBm}}, "rooms": {node: "B1/2/0"},
     "scan_types": [...], "attributes": {...},
     "pairs": [{"a": node, "b": node, "together": windows, "both_seen": windows, "share": s}],
     "episodes": [[node_a, node_b, start iso, end iso], ...],   # the first max_episodes
     "episodes_total": n}

Episodes are the mined history (who was together when), kept for reports; the adapter needs
the window, threshold, homes and rooms. They grow with the log (a 10-million-event log of a
100-person office has ~700,000), so the artefact keeps the first `max_episodes` in time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aa.mesh import UsageError

from .location import POSITION_UNIT, SIGNAL_UNIT, fixed_sum, scans

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "PresenceConfig",
    "mine_presence",
    "otsu_threshold",
    "group_rooms",
    "HIST_BIN_DB",
    "MAX_DESKS_PER_FLOOR",
]

#: Width of a histogram bin of distances, dB.
HIST_BIN_DB = 0.5
#: Desks of one building and floor grouped into rooms at most (the grouping costs the cube
#: of their number, on the driver); the nodes of a more crowded floor are decided by radio.
MAX_DESKS_PER_FLOOR = 300
#: Fingerprints of at most this many radios are compared by compiled column expressions
#: (see `_rms`), larger ones by lambdas Spark interprets row by row.
UNROLLED_RADIOS = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class PresenceConfig:
    """Settings of presence mining."""

    #: Event types that are radio scans, and their attributes.
    scan_types: tuple[str, ...] = ("wifi-scan", "bt-scan")
    node: str = "Node"
    radios: str = "Radios"
    #: Length of a time window, seconds.
    window_seconds: int = 300
    #: Signal assumed for a radio a node did not hear, dBm.
    floor_dbm: float = -95.0
    #: Radios two nodes must both hear in a window to be compared.
    min_common: int = 2
    #: Two nodes are compared only if one of the loudest this many radios of one is among
    #: those of the other (blocking; see `_distances`).
    block_radios: int = 3
    #: Episodes kept in the artefact, the earliest first (`episodes_total` counts all).
    max_episodes: int = 100_000
    #: Bounds of the learned threshold, dB.
    min_threshold_db: float = 3.0
    max_threshold_db: float = 15.0
    #: A node is at home in a window when its fingerprint is within this of its home
    #: fingerprint (see `_homes`); two nodes count as together only if both are at home or
    #: both away. 0 turns the rule off.
    home_threshold_db: float = 5.0
    #: Position events (``{Node, Building, Floor, X, Y}``, as location mining reads them):
    #: each node's desk is the mean position of its windows at home, and desks are grouped
    #: into rooms (see `group_rooms`); two nodes both at home are together when their desks
    #: are in one room. Nodes without positions are decided by radio alone.
    position_types: tuple[str, ...] = ("position",)
    building: str = "Building"
    floor: str = "Floor"
    x: str = "X"
    y: str = "Y"
    #: The widest a room is taken to be, metres: desks of one building and floor are
    #: grouped so that no two desks of a group are further apart (complete linkage).
    #: 0 turns the grouping off (desks then by radio distance, like any other pair).
    room_span_m: float = 15.0

    def __post_init__(self) -> None:
        if not self.scan_types or min(self.window_seconds, self.min_common, self.block_radios) < 1:
            raise UsageError(
                "PresenceConfig needs scan_types, and window_seconds, min_common, block_radios ≥ 1"
            )
        if self.max_episodes < 0:
            raise UsageError("PresenceConfig.max_episodes must be ≥ 0")
        if not 0 < self.min_threshold_db <= self.max_threshold_db:
            raise UsageError("PresenceConfig needs 0 < min_threshold_db ≤ max_threshold_db")
        if not 0 <= self.home_threshold_db < float("inf"):
            raise UsageError("PresenceConfig.home_threshold_db must be a finite number ≥ 0")
        if not 0 <= self.room_span_m < float("inf"):
            raise UsageError("PresenceConfig.room_span_m must be a finite number ≥ 0")


def otsu_threshold(hist: Sequence[tuple[float, int]]) -> float | None:
    """The value that best splits a histogram [(bin centre, count)] in two (Otsu's method:
    the cut of greatest between-class variance); None if there are fewer than two bins."""
    hist = sorted(hist)
    if len(hist) < 2:
        return None
    total = sum(n for _, n in hist)
    mean_all = sum(v * n for v, n in hist) / total
    best, cut = -1.0, None
    n0 = s0 = 0.0
    for i in range(len(hist) - 1):
        v, n = hist[i]
        n0 += n
        s0 += v * n
        n1 = total - n0
        if n0 == 0 or n1 == 0:
            continue
        m0, m1 = s0 / n0, (mean_all * total - s0) / n1
        between = n0 * n1 * (m0 - m1) ** 2
        if between > best:
            best, cut = between, (hist[i][0] + hist[i + 1][0]) / 2
    return cut


def _distances(
    events: DataFrame, cfg: PresenceConfig, parsed: DataFrame | None
) -> tuple[DataFrame, DataFrame, DataFrame, list[DataFrame]]:
    """(window, a, b, common, distance, home: both at home) for candidate node pairs a < b;
    each node's home (node, home_fp, see `_homes`); each node's state per window (window,
    node, fp, at_home); and the cached frames they are built on, to unpersist when done.

    The homes and the states are cached: the homes are collected, and joined into the
    states, which both sides of the pairs and the desks read; uncached, each of those
    reads would compute the homes again (five shuffles over the fingerprints)."""
    from pyspark.sql import functions as F

    fp = (
        (parsed if parsed is not None else scans(events, cfg.scan_types, cfg.node, cfg.radios))
        .select(
            "node",
            F.floor(F.unix_seconds("time") / cfg.window_seconds).alias("window"),
            "radios",
        )
        # The scans are shuffled once, by (window, node), before their radios are exploded:
        # both aggregates below group by keys that hold (window, node), so that partitioning
        # serves them, and the (window, node, radio) rows, several per scan, are not shuffled.
        .repartition("window", "node")
        .select("node", "window", F.explode("radios").alias("r"))
        .where(F.col("r.Rssi").isNotNull())
        .groupBy("window", "node", F.col("r.Id").alias("radio"))
        # Exact means (see `fixed_sum`), and maps in radio order: the distances are sums
        # over the maps' entries, and must not depend on how the rows were partitioned.
        .agg(
            (fixed_sum(F.col("r.Rssi"), SIGNAL_UNIT) / F.count("r.Rssi") * SIGNAL_UNIT).alias(
                "rssi"
            )
        )
        .groupBy("window", "node")
        .agg(
            F.map_from_entries(F.array_sort(F.collect_list(F.struct("radio", "rssi")))).alias("fp"),
            # The node's loudest radios, loudest first (sorted by -rssi); the field of an
            # array of structs, not a `transform` lambda, which Spark interprets per row.
            F.slice(
                F.sort_array(F.collect_list(F.struct((-F.col("rssi")).alias("neg"), "radio"))),
                1,
                cfg.block_radios,
            )
            .getField("radio")
            .alias("top"),
        )
        .cache()
    )
    floor = F.lit(float(cfg.floor_dbm))
    homes = _homes(fp).cache()
    if cfg.home_threshold_db > 0:
        at_home = F.coalesce(_rms("fp", "home_fp", floor) <= cfg.home_threshold_db, F.lit(False))
        state = (
            # One row per node: broadcast, so the fingerprints are not shuffled by node.
            fp.join(F.broadcast(homes), "node", "left")
            .select("window", "node", "fp", "top", at_home.alias("at_home"))
            .cache()
        )
    else:
        state = fp.select("window", "node", "fp", "top", F.lit(False).alias("at_home"))
    # Blocking: only nodes that share one of their `block_radios` loudest radios are
    # compared. Comparing every pair that heard anything in common costs (nodes in a
    # building)² per window, and nearly all those pairs are floors apart; nodes in one room
    # hear the same radios loudest.
    # The pair's states travel with it through the one join: a pair sharing several of
    # their loudest radios meets once per shared radio, and is kept at the first of them
    # (no distinct, and no joins of the pairs with the states after).
    keys = state.select("window", "node", "fp", "top", "at_home", F.explode("top").alias("radio"))
    a, b = keys.alias("a"), keys.alias("b")
    common = F.size(F.array_intersect(F.map_keys("a.fp"), F.map_keys("b.fp")))
    # Spark tests a join's condition left to right, and puts the filters it pushes into the
    # join before the tests already there, the filter written first first: a < b (a string
    # comparison, which half the matched rows fail) runs first, then the first-shared-radio
    # test (an intersection of two arrays), and the shared radios of the fingerprints are
    # counted only for the rows that pass both.
    dist = (
        a.join(
            b,
            (F.col("a.window") == F.col("b.window"))
            & (F.col("a.radio") == F.col("b.radio"))
            # One at their desk and the other away (a visitor in the next room, a meeting
            # through the wall) are not together, however near: see `_homes`.
            & (F.col("a.at_home") == F.col("b.at_home"))
            & (common >= cfg.min_common),
        )
        .where(F.col("a.node") < F.col("b.node"))
        .where(F.col("a.radio") == F.array_min(F.array_intersect("a.top", "b.top")))
        .select(
            F.col("a.window").alias("window"),
            F.col("a.node").alias("a"),
            F.col("b.node").alias("b"),
            common.alias("common"),
            _rms("a.fp", "b.fp", floor).alias("distance"),
            F.col("a.at_home").alias("home"),
        )
    )
    return dist, homes, state, [state, homes, fp]


def _rms(a: str, b: str, floor: Any) -> Any:
    """The RMS difference in dB of two fingerprint maps over the union of their radios, a
    radio one side did not hear counting as *floor*.

    Summed as `_rms_zipped` sums (its lambdas are interpreted by Spark row by row), the
    same doubles added in the same order, so the same result to the last bit: the radios
    of *a* in its order, then those only *b* has in its order (``map_zip_with``'s order),
    from 0.0. Maps of at most `UNROLLED_RADIOS` radios are summed by a fixed chain of column
    expressions, which Spark compiles (a term past a map's end adds 0.0, which changes no
    sum of squares); larger ones by `_rms_zipped`."""
    from pyspark.sql import functions as F

    ka, kb = F.map_keys(a), F.map_keys(b)
    va, vb = F.map_values(a), F.map_values(b)
    na, nb = F.size(a), F.size(b)
    zero = F.lit(0.0)
    total = zero
    for i in range(UNROLLED_RADIOS):
        y = F.col(b)[F.get(ka, i)]
        total = total + F.when(
            na > i, (F.coalesce(F.get(va, i), floor) - F.coalesce(y, floor)) ** 2
        ).otherwise(zero)
    for j in range(UNROLLED_RADIOS):
        total = total + F.when(
            (nb > j) & ~F.array_contains(ka, F.get(kb, j)),
            (floor - F.coalesce(F.get(vb, j), floor)) ** 2,
        ).otherwise(zero)
    # The union's size from the keys, not from a zip of the maps.
    union = na + nb - F.size(F.array_intersect(ka, kb))
    fits = (na <= UNROLLED_RADIOS) & (nb <= UNROLLED_RADIOS)
    return F.sqrt(F.when(fits, total).otherwise(_zipped_total(a, b, floor)) / union)


def _rms_zipped(a: str, b: str, floor: Any) -> Any:
    """`_rms` by ``map_zip_with`` and ``aggregate`` (lambdas), for maps of any size."""
    from pyspark.sql import functions as F

    union = F.size(a) + F.size(b) - F.size(F.array_intersect(F.map_keys(a), F.map_keys(b)))
    return F.sqrt(_zipped_total(a, b, floor) / union)


def _zipped_total(a: str, b: str, floor: Any) -> Any:
    from pyspark.sql import functions as F

    sq = F.map_zip_with(a, b, lambda k, x, y: (F.coalesce(x, floor) - F.coalesce(y, floor)) ** 2)
    return F.aggregate(F.map_values(sq), F.lit(0.0), lambda acc, x: acc + x)


def _homes(fp: DataFrame) -> DataFrame:
    """(node, home_fp): each node's home fingerprint, where it spends most windows.

    Radio signals fall with distance, not at walls, so a person at a desk and a visitor in
    the meeting room next door can be nearer in signal than two people at the two ends of
    one office. What tells them apart is where each usually is: a node's home is the set
    of loudest radios (``top``) it has in most windows (ties: the first set in sort order),
    and its home fingerprint the mean signal of each radio over those windows, of radios
    heard in at least half of them."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    place = F.array_join(F.array_sort("top"), "\u0001")
    counted = fp.groupBy("node", place.alias("place")).agg(F.count(F.lit(1)).alias("n"))
    first = Window.partitionBy("node").orderBy(F.desc("n"), "place")
    modes = (
        counted.withColumn("rank", F.row_number().over(first))
        .where(F.col("rank") == 1)
        .select("node", "place", "n")
    )
    rssi = fixed_sum(F.col("rssi"), SIGNAL_UNIT) / F.count(F.lit(1)) * SIGNAL_UNIT
    return (
        fp.withColumn("place", place)
        .join(modes, ["node", "place"])
        .select("node", "n", F.explode("fp").alias("radio", "rssi"))
        .groupBy("node", "radio")
        .agg(F.max("n").alias("n"), F.count(F.lit(1)).alias("k"), rssi.alias("rssi"))
        .where(2 * F.col("k") >= F.col("n"))
        .groupBy("node")
        .agg(
            F.map_from_entries(F.array_sort(F.collect_list(F.struct("radio", "rssi")))).alias(
                "home_fp"
            )
        )
    )


def _desks(
    events: DataFrame, cfg: PresenceConfig, state: DataFrame
) -> dict[str, tuple[str, int, float, float]]:
    """node → (building, floor, x, y) of its desk: the floor it reports most positions on
    in windows it is at home (ties: the first in order), and the mean position there. Only
    nodes that publish positions (phones) have one; none without the home rule."""
    from pyspark.sql import functions as F

    if cfg.home_threshold_db <= 0 or cfg.room_span_m <= 0:
        return {}
    v = F.col("values")
    pos = (
        events.where(F.col("type").isin(*cfg.position_types))
        .select(
            v[cfg.node].alias("node"),
            F.floor(F.unix_seconds("time") / cfg.window_seconds).alias("window"),
            v[cfg.building].alias("building"),
            v[cfg.floor].cast("long").alias("floor"),
            v[cfg.x].cast("double").alias("x"),
            v[cfg.y].cast("double").alias("y"),
        )
        # between() is false for NaN, infinities and nulls: a bad position is left out.
        .where(
            F.col("node").isNotNull()
            & F.col("building").isNotNull()
            & F.col("floor").isNotNull()
            & F.col("x").between(-1e9, 1e9)
            & F.col("y").between(-1e9, 1e9)
        )
    )
    home = state.where(F.col("at_home")).select("window", "node")
    rows = (
        pos.join(home, ["window", "node"])
        .groupBy("node", "building", "floor")
        .agg(
            F.count(F.lit(1)).alias("n"),
            fixed_sum(F.col("x"), POSITION_UNIT).alias("sx"),
            fixed_sum(F.col("y"), POSITION_UNIT).alias("sy"),
        )
        .collect()
    )
    best: dict[str, tuple[int, str, int, int, int]] = {}
    for r in sorted(rows, key=lambda r: (r["node"], -r["n"], r["building"], r["floor"])):
        best.setdefault(r["node"], (r["n"], r["building"], r["floor"], r["sx"], r["sy"]))
    return {
        node: (b, f, sx / n * POSITION_UNIT, sy / n * POSITION_UNIT)
        for node, (n, b, f, sx, sy) in best.items()
    }


def group_rooms(
    desks: Mapping[str, tuple[str, int, float, float]], span_m: float
) -> dict[str, str]:
    """node → room ("<building>/<floor>/<n>"): the desks of each building and floor grouped
    by complete linkage (the two nearest groups merged first, the distance of two groups
    that of their furthest desks) as long as no group is wider than *span_m* metres.

    Deterministic: desks in name order, ties to the first pair. Rooms are numbered per
    floor in the order of their first desk's name. A floor of more than
    `MAX_DESKS_PER_FLOOR` desks is not grouped (its nodes get no room)."""
    floors: dict[tuple[str, int], list[tuple[str, float, float]]] = {}
    for node in sorted(desks):
        b, f, x, y = desks[node]
        floors.setdefault((b, f), []).append((node, x, y))
    rooms: dict[str, str] = {}
    for (b, f), members in sorted(floors.items()):
        if len(members) > MAX_DESKS_PER_FLOOR:
            continue
        groups = [[m[0]] for m in members]
        d = {
            (i, j): math.hypot(members[i][1] - members[j][1], members[i][2] - members[j][2])
            for i in range(len(members))
            for j in range(i + 1, len(members))
        }
        while d:
            (i, j), nearest = min(d.items(), key=lambda kv: (kv[1], kv[0]))
            if nearest > span_m:
                break
            groups[i] += groups[j]
            groups[j] = []
            for k in range(len(members)):
                if k in (i, j) or not groups[k]:
                    continue
                ik, jk = (min(i, k), max(i, k)), (min(j, k), max(j, k))
                d[ik] = max(d[ik], d.pop(jk))
            d.pop((i, j))
        for n, group in enumerate(sorted(sorted(g) for g in groups if g)):
            for node in group:
                rooms[node] = f"{b}/{f}/{n}"
    return rooms


def mine_presence(
    events: DataFrame,
    config: PresenceConfig,
    *,
    parsed: DataFrame | None = None,
    tick: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """The presence artefact's ``data`` (see the module docstring) from de-duplicated events
    (and their scans, already parsed by `scans`, if the caller has them); *tick* is called
    after each Spark action (for progress)."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    dist, home_fps, state, cached = _distances(events, config, parsed)
    dist = dist.cache()
    try:
        homes = {
            r["node"]: {k: round(v, 2) for k, v in sorted(r["home_fp"].items())}
            for r in sorted(home_fps.collect(), key=lambda r: str(r["node"]))
        }
        tick()
        rooms = group_rooms(_desks(events, config, state), config.room_span_m)
        tick()
        hist = [
            (r["bin"] * HIST_BIN_DB + HIST_BIN_DB / 2, r["count"])
            for r in dist.groupBy(F.floor(F.col("distance") / HIST_BIN_DB).alias("bin"))
            .count()
            .collect()
        ]
        tick()
        cut = otsu_threshold(hist)
        thr = min(
            config.max_threshold_db,
            max(config.min_threshold_db, cut if cut is not None else config.max_threshold_db),
        )
        # Both at their desks: together when the desks are in one room (a decision per
        # pair, not per window); otherwise, or without desks, when the radios are near.
        room = F.from_json(F.lit(json.dumps(rooms, sort_keys=True)), "map<string,string>")
        ra, rb = F.element_at(room, F.col("a")), F.element_at(room, F.col("b"))
        together = F.when(F.col("home") & ra.isNotNull() & rb.isNotNull(), ra == rb).otherwise(
            F.col("distance") <= thr
        )
        run = F.col("window") - F.row_number().over(Window.partitionBy("a", "b").orderBy("window"))
        runs = (
            dist.where(together)
            .withColumn("run", run)
            .groupBy("a", "b", "run")
            .agg(F.min("window").alias("start"), F.max("window").alias("end"))
            .cache()
        )
        # A run is an island of consecutive windows (each window once per pair), so a pair's
        # windows together are its runs' lengths summed, and its episodes its runs: pairs and
        # the episode count in one action.
        per_pair = runs.groupBy("a", "b").agg(
            F.sum(F.col("end") - F.col("start") + 1).alias("together"),
            F.count(F.lit(1)).alias("episodes"),
        )
        rows = (
            dist.groupBy("a", "b")
            .agg(F.count(F.lit(1)).alias("both"))
            .join(per_pair, ["a", "b"])
            .orderBy("a", "b")
            .collect()
        )
        tick()
        pairs = [
            {
                "a": r["a"],
                "b": r["b"],
                "together": r["together"],
                "both_seen": r["both"],
                "share": round(r["together"] / r["both"], 4),
            }
            for r in rows
        ]
        n_episodes = sum(r["episodes"] for r in rows)
        episodes = [
            [
                r["a"],
                r["b"],
                _iso(r["start"] * config.window_seconds),
                _iso((r["end"] + 1) * config.window_seconds),
            ]
            for r in runs.orderBy("start", "a", "b").limit(config.max_episodes).collect()
        ]
        tick()
        runs.unpersist()
    finally:
        dist.unpersist()
        for frame in cached:
            frame.unpersist()
    return {
        "window_seconds": config.window_seconds,
        "threshold_db": round(thr, 3),
        "floor_dbm": config.floor_dbm,
        "min_common": config.min_common,
        "home_threshold_db": config.home_threshold_db,
        "room_span_m": config.room_span_m,
        "homes": homes,
        "rooms": rooms,
        "scan_types": list(config.scan_types),
        "attributes": {"node": config.node, "radios": config.radios},
        "histogram": [[round(v, 3), n] for v, n in sorted(hist)],
        "pairs": pairs,
        "episodes": episodes,
        "episodes_total": n_episodes,
    }


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()
