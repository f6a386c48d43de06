"""aa.router.store — the persistent event store (Å §4.5): events their publishers asked
routers to keep, with per-type expiry, replayed as history to new subscriptions.

Owns: the SQL store and its writer thread (`EventStore`, SQLite in the data folder or any
SQLAlchemy URL), expiry policies (`ExpiryPolicy`, also used by the caches), history on
subscribe (`HistoryReplay`) and history queries (`StoreService.history`), anti-entropy between the
stores of linked routers (`StoreSync`) on the sans-I/O digests and caps it shares with the
client caches' sync (`ids_digest`, `parse_digest`, `Exchanges`, …), and the shape of answers to
queries (paged frames, the historical mark).

Does not own: the mesh cache and the client caches (`aa.router.caches`), the event log
(`aa.router.eventlog`), when a persisted publish is acknowledged (`aa.router.acks`).
"""

from .answers import as_spec, check_since, event_order, mark_historical, send_paged
from .antientropy import (
    EXCHANGE_TIMEOUT,
    Exchanges,
    chunks,
    differing,
    digest_entries,
    id_hash,
    ids_digest,
    parse_digest,
    parse_ids,
)
from .eventstore import MAX_STORED_TYPE_LENGTH, STORE_FILE, EventStore, StoreConfig
from .expiry import (
    META_MAX_AGE,
    META_MAX_COUNT,
    META_MESH_CACHE,
    META_PERSIST,
    ExpiryPolicy,
    event_time,
    parse_duration,
    persist_policy,
    wants_mesh_cache,
)
from .history import MAX_HELD, HistoryReplay, Hold, check_history
from .service import StoreService, check_persistable
from .sync import SYNC_TOPIC, StoreSync, digest_of
from .writer import StoreStats

__all__ = [
    "EXCHANGE_TIMEOUT",
    "Exchanges",
    "EventStore",
    "ExpiryPolicy",
    "HistoryReplay",
    "Hold",
    "MAX_HELD",
    "MAX_STORED_TYPE_LENGTH",
    "META_MAX_AGE",
    "META_MAX_COUNT",
    "META_MESH_CACHE",
    "META_PERSIST",
    "STORE_FILE",
    "StoreConfig",
    "StoreService",
    "StoreStats",
    "StoreSync",
    "SYNC_TOPIC",
    "as_spec",
    "check_history",
    "check_persistable",
    "check_since",
    "chunks",
    "differing",
    "digest_entries",
    "digest_of",
    "event_order",
    "event_time",
    "id_hash",
    "ids_digest",
    "mark_historical",
    "parse_digest",
    "parse_duration",
    "parse_ids",
    "persist_policy",
    "send_paged",
    "wants_mesh_cache",
]
