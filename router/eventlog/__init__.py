"""aa.router.eventlog — the event log for mining: every event a router dispatches, written
as Hive-partitioned Parquet files that Spark (and pyarrow, pandas, DuckDB) read natively.

Owns: the router's side (`EventLog`: rows collected per batch, handed to a writer process),
the writer process (`process`, `writer`: Parquet files, rotation, bounds), the row
layout (`SCHEMA`, `build_table`) and the lossless text of values (`encode_value`,
`decode_value`, `encode_json`, `decode_json`).

Does not own: the mining job that reads the log (`aa.tools.mining`), or when events are
collected for it (`aa.router.sinks`, once per batch, sharing the mesh cache's encoding).
"""

from .codec import TYPE_NAMES, decode_json, decode_value, encode_json, encode_value
from .process import RESTART_DELAY, STOP_TIMEOUT, WRITER_NICE, WriterProcess
from .recorder import EVENTLOG_DIR, EventLog, EventLogConfig, EventLogStats
from .table import SCHEMA, build_table
from .writer import Chunk, Writer, safe_name

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
