"""How right the mined artefacts are: precision and recall of each against the simulated
office's ground truth (`aa.addins.office.OfficeWorld.ground_truth_for`).

- schema: a found correspondence is a pair of (type, attribute) of different types. The
  world lists the attributes that carry the same data *under other names*
  (quote.StockSymbol ↔ ticker.Symbol, …), so those with different names are scored;
  same-name ones (wifi-scan.Node ↔ bt-scan.Node, true but trivial) are counted apart.
- location: a radio is right when placed in its building and on its floor. Precision is
  right / placed, recall right / radios in the world; also the distance error (metres, on
  the right floor) and the share placed in the right room.
- presence: the unit is (person, person, minute): the world says who was in one room each
  minute (step window); a mined episode of two phones covers the minutes in it. Phones
  only, because the world's truth is about people and a phone is always with its owner
  (a laptop stays on the desk over lunch).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from .artefacts import ArtefactError, read_artefact

__all__ = ["accuracy_report", "score_schema", "score_location", "score_presence", "format_report"]


def _pr(tp: int, predicted: int, actual: int) -> dict[str, Any]:
    p = tp / predicted if predicted else (1.0 if not actual else 0.0)
    r = tp / actual if actual else 1.0
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    return {
        "precision": round(p, 4),
        "recall": round(r, 4),
        "f1": round(f1, 4),
        "true_positives": tp,
        "predicted": predicted,
        "actual": actual,
    }


def _key(ta: str, aa: str, tb: str, ab: str) -> tuple[tuple[str, str], tuple[str, str]]:
    a, b = (ta, aa), (tb, ab)
    return (a, b) if a <= b else (b, a)


def score_schema(data: Mapping[str, Any], truth: list[tuple[str, str, str, str]]) -> dict[str, Any]:
    found = {_key(*c["a"], *c["b"]) for c in data.get("correspondences", [])}
    renamed = {k for k in found if k[0][1] != k[1][1]}
    actual = {_key(*t) for t in truth}
    out = _pr(len(renamed & actual), len(renamed), len(actual))
    out["same_name_found"] = len(found - renamed)
    out["missed"] = [list(map(list, k)) for k in sorted(actual - renamed)]
    out["wrong"] = [list(map(list, k)) for k in sorted(renamed - actual)]
    pairs = {(t[0], t[2]) for t in truth} | {(t[2], t[0]) for t in truth}
    mapped = {(m["from"], m["to"]) for m in data.get("mappings", [])}
    out["mappings"] = _pr(len(mapped & pairs), len(mapped), len(pairs))
    return out


def _room(building: str, floor: int, x: float, y: float) -> str:
    from aa.addins.office import ROOMS, room_name

    for name, (x0, y0, x1, y1) in ROOMS.items():
        if x0 <= x < x1 and y0 <= y < y1:
            return room_name(building, floor, name)
    return room_name(building, floor, "lounge")


def score_location(data: Mapping[str, Any], radio_place: Mapping[str, Any]) -> dict[str, Any]:
    placed = data.get("radios", {})
    right, errors, rooms = 0, [], 0
    wrong = []
    for rid, p in placed.items():
        true = radio_place.get(rid)
        if true is None:
            continue
        if p["building"] == true.building and p["floor"] == true.floor:
            right += 1
            errors.append(math.hypot(p["x"] - true.x, p["y"] - true.y))
            rooms += _room(p["building"], p["floor"], p["x"], p["y"]) == true.room
        else:
            wrong.append(
                {
                    "radio": rid,
                    "placed": f"{p['building']}/{p['floor']}",
                    "true": f"{true.building}/{true.floor}",
                    "confidence": p.get("confidence"),
                }
            )
    out = _pr(right, len(placed), len(radio_place))
    out["room_share"] = round(rooms / right, 4) if right else 0.0
    if errors:
        errors.sort()
        out["error_m"] = {
            "mean": round(statistics.fmean(errors), 2),
            "median": round(statistics.median(errors), 2),
            "p90": round(errors[min(len(errors) - 1, int(0.9 * len(errors)))], 2),
        }
    out["wrong"] = wrong
    return out


def score_presence(
    data: Mapping[str, Any],
    colocated: frozenset[tuple[str, str, datetime]],
    people: list[Any],
    start: datetime,
    end: datetime,
    step: timedelta,
) -> dict[str, Any]:
    phone = {p.phone: p.name for p in people}
    step_s = step.total_seconds()
    t0, t1 = start.timestamp(), end.timestamp()
    predicted: set[tuple[str, str, int]] = set()
    episodes = data.get("episodes", [])
    if len(episodes) < data.get("episodes_total", len(episodes)):
        t1 = min(
            t1, max(datetime.fromisoformat(e[2]).timestamp() for e in episodes)
        )  # score what was kept
    for na, nb, start_iso, end_iso in episodes:
        a, b = phone.get(na), phone.get(nb)
        if a is None or b is None or a == b:
            continue
        a, b = min(a, b), max(a, b)
        s = max(datetime.fromisoformat(start_iso).timestamp(), t0)
        f = min(datetime.fromisoformat(end_iso).timestamp(), t1)
        k = math.floor(s / step_s)
        while k * step_s < f:
            predicted.add((a, b, k))
            k += 1
    actual = {
        (a, b, math.floor(t.timestamp() / step_s)) for a, b, t in colocated if t.timestamp() < t1
    }
    out = _pr(len(predicted & actual), len(predicted), len(actual))
    out["unit"] = f"(person, person, {int(step_s)} s window)"
    out["threshold_db"] = data.get("threshold_db")
    return out


def accuracy_report(adapters: str | Path, world_folder: str | Path) -> dict[str, Any]:
    """Score each artefact in *adapters* against the world simulated in *world_folder*
    (see `aa.tools.mining.simulate`). A task without an artefact is reported as missing."""
    from .simulate import load_world

    world, start, end, step = load_world(world_folder)
    truth = world.ground_truth_for(start, end, step=step)
    report: dict[str, Any] = {
        "world": str(world_folder),
        "span": [start.isoformat(), end.isoformat()],
    }
    for task in ("schema", "location", "presence"):
        try:
            art = read_artefact(Path(adapters) / task)
        except ArtefactError as exc:
            report[task] = {"missing": str(exc)}
            continue
        if task == "schema":
            score = score_schema(art.data, truth.correspondences)
        elif task == "location":
            score = score_location(art.data, truth.radio_place)
        else:
            score = score_presence(art.data, truth.colocated, world.people, start, end, step)
        report[task] = {"version": art.version, **score}
    return report


def format_report(report: Mapping[str, Any]) -> str:
    """The report as a few readable lines."""
    lines = [
        f"accuracy against the simulated office {report['world']} ({report['span'][0]} .. "
        f"{report['span'][1]})"
    ]
    for task in ("schema", "location", "presence"):
        r = report.get(task)
        if r is None:
            continue
        if "missing" in r:
            lines.append(f"  {task:9} no artefact ({r['missing']})")
            continue
        line = (
            f"  {task:9} v{r['version']}: precision {r['precision']:.3f}  recall {r['recall']:.3f} "
            f" ({r['true_positives']} right of {r['predicted']} found, {r['actual']} true)"
        )
        lines.append(line)
        if task == "schema":
            m = r["mappings"]
            lines.append(
                f"            type mappings: precision {m['precision']:.3f} recall "
                f"{m['recall']:.3f}; same-name correspondences also found: {r['same_name_found']}"
            )
        if task == "location" and "error_m" in r:
            e = r["error_m"]
            lines.append(
                f"            on the right floor: error mean {e['mean']} m, median {e['median']} "
                f"m, p90 {e['p90']} m; right room {r['room_share']:.0%}"
            )
        if task == "presence":
            lines.append(f"            unit {r['unit']}, learned threshold {r['threshold_db']} dB")
    return "\n".join(lines)


def write_report(report: Mapping[str, Any], path: str | Path) -> None:
    """*report* as JSON at *path* and as text beside it (``.txt``)."""
    path = Path(path)
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    path.with_suffix(".txt").write_text(format_report(report) + "\n", encoding="utf-8")


__all__ += ["write_report"]
