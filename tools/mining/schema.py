"""Schema mining: what each event type carries, and which attributes of different types
carry the same information under other names (``quote.StockSymbol`` ↔ ``ticker.Symbol``).

Profile, per event type and attribute: the value types seen (counts), how often the
attribute is present (``frequency``, of the type's events), numbers' range, mean, spread and
quantiles, and strings' (and booleans') number of distinct values and most frequent values.

Correspondences, between attributes of *different* types, found from values alone:

- Strings: the sets of distinct values are compared (attributes with more than
  `SchemaConfig.max_distinct` values, such as ids, are left out). With I = |A ∩ B|,
  Jaccard J = I / |A ∪ B| and containment C = I / min(|A|, |B|), the confidence is
  (J + C) / 2, scaled down by min(1, I / `min_shared`): two sets sharing one value prove little.
- Numbers: the distributions must be alike (similarity 1 − mean gap between their 5 %, 25 %,
  50 %, 75 % and 95 % quantiles / the narrower 5–95 % spread), and
  the values must move together in time: the mean per `bucket_seconds` time bucket is taken
  in each type and the Pearson correlation over the buckets both have. Where the two types
  already have a string correspondence (a key such as the symbol), buckets are split by that
  key's value too, so a quote's price is compared with the same symbol's ticker price.
  Confidence = max(0, correlation) × distribution similarity.

Type mappings follow: type A maps onto type B when every attribute B nearly always has
(`required_frequency`) has a counterpart in A, each used once; the schema adapter uses
these to republish A's events as B's.

``data`` of the artefact::

    {"types": {type: {"events": n, "attributes": {attr: {...profile...}}}},
     "correspondences": [{"a": [type, attr], "b": [type, attr], "kind": "strings"|"numbers",
                          "confidence": c, "evidence": {...}}],
     "mappings": [{"from": A, "to": B, "attributes": {attr_a: attr_b}, "confidence": c}]}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from aa.mesh import UsageError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SchemaConfig", "mine_schema", "type_mappings", "QUANTILES"]

#: Quantiles kept for numbers (and compared between them).
QUANTILES: Final = (0.05, 0.25, 0.5, 0.75, 0.95)
#: Digits kept of a mean or a spread (see `_significant`): far more than the data hold, far
#: fewer than a double's 15-17, whose last ones vary with the order of summation.
SIGNIFICANT_DIGITS: Final = 9
_NUMERIC: Final = ("int", "float")
_DISCRETE: Final = ("str", "bool")
_TYPE_NAMES: Final = (
    "null",
    "bool",
    "int",
    "float",
    "str",
    "bytes",
    "datetime",
    "naive-datetime",
    "list",
    "map",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemaConfig:
    """Settings of schema mining."""

    #: Most frequent values kept per string attribute.
    top_values: int = 10
    #: String attributes with more distinct values than this are profiled but not compared
    #: (ids: comparing them costs a join over every value and finds nothing).
    max_distinct: int = 50_000
    #: Width of the time buckets numbers are aligned in, seconds.
    bucket_seconds: int = 60
    #: Buckets (or bucket × key cells) two numbers must share to be compared.
    min_common_buckets: int = 10
    #: Shared values for full confidence in a string correspondence.
    min_shared: int = 2
    #: Least distribution similarity for two numbers to be compared in time.
    min_similarity: float = 0.5
    #: Least confidence for a correspondence to be reported.
    min_confidence: float = 0.6
    #: An attribute present in at least this share of a type's events must be mapped for
    #: the type to map.
    required_frequency: float = 0.9

    def __post_init__(self) -> None:
        for name in (
            "top_values",
            "max_distinct",
            "bucket_seconds",
            "min_common_buckets",
            "min_shared",
        ):
            if getattr(self, name) < 1:
                raise UsageError(f"SchemaConfig.{name} must be at least 1")
        for name in ("min_similarity", "min_confidence", "required_frequency"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UsageError(f"SchemaConfig.{name} must be in [0, 1]")


def _long(events: DataFrame) -> DataFrame:
    """One row per (event, attribute): type, time, attr, text, vtype.

    The attributes are the keys of either map (a key of one only has null for the other),
    each looked up in both: the rows ``map_zip_with`` would give, without its lambda, which
    Spark interprets per event where the key union and the lookups are compiled."""
    from pyspark.sql import functions as F

    keys = F.array_union(F.map_keys("values"), F.map_keys("values_types"))
    return events.select(
        "type", "time", "values", "values_types", F.explode(keys).alias("attr")
    ).select(
        "type",
        "time",
        "attr",
        F.col("values")[F.col("attr")].alias("text"),
        F.col("values_types")[F.col("attr")].alias("vtype"),
    )


def _profile(long: DataFrame, by_type: Mapping[str, int]) -> dict[str, Any]:
    from pyspark.sql import functions as F

    is_num = F.col("vtype").isin(*_NUMERIC)
    num = F.when(is_num, F.col("text").cast("double"))
    aggs = [F.count(F.lit(1)).alias("n")]
    aggs += [
        F.sum(F.when(F.col("vtype") == t, 1).otherwise(0)).alias(f"t_{i}")
        for i, t in enumerate(_TYPE_NAMES)
    ]
    aggs += [
        F.min(num).alias("min"),
        F.max(num).alias("max"),
        F.avg(num).alias("mean"),
        F.stddev_pop(num).alias("stddev"),
        # Exact, not `percentile_approx`: its sketches merge differently as the rows are
        # partitioned differently, and the quantiles decide which numbers are compared.
        F.percentile(num, list(QUANTILES)).alias("q"),
        F.approx_count_distinct(F.when(F.col("vtype").isin(*_DISCRETE), F.col("text"))).alias(
            "distinct"
        ),
    ]
    types: dict[str, Any] = {t: {"events": n, "attributes": {}} for t, n in sorted(by_type.items())}
    for r in long.groupBy("type", "attr").agg(*aggs).collect():
        vtypes = {t: r[f"t_{i}"] for i, t in enumerate(_TYPE_NAMES) if r[f"t_{i}"]}
        prof: dict[str, Any] = {
            "types": vtypes,
            "count": r["n"],
            "frequency": round(r["n"] / max(1, by_type.get(r["type"], 0)), 6),
        }
        if r["min"] is not None:
            prof.update(
                min=r["min"],
                max=r["max"],
                mean=_significant(r["mean"]),
                stddev=_significant(r["stddev"]),
                quantiles=list(r["q"] or []),
            )
        if any(t in vtypes for t in _DISCRETE):
            prof["distinct"] = r["distinct"]
        types.setdefault(r["type"], {"events": 0, "attributes": {}})["attributes"][r["attr"]] = prof
    for t in types.values():
        t["attributes"] = dict(sorted(t["attributes"].items()))
    return types


def _significant(x: float | None) -> float | None:
    """*x* to `SIGNIFICANT_DIGITS`: a floating-point sum's last bits depend on the order it
    adds in, which depends on the partitioning; the artefact must not."""
    return None if x is None else float(f"{x:.{SIGNIFICANT_DIGITS}g}")


def _kind(prof: Mapping[str, Any]) -> str | None:
    """ "numbers", "strings" or None: what an attribute is compared as (its main type)."""
    vt = prof["types"]
    total = sum(vt.values()) or 1
    if sum(vt.get(t, 0) for t in _NUMERIC) / total >= 0.9:
        return "numbers"
    if sum(vt.get(t, 0) for t in _DISCRETE) / total >= 0.9:
        return "strings"
    return None


def _strings(
    long: DataFrame, types: Mapping[str, Any], cfg: SchemaConfig, tick: Callable[[], None]
) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    keys = [
        (t, a)
        for t, tp in types.items()
        for a, p in tp["attributes"].items()
        if _kind(p) == "strings" and p.get("distinct", 0) <= cfg.max_distinct
    ]
    for tp in types.values():  # top values, for every string attribute
        for p in tp["attributes"].values():
            if _kind(p) == "strings":
                p["top"] = []
    if not keys:
        return []
    wanted = F.concat_ws("\u0000", "type", "attr").isin(*[f"{t}\u0000{a}" for t, a in keys])
    vals = (
        long.where(F.col("vtype").isin(*_DISCRETE) & wanted)
        .groupBy("type", "attr", "text")
        .agg(F.count(F.lit(1)).alias("n"))
        .cache()
    )
    try:
        # Top values and the number of distinct values per attribute, in one action.
        attr = Window.partitionBy("type", "attr")
        ranked = vals.withColumn(
            "rank", F.row_number().over(attr.orderBy(F.desc("n"), "text"))
        ).withColumn("size", F.count(F.lit(1)).over(attr))
        sizes: dict[tuple[str, str], int] = {}
        for r in (
            ranked.where(F.col("rank") <= cfg.top_values).orderBy("type", "attr", "rank").collect()
        ):
            types[r["type"]]["attributes"][r["attr"]]["top"].append([r["text"], r["n"]])
            sizes[(r["type"], r["attr"])] = r["size"]
        tick()
        a, b = vals.alias("a"), vals.alias("b")
        # The self-join on the value is the costly step: bounded by max_distinct per attribute.
        pairs = (
            a.join(b, (F.col("a.text") == F.col("b.text")) & (F.col("a.type") < F.col("b.type")))
            .groupBy(
                F.col("a.type").alias("ta"),
                F.col("a.attr").alias("aa"),
                F.col("b.type").alias("tb"),
                F.col("b.attr").alias("ab"),
            )
            .count()
            .collect()
        )
        tick()
    finally:
        vals.unpersist()
    out = []
    # Sorted: the order Spark collects in depends on the partitioning (`_numbers` picks keys
    # from this list).
    for r in sorted(pairs, key=lambda r: (r["ta"], r["aa"], r["tb"], r["ab"])):
        inter, na, nb = r["count"], sizes[(r["ta"], r["aa"])], sizes[(r["tb"], r["ab"])]
        jaccard = inter / (na + nb - inter)
        containment = inter / min(na, nb)
        conf = (jaccard + containment) / 2 * min(1.0, inter / cfg.min_shared)
        if conf >= cfg.min_confidence:
            out.append(
                {
                    "a": [r["ta"], r["aa"]],
                    "b": [r["tb"], r["ab"]],
                    "kind": "strings",
                    "confidence": round(conf, 4),
                    "evidence": {
                        "shared": inter,
                        "distinct_a": na,
                        "distinct_b": nb,
                        "jaccard": round(jaccard, 4),
                        "containment": round(containment, 4),
                    },
                }
            )
    return out


def _similarity(pa: Mapping[str, Any], pb: Mapping[str, Any]) -> float:
    qa, qb = pa.get("quantiles") or [], pb.get("quantiles") or []
    if len(qa) != len(QUANTILES) or len(qb) != len(QUANTILES):
        return 0.0
    # Measured against the narrower spread: a wide distribution (prices) must not look
    # like a narrow one (humidity) because the narrow one sits inside it.
    spread = min(qa[-1] - qa[0], qb[-1] - qb[0])
    gap = sum(abs(x - y) for x, y in zip(qa, qb)) / len(qa)
    if spread <= 0:
        return 1.0 if gap == 0 else 0.0
    similarity: float = max(0.0, 1.0 - gap / spread)
    return similarity


def _key(strings: list[dict[str, Any]], ta: str, tb: str) -> dict[str, Any] | None:
    """The string correspondence of types *ta* and *tb* that numbers are split by: the most
    confident; of equally confident ones the one sharing the most values (the most specific
    key: a stock symbol rather than a currency), then by name, so that the choice never
    depends on the order the candidates came in."""
    keys = [c for c in strings if c["a"][0] == ta and c["b"][0] == tb]
    return min(
        keys,
        key=lambda c: (-c["confidence"], -c["evidence"]["shared"], c["a"], c["b"]),
        default=None,
    )


def _numbers(
    events: DataFrame,
    types: Mapping[str, Any],
    strings: list[dict[str, Any]],
    cfg: SchemaConfig,
    tick: Callable[[], None],
) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    nums = {
        t: [a for a, p in tp["attributes"].items() if _kind(p) == "numbers"]
        for t, tp in types.items()
    }
    # Candidate pairs, grouped by type pair: only alike distributions are compared in time.
    cands: dict[tuple[str, str], list[tuple[str, str, float]]] = {}
    names = sorted(nums)
    for i, ta in enumerate(names):
        for tb in names[i + 1 :]:
            for aa in nums[ta]:
                for ab in nums[tb]:
                    sim = _similarity(types[ta]["attributes"][aa], types[tb]["attributes"][ab])
                    if sim >= cfg.min_similarity:
                        cands.setdefault((ta, tb), []).append((aa, ab, sim))
    out = []
    for (ta, tb), pairs in sorted(cands.items()):
        key = _key(strings, ta, tb)
        ka, kb = (key["a"][1], key["b"][1]) if key else (None, None)

        def series(t: str, key_attr: str | None, attrs: list[str], side: str) -> DataFrame:
            bucket = (F.unix_timestamp("time") / cfg.bucket_seconds).cast("long").alias("bucket")
            k = (F.col("values")[key_attr] if key_attr else F.lit("")).alias("key")
            cols = [
                F.col("values")[x].cast("double").alias(f"{side}{j}") for j, x in enumerate(attrs)
            ]
            df = events.where(F.col("type") == t).select(bucket, k, *cols)
            return df.groupBy("bucket", "key").agg(
                *[F.avg(f"{side}{j}").alias(f"{side}{j}") for j in range(len(attrs))]
            )

        la = sorted({p[0] for p in pairs})
        lb = sorted({p[1] for p in pairs})
        joined = series(ta, ka, la, "a").join(series(tb, kb, lb, "b"), ["bucket", "key"])
        aggs = [F.count(F.lit(1)).alias("cells")]
        for n, (aa, ab, _) in enumerate(pairs):
            aggs.append(F.corr(f"a{la.index(aa)}", f"b{lb.index(ab)}").alias(f"c{n}"))
        row = joined.agg(*aggs).collect()[0]
        tick()
        if row["cells"] < cfg.min_common_buckets:
            continue
        for n, (aa, ab, sim) in enumerate(pairs):
            corr = row[f"c{n}"]
            if corr is None or corr != corr:  # constant series: NaN
                continue
            conf = max(0.0, corr) * sim
            if conf >= cfg.min_confidence:
                out.append(
                    {
                        "a": [ta, aa],
                        "b": [tb, ab],
                        "kind": "numbers",
                        "confidence": round(conf, 4),
                        "evidence": {
                            "correlation": round(corr, 4),
                            "similarity": round(sim, 4),
                            "cells": row["cells"],
                            "key": [ka, kb] if key else None,
                        },
                    }
                )
    return out


def type_mappings(
    types: Mapping[str, Any],
    correspondences: list[dict[str, Any]],
    *,
    required_frequency: float = 0.9,
) -> list[dict[str, Any]]:
    """Type A → type B where every attribute B nearly always has has a counterpart in A
    (best confidence first, each of A's attributes used once)."""
    out = []
    for ta in sorted(types):
        for tb in sorted(types):
            if ta == tb:
                continue
            need = [
                a
                for a, p in types[tb]["attributes"].items()
                if p["frequency"] >= required_frequency
            ]
            if not need:
                continue
            links = []
            for c in correspondences:
                if c["a"][0] == ta and c["b"][0] == tb:
                    links.append((c["confidence"], c["a"][1], c["b"][1]))
                elif c["b"][0] == ta and c["a"][0] == tb:
                    links.append((c["confidence"], c["b"][1], c["a"][1]))
            mapping: dict[str, str] = {}
            confs = []
            for conf, src, dst in sorted(links, reverse=True):
                if src not in mapping and dst not in mapping.values():
                    mapping[src] = dst
                    confs.append(conf)
            if set(need) <= set(mapping.values()):
                out.append(
                    {
                        "from": ta,
                        "to": tb,
                        "attributes": dict(sorted(mapping.items())),
                        "confidence": min(confs),
                    }
                )
    return out


def mine_schema(
    events: DataFrame,
    config: SchemaConfig,
    *,
    by_type: Mapping[str, int],
    tick: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """The schema artefact's ``data`` (see the module docstring) from de-duplicated events;
    *tick* is called after each Spark action (for progress)."""
    long = _long(events)
    types = _profile(long, by_type)
    tick()
    strings = _strings(long, types, config, tick)
    numbers = _numbers(events, types, strings, config, tick)
    corr = sorted(strings + numbers, key=lambda c: (c["a"], c["b"], c["kind"]))
    return {
        "types": types,
        "correspondences": corr,
        "mappings": type_mappings(types, corr, required_frequency=config.required_frequency),
    }
