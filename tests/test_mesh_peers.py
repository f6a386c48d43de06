"""The peer table and its poison list, with time moved by hand."""

from __future__ import annotations

import random

import pytest

from aa.mesh import PeerState, PeerTable, Source, UsageError

A = "10.0.0.2:7447"
B = "10.0.0.3:7447"


def table(**kwargs: object) -> PeerTable:
    kwargs.setdefault("jitter", 0.0)
    return PeerTable(retry_base=1.0, retry_max=300.0, stable_after=60.0, **kwargs)  # type: ignore[arg-type]


def test_new_entry_is_due_at_once() -> None:
    t = table()
    t.add(A, source=Source.DISCOVERED, now=0.0)
    assert t.due(0.0) == [A]
    t.record_attempt(A, 0.0)
    assert t.get(A).state is PeerState.CONNECTING  # type: ignore[union-attr]
    assert t.due(0.0) == []  # not twice


def test_back_off_doubles_up_to_the_maximum() -> None:
    t = table()
    t.add(A, source=Source.CONFIGURED, now=0.0)
    now = 0.0
    waits = []
    for _ in range(12):
        assert t.due(now) == [A]
        t.record_attempt(A, now)
        nxt = t.record_failure(A, now)
        assert nxt is not None
        assert t.get(A).state is PeerState.POISONED  # type: ignore[union-attr]
        assert t.due(nxt - 0.001) == []
        waits.append(nxt - now)
        now = nxt
    assert waits == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]


def test_flapping_peer_keeps_growing_its_interval() -> None:
    t = table()
    t.add(A, source=Source.DISCOVERED, now=0.0)
    now, waits = 0.0, []
    for _ in range(6):
        t.record_attempt(A, now)
        t.record_success(A, now)  # it accepts ...
        now += 5.0  # ... and drops us a few seconds later
        nxt = t.record_failure(A, now)
        assert nxt is not None
        waits.append(nxt - now)
        now = nxt
    assert waits == [1, 2, 4, 8, 16, 32]


def test_stable_connection_forgives_failures() -> None:
    t = table()
    t.add(A, source=Source.DISCOVERED, now=0.0)
    for i in range(5):
        t.record_attempt(A, float(i))
        t.record_failure(A, float(i))
    assert t.get(A).failures == 5  # type: ignore[union-attr]
    t.record_success(A, 100.0)
    assert t.get(A).failures == 5  # type: ignore[union-attr]  # not yet: it might flap
    t.due(170.0)  # the owner's periodic look settles stable links
    assert t.get(A).failures == 0  # type: ignore[union-attr]
    assert t.record_failure(A, 180.0) == 181.0  # a fresh start: retry_base


def test_stable_connection_forgiven_on_failure_too() -> None:
    t = table()
    t.add(A, source=Source.DISCOVERED, now=0.0)
    for i in range(4):
        t.record_failure(A, float(i))
    t.record_success(A, 10.0)
    assert t.record_failure(A, 70.0) == 71.0


def test_record_closed_is_no_penalty() -> None:
    t = table()
    t.add(A, source=Source.DISCOVERED, now=0.0)
    t.record_success(A, 0.0)
    t.record_closed(A, 1.0)
    e = t.get(A)
    assert e is not None and e.state is PeerState.IDLE and e.failures == 0
    assert t.due(1.5) == [] and t.due(2.0) == [A]


def test_jitter_shortens_deterministically() -> None:
    t = table(jitter=0.1, rng=random.Random(7))
    t.add(A, source=Source.DISCOVERED, now=0.0)
    delays = [t.record_failure(A, 0.0) for _ in range(10)]
    expected = [min(2**i, 300) for i in range(10)]
    for got, want in zip(delays, expected):
        assert got is not None and 0.9 * want <= got <= want
    t2 = table(jitter=0.1, rng=random.Random(7))
    t2.add(A, source=Source.DISCOVERED, now=0.0)
    assert [t2.record_failure(A, 0.0) for _ in range(10)] == delays


def test_due_orders_fewest_failures_first() -> None:
    t = table()
    t.add(A, source=Source.DISCOVERED, now=0.0)
    t.add(B, source=Source.DISCOVERED, now=0.0)
    t.record_failure(A, 0.0)
    assert t.due(10.0) == [B, A]
    assert t.next_due() == 0.0


def test_second_address_of_a_connected_router_is_not_dialled() -> None:
    t = table()
    t.add(A, source=Source.DISCOVERED, now=0.0, router_id="r1")
    t.add(B, source=Source.DISCOVERED, now=0.0, router_id="r1")
    t.record_success(A, 0.0)
    assert t.due(0.0) == []
    t.record_failure(A, 1.0)
    assert t.due(1.0) == [B]


def test_own_id_and_own_address_are_never_dialled() -> None:
    t = table(own_id="me")
    assert t.add(A, source=Source.DISCOVERED, now=0.0, router_id="me") is None
    assert A not in t
    assert t.add(A, source=Source.TOLD, now=1.0) is None  # remembered as ours
    t.add(B, source=Source.TOLD, now=0.0)
    t.record_success(B, 0.0, router_id="me")  # dialled it: it was us
    assert B not in t and t.due(5.0) == []


def test_source_keeps_the_strongest() -> None:
    t = table()
    t.add(A, source=Source.TOLD, now=0.0)
    t.add(A, source=Source.CONFIGURED, now=0.0)
    t.add(A, source=Source.DISCOVERED, now=0.0)
    assert t.get(A).source is Source.CONFIGURED  # type: ignore[union-attr]


def test_bounded_evicts_least_recently_useful() -> None:
    t = table(max_entries=3)
    t.add("10.0.0.1:1", source=Source.CONFIGURED, now=0.0)  # never evicted
    t.add("10.0.0.2:1", source=Source.TOLD, now=1.0)
    t.add("10.0.0.3:1", source=Source.TOLD, now=2.0)
    t.add("10.0.0.2:1", source=Source.DISCOVERED, now=3.0)  # heard first-hand: useful again
    t.add("10.0.0.4:1", source=Source.TOLD, now=4.0)
    assert len(t) == 3
    assert "10.0.0.3:1" not in t
    assert {"10.0.0.1:1", "10.0.0.2:1", "10.0.0.4:1"} == {e.address for e in t}


def test_hearsay_does_not_keep_an_entry_alive() -> None:
    t = table(max_entries=2)
    t.add("10.0.0.2:1", source=Source.TOLD, now=0.0)
    t.add("10.0.0.3:1", source=Source.DISCOVERED, now=1.0)
    t.add("10.0.0.2:1", source=Source.TOLD, now=2.0)  # repeated by a peer: not refreshed
    t.add("10.0.0.4:1", source=Source.TOLD, now=3.0)
    assert "10.0.0.2:1" not in t and "10.0.0.3:1" in t


def test_full_of_pinned_entries_refuses() -> None:
    t = table(max_entries=2)
    t.add("10.0.0.1:1", source=Source.CONFIGURED, now=0.0)
    t.add("10.0.0.2:1", source=Source.TOLD, now=0.0)
    t.record_success("10.0.0.2:1", 0.0)
    assert t.add("10.0.0.3:1", source=Source.TOLD, now=0.0) is None
    assert len(t) == 2


def test_unknown_addresses_are_ignored_by_record_calls() -> None:
    t = table()
    assert t.record_failure(A, 0.0) is None
    t.record_success(A, 0.0)
    t.record_closed(A, 0.0)
    t.record_attempt(A, 0.0)
    assert len(t) == 0


@pytest.mark.parametrize("bad", ["nohost", "host:0", "host:99999", ":80", "a b:1", "::1:80"])
def test_bad_address_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError):
        table().add(bad, source=Source.TOLD, now=0.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_entries": 0},
        {"retry_base": 0},
        {"retry_base": 10, "retry_max": 5},
        {"jitter": 1.0},
        {"forget_after": 0},
    ],
)
def test_bad_limits(kwargs: dict) -> None:
    with pytest.raises(UsageError):
        PeerTable(**kwargs)


def test_a_router_of_no_use_for_a_week_is_forgotten_at_its_next_failure_unless_configured() -> None:
    """Routers come and go (a laptop's, a test's on a random port): one that has neither
    answered nor been heard of first-hand for `forget_after` is dropped, not dialled every
    `retry_max` for good; a configured one stays, whatever its record."""
    from aa.mesh import FORGET_AFTER

    week = FORGET_AFTER
    t = table()
    t.add(A, source=Source.DISCOVERED, now=0.0)
    t.add(B, source=Source.CONFIGURED, now=0.0)
    t.record_attempt(A, 1.0)
    t.record_success(A, 1.0, router_id="ra")  # useful at 1.0
    t.record_failure(A, 2.0)
    assert t.record_failure(A, week) is not None  # of use a second less than a week ago: kept
    t.add(A, source=Source.TOLD, now=week + 1.0)  # hearsay does not make it useful
    assert t.record_failure(A, week + 1.0) is None and A not in t  # a week since it was of use
    assert t.record_failure(B, week * 2) is not None and B in t  # configured: never forgotten
    t.add(A, source=Source.DISCOVERED, now=week * 3)  # heard again: known again, due at once
    assert t.due(week * 3)[0] == A
