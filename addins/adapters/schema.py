"""The schema adapter: republishes events under the other schema a mined type mapping
names (``quote {StockSymbol, Price, Currency}`` → ``ticker {Symbol, Last, Ccy}``), so a
subscriber of one schema hears the publishers of the other.

Only mappings at or above `min_confidence` are used; each maps every attribute the target
type nearly always has (see `aa.tools.mining.schema`), and an event missing one of the
mapped attributes is not republished (it would be an incomplete event of the other type).
"""

from __future__ import annotations

import os
from typing import Any

from aa.mesh import Event

from .artefact import Artefact
from .base import Adapter, Output

__all__ = ["SchemaAdapter"]


class SchemaAdapter(Adapter):
    """Republishes events under the mined equivalent schemas.

    >>> adapter = SchemaAdapter("adapters")
    >>> adapter.reload()
    True
    >>> adapter.handle(Event(values={"StockSymbol": "ABB", "Price": 45.1, "Currency": "CHF"},
    type="quote")) [('ticker', {'Ccy': 'CHF', 'Last': 45.1, 'Symbol': 'ABB'})]
    """

    task = "schema"
    name = "schema"

    def __init__(self, adapters: str | os.PathLike[str], *, min_confidence: float = 0.6) -> None:
        super().__init__(adapters)
        self.min_confidence = min_confidence
        #: source type → [(target type, {source attr: target attr})]
        self.mappings: dict[str, list[tuple[str, dict[str, str]]]] = {}

    def input_types(self) -> set[str]:
        return set(self.mappings)

    def _load(self, artefact: Artefact) -> None:
        mappings: dict[str, list[tuple[str, dict[str, str]]]] = {}
        for m in artefact.data.get("mappings", []):
            if float(m["confidence"]) >= self.min_confidence and m["from"] != m["to"]:
                attrs = {str(k): str(v) for k, v in dict(m["attributes"]).items()}
                mappings.setdefault(str(m["from"]), []).append((str(m["to"]), attrs))
        self.mappings = mappings

    def _handle(self, event: Event, now: float | None) -> list[Output]:
        out = []
        for target, attrs in self.mappings.get(event.type or "", ()):
            if all(a in event.values for a in attrs):
                values: dict[str, Any] = {dst: event.values[src] for src, dst in attrs.items()}
                out.append((target, dict(sorted(values.items()))))
        return out
