"""The SQL side of the persistent store: schema, engine set-up, and the statements the
store's worker thread runs (blocking; never call these on the event loop).

Schema (one table, ``aa_events``)::

    id          VARCHAR(64)  primary key: the event id. A second copy of an event (events
                             flood, so one may arrive twice) is ignored, not an error.
    type        TEXT NULL    the event type (indexed with time_us: count expiry per type)
    time_us     BIGINT       the event's ``time`` stamp, microseconds since the epoch (UTC);
                             the router's clock when the event has none. Order of replay.
    expires_us  BIGINT NULL  time_us + max_age; NULL never expires by age (indexed)
    vals        BLOB         msgpack of the values (`aa.mesh.protocol.codec.pack`: types kept
    exactly) meta        BLOB         msgpack of the meta

A second table, ``aa_repaired`` (``id`` primary key), names the events that came by
anti-entropy (`aa.router.store.sync`), not by the flood. Such a copy is history another
router (or, on an open mesh, anyone who says peer-hello) vouched for; when the same id is
then dispatched here live — the flood's exactly-once rule let it through, so it is the
mesh's event under that id — the live event replaces the repaired copy instead of being
ignored. Without it, a copy sent ahead under an id predicted from a publisher's last one
would make that publisher's real, acknowledged events vanish from the store. A live event
never yields to anything: a second live copy of a stored id is ignored.

Times are integers rather than SQL timestamps: the same on every backend, no zone
conversions, and cheap to compare and index.

Durability on SQLite: WAL journal, and ``synchronous=FULL`` by default. In WAL mode a
committed transaction is in the WAL file, in the OS page cache, when COMMIT returns; with
``synchronous=NORMAL`` that already survives the process being killed (kill -9: the kernel
still writes the page cache out), but not a power cut or a kernel crash, which can lose the
last transactions. With ``FULL`` the WAL is fsynced at every commit, so an event whose
publish was acknowledged as persisted survives both. Since we commit once per batch (up to
thousands of events), the fsync costs one disk flush per batch, not per event, and the
store still writes tens of thousands of events a second; so FULL is the default and NORMAL
an option (`StoreConfig.sqlite_synchronous`) for a router that trades power-cut safety for
latency on a slow disk.

On PostgreSQL, COMMIT returns once the server has flushed its WAL (``synchronous_commit``
on, the server's default; a server configured otherwise weakens the promise to match).

Backends: SQLite and PostgreSQL are tested. Duplicates are skipped with ``ON CONFLICT DO
NOTHING`` there, and with a look-up first elsewhere. Count limits delete with
``DELETE … WHERE id IN (SELECT … ORDER BY … OFFSET n)``, which MySQL refuses.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy import exc as sa_exc

from aa.mesh import MAX_ID_LENGTH, Event
from aa.mesh.protocol import pack, unpack

if TYPE_CHECKING:
    from .writer import Row

__all__ = [
    "TABLE_NAME",
    "metadata",
    "events_table",
    "make_engine",
    "is_transient",
    "write_batch",
    "write_rows_one_by_one",
    "delete_expired",
    "read_chunk",
    "read_keys",
    "read_by_ids",
]

log = logging.getLogger("aa.router.store")

#: Name of the store's one table.
TABLE_NAME: Final = "aa_events"
#: How long a SQLite connection waits for another connection's write lock, in milliseconds.
#: The worker and `expire()` may write at the same moment; either finishes in far less.
SQLITE_BUSY_TIMEOUT_MS: Final = 10_000

metadata = sa.MetaData()
events_table = sa.Table(
    TABLE_NAME,
    metadata,
    sa.Column("id", sa.String(MAX_ID_LENGTH), primary_key=True),
    sa.Column("type", sa.Text, nullable=True),
    sa.Column("time_us", sa.BigInteger, nullable=False),
    sa.Column("expires_us", sa.BigInteger, nullable=True),
    sa.Column("vals", sa.LargeBinary, nullable=False),
    sa.Column("meta", sa.LargeBinary, nullable=False),
    sa.Index(f"{TABLE_NAME}_time", "time_us", "id"),
    sa.Index(f"{TABLE_NAME}_type_time", "type", "time_us"),
    sa.Index(f"{TABLE_NAME}_expires", "expires_us"),
)
_T = events_table
#: Ids of events stored by anti-entropy and not (yet) dispatched here live (module docstring).
repaired_table = sa.Table(
    TABLE_NAME.replace("events", "repaired"),
    metadata,
    sa.Column("id", sa.String(MAX_ID_LENGTH), primary_key=True),
)
_R = repaired_table


def make_engine(url: str | sa.URL, *, sqlite_synchronous: str) -> sa.Engine:
    """An engine for *url*; SQLite connections get WAL, the chosen sync level, a busy wait."""
    engine = sa.create_engine(url, pool_pre_ping=True, future=True)
    if engine.dialect.name == "sqlite":

        @sa_event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            try:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute(f"PRAGMA synchronous={sqlite_synchronous}")
                cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            finally:
                cur.close()

    return engine


_TRANSIENT = (
    sa_exc.OperationalError,  # server gone, connection refused, disk full, database locked
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,  # pool exhausted
    OSError,
)


def is_transient(exc: BaseException) -> bool:
    """True for failures that retrying later can cure (lost connection, full disk)."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, _TRANSIENT)


def _insert_ignoring_duplicates(dialect: str) -> Any:
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert

        return insert(_T).on_conflict_do_nothing(index_elements=["id"])
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(_T).on_conflict_do_nothing(index_elements=["id"])
    return None


def _params(rows: Iterable[Row]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(live rows, repaired rows) as statement parameters; one row per id, a live one first."""
    live: dict[str, dict[str, Any]] = {}
    repaired: dict[str, dict[str, Any]] = {}
    for r in rows:
        ev = r.event
        eid = r.id
        if eid in live or (r.repaired and eid in repaired):  # the same event twice in one batch
            continue
        if not r.repaired:
            repaired.pop(eid, None)
        (repaired if r.repaired else live)[eid] = {
            "id": ev.id,
            "type": ev.type,
            "time_us": r.time_us,
            "expires_us": r.expires_us,
            "vals": pack(ev.values),
            "meta": pack(ev.meta),
        }
    return list(live.values()), [p for i, p in repaired.items() if i not in live]


def _insert(conn: sa.Connection, params: list[dict[str, Any]], *, repaired: bool = False) -> None:
    if not params:
        return
    ids = [p["id"] for p in params]
    if repaired:
        # Only ids not stored yet are marked: a live event already here stays live.
        there = set(conn.scalars(sa.select(_T.c.id).where(_T.c.id.in_(ids))))
        fresh = [{"id": i} for i in ids if i not in there]
        if fresh:
            conn.execute(sa.insert(_R), fresh)
    else:
        # A live event replaces a repaired copy of its id (module docstring).
        was = list(conn.scalars(sa.select(_R.c.id).where(_R.c.id.in_(ids))))
        if was:
            conn.execute(sa.delete(_T).where(_T.c.id.in_(was)))
            conn.execute(sa.delete(_R).where(_R.c.id.in_(was)))
    stmt = _insert_ignoring_duplicates(conn.dialect.name)
    if stmt is not None:
        conn.execute(stmt, params)
        return
    # Other backends: skip the ids already there, then a plain insert. Only the store's one
    # worker inserts, so nothing can slip in between.
    ids = [p["id"] for p in params]
    there = set(conn.scalars(sa.select(_T.c.id).where(_T.c.id.in_(ids))))
    fresh = [p for p in params if p["id"] not in there]
    if fresh:
        conn.execute(sa.insert(_T), fresh)


def _enforce_counts(conn: sa.Connection, rows: Sequence[Row]) -> None:
    # Count expiry (Å §4.5 "keep a maximum of five events of that type"): after the insert,
    # delete every event of the type but the newest N, newest by event time then id, so all
    # routers that hold the same events keep the same N. An event that arrives late (older
    # than the N already kept) is deleted at once: it is not among the newest. The policy
    # of the last event of the type in the batch wins, as the publisher's latest word.
    counts: dict[str, int] = {}
    for r in rows:
        if r.max_count is not None and r.event.type is not None:
            counts[r.event.type] = r.max_count
    for type_, n in counts.items():
        surplus = (
            sa.select(_T.c.id)
            .where(_T.c.type == type_)
            .order_by(_T.c.time_us.desc(), _T.c.id.desc())
            .offset(n)
        )
        conn.execute(sa.delete(_T).where(_T.c.id.in_(surplus)))


def write_batch(engine: sa.Engine, rows: Sequence[Row]) -> None:
    """Insert *rows* and apply their count limits, in one transaction. Raises on failure
    (nothing is then written)."""
    live, repaired = _params(rows)
    with engine.begin() as conn:
        _insert(conn, live)
        _insert(conn, repaired, repaired=True)
        _enforce_counts(conn, rows)


def write_rows_one_by_one(engine: sa.Engine, rows: Sequence[Row]) -> list[tuple[Row, Exception]]:
    """Write *rows* each in its own transaction, after a batch failed for a reason that is
    not transient: the good rows go in, and the ones that fail are returned with why.
    A transient error still raises (the caller retries everything not yet written)."""
    rejected: list[tuple[Row, Exception]] = []
    for r in rows:
        try:
            write_batch(engine, [r])
        except Exception as exc:
            if is_transient(exc):
                raise
            rejected.append((r, exc))
    return rejected


def delete_expired(engine: sa.Engine, now_us: int) -> int:
    """Delete events whose age limit has passed at *now_us*; the number deleted."""
    with engine.begin() as conn:
        result = conn.execute(
            sa.delete(_T).where(_T.c.expires_us.is_not(None), _T.c.expires_us <= now_us)
        )
        # Marks of repaired events that are gone (expired, or cut by a count limit).
        conn.execute(sa.delete(_R).where(_R.c.id.not_in(sa.select(_T.c.id))))
        return max(result.rowcount or 0, 0)


def read_chunk(
    engine: sa.Engine,
    *,
    after: tuple[int, str] | None,
    since_us: int | None,
    now_us: int,
    limit: int,
) -> list[tuple[tuple[int, str], Event]]:
    """Up to *limit* stored events after the key *after*, oldest first, not expired at
    *now_us*, with time ≥ *since_us*; each as (key, event). Keyset paging on the
    (time_us, id) index: every chunk costs the same however deep into the table it is."""
    q = sa.select(_T.c.time_us, _T.c.id, _T.c.type, _T.c.vals, _T.c.meta)
    q = q.where(sa.or_(_T.c.expires_us.is_(None), _T.c.expires_us > now_us))
    if since_us is not None:
        q = q.where(_T.c.time_us >= since_us)
    if after is not None:
        t, i = after
        # Written so that the first term is a plain range on the index's first column.
        q = q.where(_T.c.time_us >= t, sa.or_(_T.c.time_us > t, _T.c.id > i))
    q = q.order_by(_T.c.time_us, _T.c.id).limit(limit)
    trusted = Event.trusted
    with engine.connect() as conn:
        rows = conn.execute(q).all()
    return [((t, i), trusted(unpack(v), ty, unpack(m), i)) for t, i, ty, v, m in rows]


def read_keys(engine: sa.Engine, *, now_us: int) -> list[tuple[str, str | None, int]]:
    """(id, type, time_us) of every stored event not expired at *now_us* (anti-entropy)."""
    q = sa.select(_T.c.id, _T.c.type, _T.c.time_us)
    q = q.where(sa.or_(_T.c.expires_us.is_(None), _T.c.expires_us > now_us))
    with engine.connect() as conn:
        return [(i, ty, t) for i, ty, t in conn.execute(q).all()]


def read_by_ids(engine: sa.Engine, ids: Sequence[str]) -> list[Event]:
    """The stored events with these *ids* (those that are stored), in no order."""
    trusted = Event.trusted
    out: list[Event] = []
    with engine.connect() as conn:
        for start in range(0, len(ids), 500):
            q = sa.select(_T.c.id, _T.c.type, _T.c.vals, _T.c.meta).where(
                _T.c.id.in_(ids[start : start + 500])
            )
            out += [trusted(unpack(v), ty, unpack(m), i) for i, ty, v, m in conn.execute(q).all()]
    return out
