"""Placing a radio by a path-loss model fitted to what it was heard at, where (pure: no
Spark, no I/O; small inputs, on the driver).

Why a model. The loudest place a radio is heard is not always its floor: nobody may ever
stand near it on its own floor, while people sit right above it, one floor away, where it
is louder than anywhere they go on its floor. A log-distance model with a per-floor loss,
``rssi = at_1m − 10·exponent·log10(d) − floor_loss·|Δfloor|`` (d in metres, with `STOREY_M`
per floor), fitted to the radios we are already sure of, tells the two apart: the radio
hangs where the model best explains *all* its observations, near and far, on every floor.

`fit` is weighted least squares, linear in (at_1m, exponent, floor_loss); `place` is a grid
search (coarse, then fine around the best) per candidate floor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["Cell", "PathLoss", "Placement", "fit", "place", "STOREY_M"]

#: Height of a storey, metres (distance between floors in the model).
STOREY_M: Final = 3.0
#: Grid steps of the search, metres.
COARSE_M: Final = 4.0
FINE_M: Final = 1.0


@dataclass(frozen=True, slots=True)
class Cell:
    """Observations of one radio from one small area: mean position and mean signal."""

    floor: int
    x: float
    y: float
    rssi: float
    n: int


@dataclass(frozen=True, slots=True)
class PathLoss:
    """The fitted model."""

    at_1m: float
    exponent: float
    floor_loss: float

    def predict(self, d2: float, dz: int) -> float:
        """Signal at squared horizontal distance *d2* (m²) and *dz* floors apart."""
        d = math.sqrt(d2 + (STOREY_M * dz) ** 2)
        return self.at_1m - 10.0 * self.exponent * math.log10(max(d, 1.0)) - self.floor_loss * dz


#: A start for fitting, and the model used when there is too little to fit: typical Wi-Fi.
DEFAULT: Final = PathLoss(at_1m=-40.0, exponent=3.0, floor_loss=15.0)


@dataclass(frozen=True, slots=True)
class Placement:
    """Best place on one floor: root mean square error (dB) of the model there."""

    floor: int
    x: float
    y: float
    rmse: float


def fit(samples: Sequence[tuple[float, int, float, int]]) -> PathLoss:
    """The model from (distance m, floors apart, rssi, weight) samples; `DEFAULT` when they
    cannot determine it (fewer than three distinct kinds of sample, or a singular system)."""
    # Normal equations of rssi ≈ a·1 + b·(−10·log10 d) + c·(−dz).
    m = [[0.0] * 3 for _ in range(3)]
    v = [0.0] * 3
    for d, dz, rssi, w in samples:
        row = (
            1.0,
            -10.0 * math.log10(max(math.sqrt(d * d + (STOREY_M * dz) ** 2), 1.0)),
            -float(dz),
        )
        for i in range(3):
            v[i] += w * row[i] * rssi
            for j in range(3):
                m[i][j] += w * row[i] * row[j]
    sol = _solve(m, v)
    if sol is None or not (0.5 < sol[1] < 8.0) or sol[2] < 0:
        return DEFAULT
    return PathLoss(at_1m=sol[0], exponent=sol[1], floor_loss=sol[2])


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-9:
            return None
        a[col], a[piv] = a[piv], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                for c in range(col, n + 1):
                    a[r][c] -= f * a[col][c]
    return [a[i][n] / a[i][i] for i in range(n)]


def _cost(cells: Sequence[Cell], model: PathLoss, floor: int, x: float, y: float) -> float:
    # Hot: called for every grid point of every floor of every radio (pure Python).
    a, b, fl, st2 = model.at_1m, 10.0 * model.exponent, model.floor_loss, STOREY_M * STOREY_M
    log10, s = math.log10, 0.0
    for c in cells:
        dz = abs(c.floor - floor)
        d2 = (c.x - x) ** 2 + (c.y - y) ** 2 + st2 * dz * dz
        e = c.rssi - (a - b * 0.5 * log10(d2 if d2 > 1.0 else 1.0) - fl * dz)
        s += c.n * e * e
    return s


def _search(
    cells: Sequence[Cell],
    model: PathLoss,
    floor: int,
    box: tuple[float, float, float, float],
    step: float,
) -> tuple[float, float, float]:
    ax, ay, bx, by = box
    best = (math.inf, ax, ay)
    for i in range(int((bx - ax) / step) + 1):
        for j in range(int((by - ay) / step) + 1):
            x, y = ax + i * step, ay + j * step
            cost = _cost(cells, model, floor, x, y)
            if cost < best[0]:
                best = (cost, x, y)
    return best


def place(
    cells: Sequence[Cell],
    model: PathLoss,
    floors: Sequence[int],
    bounds: tuple[float, float, float, float],
) -> list[Placement]:
    """The best place on each of *floors* within *bounds* (x0, y0, x1, y1), best first."""
    total = sum(c.n for c in cells) or 1
    x0, y0, x1, y1 = bounds
    out = []
    for floor in floors:
        _, cx, cy = _search(cells, model, floor, bounds, COARSE_M)
        box = (
            max(x0, cx - COARSE_M),
            max(y0, cy - COARSE_M),
            min(x1, cx + COARSE_M),
            min(y1, cy + COARSE_M),
        )
        cost, x, y = _search(cells, model, floor, box, FINE_M)
        out.append(Placement(floor=floor, x=x, y=y, rmse=math.sqrt(cost / total)))
    out.sort(key=lambda p: p.rmse)
    return out
