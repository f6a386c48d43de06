"""aa.router.eventlog — the event log for mining: every event a router dispatches, written
as Hive-partitioned Parquet files that Spark (and pyarrow, pandas, DuckDB) read natively.

Owns: the router's side (`EventLog`: rows collected per batch, handed to a writer process),
the writer process (`process`, `writer`: Parquet files, rotation, bounds), the row
layout (`SCHEMA`, `build_table`) and the lossless text of values (`encode_value`,
`decode_value`, `encode_json`, `decode_json`).

Does not own: the mining job that reads the log (`aa.tools.mining`), or when events are
collected for it (`aa.router.sinks`, once per batch, sharing the mesh cache's encoding).
"""

from typing import TYPE_CHECKING, Any

from .codec import TYPE_NAMES, decode_json, decode_value, encode_json, encode_value
from .process import RESTART_DELAY, STOP_TIMEOUT, WRITER_NICE, Chunk, WriterProcess, safe_name
from .recorder import EVENTLOG_DIR, EventLog, EventLogConfig, EventLogStats

if TYPE_CHECKING:
    from .table import SCHEMA, build_table
    from .writer import Writer

__all__ = [
    "Chunk",
    "EVENTLOG_DIR",
    "EventLog",
    "EventLogConfig",
    "EventLogStats",
    "RESTART_DELAY",
    "SCHEMA",
    "STOP_TIMEOUT",
    "TYPE_NAMES",
    "WRITER_NICE",
    "Writer",
    "WriterProcess",
    "build_table",
    "decode_json",
    "decode_value",
    "encode_json",
    "encode_value",
    "safe_name",
]


def __getattr__(name: str) -> Any:
    """The Parquet side (`SCHEMA`, `build_table`, `Writer`) on first use: pyarrow is loaded
    by the writer process and by readers of the log, not by every router that imports this
    package."""
    if name in ("SCHEMA", "build_table"):
        from . import table

        return getattr(table, name)
    if name == "Writer":
        from .writer import Writer

        return Writer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
