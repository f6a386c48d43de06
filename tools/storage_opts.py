"""The storage options of `aa router`: the store, the event log, the caches."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from .defaults import CACHE_SWEEP_INTERVAL, MESH_CACHE_MAX_EVENTS, STORE_SYNC_INTERVAL

__all__ = ["add_storage_options", "storage_config"]

ENV_STORE_URL = "AA_STORE_URL"


def add_storage_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "storage",
        "The persistent store keeps the events their publishers ask to persist (aa send --persist) "
        "and replays them to subscribers that ask for history; the mesh cache keeps the newest "
        "events in memory for clients that ask; the event log writes every event to Parquet "
        "files for mining (DATA_DIR/eventlog).",
    )
    g.add_argument(
        "--store-url",
        metavar="URL",
        help="SQLAlchemy URL of the store, e.g. postgresql+psycopg://aa@db/aa (default: "
        f"${ENV_STORE_URL}, else the SQLite file DATA_DIR/events.db; no store without either)",
    )
    g.add_argument("--no-store", action="store_true", help="keep no persistent store")
    g.add_argument(
        "--store-sync-interval",
        type=float,
        metavar="S",
        default=STORE_SYNC_INTERVAL,
        help="seconds between two comparisons of this router's store with each peer's, which "
        "send each side the persisted events it lacks; they also run whenever a link comes up; "
        f"0 for only then (default: {STORE_SYNC_INTERVAL:g})",
    )
    g.add_argument(
        "--event-log",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="append every event to the Parquet event log in DATA_DIR/eventlog, written by a "
        "process of its own; a file is readable once closed: every 10 minutes, at the hour's "
        "end, and when the router stops (default: on with --data-dir, off without)",
    )
    g.add_argument(
        "--mesh-cache-events",
        type=int,
        metavar="N",
        default=MESH_CACHE_MAX_EVENTS,
        help="events the in-memory mesh cache keeps, 0 for none (default: "
        f"{MESH_CACHE_MAX_EVENTS})",
    )
    g.add_argument(
        "--cache-sweep-interval",
        type=float,
        metavar="S",
        default=CACHE_SWEEP_INTERVAL,
        help=f"seconds between sweeps of client caches whose keep-alive lapsed "
        f"(default: {CACHE_SWEEP_INTERVAL:g})",
    )


def storage_config(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`RouterConfig` fields from the storage options. Raises `UsageError`."""
    from aa.mesh import UsageError
    from aa.router import CacheConfig, EventLogConfig, StoreConfig

    env = os.environ if environ is None else environ
    url = args.store_url or env.get(ENV_STORE_URL) or None
    if args.no_store and args.store_url:
        raise UsageError("--no-store and --store-url contradict each other")
    if not args.store_sync_interval >= 0:  # NaN too
        raise UsageError("--store-sync-interval must be a number of seconds ≥ 0")
    if args.event_log and args.data_dir is None:
        raise UsageError("--event-log needs --data-dir")
    return {
        "store": None
        if args.no_store
        else StoreConfig(url=url, sync_interval=args.store_sync_interval),
        # None (no flag): on, as it is by default whenever there is a data folder.
        "event_log": None if args.event_log is False else EventLogConfig(),
        "caches": CacheConfig(
            mesh_cache_events=args.mesh_cache_events, sweep_interval=args.cache_sweep_interval
        ),
    }
