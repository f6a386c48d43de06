"""Which way the event log's writer turns rows into a table: the compiled reader of the
router's msgpack (`_columns.pyx`), or the reference, `unpack` then `build_table`.

The compiled one is used when `setup.py` built it (with Cython and a C compiler), from the
`.pyx` as it is now (the hash in the `.src-sha256` beside the extension), and
``AA_PURE_PYTHON`` is not set — the same switch as the event path's (`aa.mesh._speedups`).
It writes the same table of the same rows; for the rows it does not write exactly
(`_columns` says which), it returns None and the writer takes the reference path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

import pyarrow as pa

from aa.mesh import load_pyx

from .table import SCHEMA

__all__ = ["COMPILED", "table_from_chunks"]

_HERE = Path(__file__).resolve().parent

_COLUMNS: Final = load_pyx(__package__ or "aa.router.eventlog", _HERE, "_columns")

#: Whether the compiled reader is in use.
COMPILED: Final = _COLUMNS is not None


def table_from_chunks(
    chunks: Sequence[tuple[float, int, bytes, tuple[int, Sequence[str]] | None]], logged_by: str
) -> pa.Table | None:
    """The `SCHEMA` table of the rows of *chunks* (`aa.router.eventlog.writer.Chunk`), as
    `build_table` makes it of them decoded; None without the compiled reader, or when a
    row needs the reference path."""
    if _COLUMNS is None:
        return None
    table: pa.Table | None = _COLUMNS.table_from_chunks(chunks, logged_by, SCHEMA)
    return table
