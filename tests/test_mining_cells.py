"""Location mining's cells, pooled by Spark per (radio, cell, kind, name) and merged on the
driver: the merge gives what one Spark group per cell with ``min`` of the kind and the name
gives, so the artefact does not change (no JVM: the rows are Spark's Row objects)."""

from __future__ import annotations

from pyspark.sql import Row

from aa.tools.mining.location import _merge_cells


def _row(kind: str, name: str | None, n: int, x: int | None, cx: int = 3) -> Row:
    return Row(
        radio="02:a0",
        building="B1",
        floor=1,
        cx=cx,
        cy=4,
        kind=kind,
        name=name,
        n=n,
        rssi=-700_000 * n,
        x=x,
        y=None if x is None else 2 * x,
    )


def test_one_group_per_cell_is_passed_through() -> None:
    (cell,) = _merge_cells([_row("wifi-scan", "office", 3, 60_000)])
    assert cell == {
        "radio": "02:a0",
        "building": "B1",
        "floor": 1,
        "cx": 3,
        "cy": 4,
        "kind": "wifi-scan",
        "name": "office",
        "n": 3,
        "rssi": -2_100_000,
        "x": 60_000,
        "y": 120_000,
    }


def test_groups_of_one_cell_add_up_and_keep_the_least_kind_and_name() -> None:
    rows = [
        _row("wifi-scan", "office-B", 2, 10),
        _row("bt-scan", None, 5, None),
        _row("wifi-scan", "office-A", 1, 7),
        _row("wifi-scan", "other", 4, 1, cx=9),  # another cell
    ]
    merged = {c["cx"]: c for c in _merge_cells(rows)}
    assert merged[3] == {
        "radio": "02:a0",
        "building": "B1",
        "floor": 1,
        "cx": 3,
        "cy": 4,
        "kind": "bt-scan",  # the least, as Spark's min
        "name": "office-A",  # the least not null, as Spark's min
        "n": 8,
        "rssi": -5_600_000,
        "x": 17,  # nulls left out of the sum, as Spark's sum
        "y": 34,
    }
    assert merged[9]["n"] == 4 and merged[9]["name"] == "other"


def test_a_cell_whose_positions_all_lack_coordinates_keeps_a_null_sum() -> None:
    (cell,) = _merge_cells([_row("bt-scan", "b", 1, None), _row("bt-scan", "a", 2, None)])
    assert cell["x"] is None and cell["y"] is None and cell["n"] == 3 and cell["name"] == "a"
