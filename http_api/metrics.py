"""``GET /metrics``: the router's counters in Prometheus's text format, for a scraper.

Nothing on the event path counts for Prometheus: the router keeps its own counters (plain
ints and `collections.Counter` entries it had for ``/health``, per-connection and per-link
ints, a sampled dispatch histogram, `DispatchTimes`), and `RouterCollector` reads them
when the scraper asks, building the families afresh each time. A scrape costs the router
a pass over its peer links and its client sessions (the buffered bytes), and no more: no
per-event or per-subscription walk. Every series carries ``router`` (the router's name) so a
Prometheus scraping several routers tells them apart.

The route asks the gate like ``/health``: a caller the permissions file covers (`callers`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from fastapi import APIRouter, Request, Response
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.utils import floatToGoString

from .callers import caller_of

__all__ = ["api", "RouterCollector", "METRICS_TYPE"]

#: The text format every Prometheus reads (0.0.4); the names here need none of 1.0.0's escaping.
METRICS_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

api = APIRouter(tags=["operations"])


@api.get(
    "/metrics",
    summary="The router's counters for Prometheus (text format)",
    response_class=Response,
    responses={200: {"content": {METRICS_TYPE: {}}, "description": "Prometheus text format"}},
)
async def metrics(request: Request) -> Response:
    """Events published, delivered, dropped (by reason) and forwarded (by peer), clients,
    links, subscriptions by tier, the dispatch time histogram, workers, store and caches;
    each series labelled with the router's name. Scrape config: ``docs/notes-metrics.md``."""
    state = request.app.state
    state.router.security.require_covered(caller_of(request).identity)
    collector = RouterCollector(state.router, http_clients=len(state.clients))
    return Response(generate_latest(collector), media_type=METRICS_TYPE)


class RouterCollector:
    """The families of one scrape of *router* (a `prometheus_client` collector: `collect`)."""

    def __init__(self, router: Any, *, http_clients: int = 0) -> None:
        self.router = router
        self.http_clients = http_clients

    def collect(self) -> Iterator[Metric]:
        r = self.router
        name = str(r.name)
        yield from _events(r, name)
        yield from _connections(r, name, self.http_clients)
        yield _histogram(r, name)
        yield from _workers(r, name)
        yield from _storage(r, name)


def _counter(metric: str, doc: str, name: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(metric, doc, labels=["router"])
    family.add_metric([name], value)
    return family


def _gauge(metric: str, doc: str, name: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(metric, doc, labels=["router"])
    family.add_metric([name], value)
    return family


def _events(r: Any, name: str) -> Iterator[Metric]:
    c, m = r.counters, r.mesh.counters
    yield _counter(
        "aa_events_published_total",
        "Events clients of this router published (stamped here)",
        name,
        c.get("published", 0),
    )
    yield _counter(
        "aa_events_dispatched_total",
        "Events dispatched here: published here or first received from a peer",
        name,
        c.get("dispatched", 0),
    )
    yield _counter(
        "aa_events_delivered_total",
        "Deliveries written to TCP clients (one per event and client)",
        name,
        c.get("delivered", 0),
    )
    dropped = CounterMetricFamily(
        "aa_events_dropped_total",
        "Events dropped, by reason: slow_subscriber (a client that does not read), slow_peer, "
        "too_large (for a peer frame), refused (the publisher's permissions), worker_busy "
        "(a pattern worker's queue full), event_log (its queue full)",
        labels=["router", "reason"],
    )
    workers = r.engine.workers.stats() if r.engine.workers is not None else {}
    event_log = r.event_log.stats() if r.event_log is not None else None
    for reason, value in (
        ("slow_subscriber", c.get("dropped_slow", 0)),
        ("slow_peer", m.get("dropped_slow", 0)),
        ("too_large", m.get("dropped_large", 0)),
        ("refused", c.get("refused_permission", 0)),
        ("worker_busy", workers.get("dropped", 0)),
        ("event_log", event_log.dropped if event_log is not None else 0),
    ):
        dropped.add_metric([name, reason], value)
    yield dropped
    duplicates = CounterMetricFamily(
        "aa_events_duplicates_total",
        "Copies recognised and not dispatched again: a client's retried publish, a peer's "
        "flood of an event already seen",
        labels=["router", "source"],
    )
    duplicates.add_metric([name, "client"], c.get("duplicates", 0))
    duplicates.add_metric([name, "peer"], m.get("duplicates", 0))
    yield duplicates
    forwarded = CounterMetricFamily(
        "aa_events_forwarded_total",
        "Events flooded to a peer on its current link (restarts at 0 when the link does)",
        labels=["router", "peer", "peer_id"],
    )
    received = CounterMetricFamily(
        "aa_events_from_peers_total",
        "Events received from a peer on its current link, duplicates included",
        labels=["router", "peer", "peer_id"],
    )
    for rid, link in list(r.mesh.links.items()):
        peer = link.remote.name if link.remote is not None and link.remote.name else rid
        forwarded.add_metric([name, str(peer), str(rid)], link.events_out)
        received.add_metric([name, str(peer), str(rid)], link.events_in)
    yield forwarded
    yield received
    yield _counter(
        "aa_pattern_errors_total", "Times pattern code raised", name, c.get("pattern_errors", 0)
    )
    yield _counter(
        "aa_patterns_stopped_total",
        "Patterns the sandbox stopped (over their budget, a rule broken)",
        name,
        c.get("patterns_stopped", 0),
    )


def _connections(r: Any, name: str, http_clients: int) -> Iterator[Metric]:
    sessions = list(r.sessions)
    yield _gauge("aa_clients", "TCP clients connected", name, len(sessions))
    yield _gauge("aa_http_clients", "HTTP clients registered (feeds)", name, http_clients)
    yield _gauge(
        "aa_client_buffered_bytes",
        "Bytes written to TCP clients that they have not read yet, all together",
        name,
        sum(s.backlog for s in sessions),
    )
    yield _gauge("aa_peer_links", "Links with peer routers", name, len(r.mesh.links))
    tiers = GaugeMetricFamily(
        "aa_subscriptions",
        "Subscriptions by the tier their pattern runs in: predicate (the router's index), "
        "sandbox (pattern code in the router), worker (pattern code in worker processes)",
        labels=["router", "tier"],
    )
    for tier, n in sorted(r.engine.by_tier().items()):
        tiers.add_metric([name, tier], n)
    yield tiers
    yield _gauge(
        "aa_patterns", "Distinct patterns (one instance each)", name, r.engine.instance_count
    )
    yield _gauge(
        "aa_uptime_seconds",
        "Seconds since the router started",
        name,
        r.summary()["uptime"],
    )


def _histogram(r: Any, name: str) -> HistogramMetricFamily:
    timing = r.dispatcher.timing
    family = HistogramMetricFamily(
        "aa_dispatch_seconds",
        "Time from the dispatch of a batch of events to the write of its deliveries, "
        "sampled (one batch in 16); pattern workers' deliveries are not in it",
        labels=["router"],
    )
    buckets = [
        (floatToGoString(bound), n)  # type: ignore[no-untyped-call]  # prometheus_client: untyped
        for bound, n in timing.cumulative()
    ]
    family.add_metric([name], buckets, timing.sum)
    return family


def _workers(r: Any, name: str) -> Iterator[Metric]:
    w = r.engine.workers.stats() if r.engine.workers is not None else {}
    yield _gauge(
        "aa_workers",
        "Pattern worker processes running",
        name,
        w.get("regular_workers", 0) + w.get("probation_workers", 0),
    )
    for metric, key, doc in (
        ("aa_worker_kills_total", "kills", "Pattern workers killed for overrunning a deadline"),
        ("aa_worker_crashes_total", "crashes", "Pattern workers that died on their own"),
        ("aa_worker_restarts_total", "replaced", "Pattern workers started to replace one"),
    ):
        yield _counter(metric, doc, name, w.get(key, 0))


def _storage(r: Any, name: str) -> Iterator[Metric]:
    store = r.storage.store
    if store is not None:
        s = store.stats()
        yield _counter(
            "aa_store_events_written_total", "Events written to the store", name, s.written
        )
        yield _gauge("aa_store_events_pending", "Events queued for the store", name, s.pending)
        yield _counter("aa_store_failures_total", "Store writes that failed", name, s.failures)
        yield _gauge("aa_store_healthy", "1 while the store's writes succeed", name, int(s.healthy))
        size = store.bytes_on_disk
        if size is not None:
            yield _gauge("aa_store_bytes", "Bytes of the SQLite store on disk", name, size)
    cache = r.mesh_cache
    if cache is not None:
        yield _gauge("aa_mesh_cache_events", "Events in the mesh cache", name, len(cache))
        yield _gauge("aa_mesh_cache_bytes", "Bytes of events in the mesh cache", name, cache.bytes)
    yield _gauge("aa_client_caches", "Client caches kept by this router", name, len(r.caches))
    yield _gauge(
        "aa_client_cache_events",
        "Events the client caches hold together",
        name,
        r.caches.events_held,
    )
    log = r.event_log
    if log is not None:
        e = log.stats()
        yield _counter("aa_event_log_rows_total", "Rows written to the event log", name, e.rows)
        yield _gauge(
            "aa_event_log_rows_waiting",
            "Rows queued for the event log's files",
            name,
            e.waiting,
        )
