"""Expiry policies: construction, human text, and the publisher's meta keys."""

from __future__ import annotations

from datetime import timedelta

import pytest

from aa.mesh import Event, InvalidPolicy, UsageError
from aa.router import ExpiryPolicy, parse_duration
from aa.router.store import (
    META_MAX_AGE,
    META_MAX_COUNT,
    META_MESH_CACHE,
    META_PERSIST,
    persist_policy,
    wants_mesh_cache,
)
from aa.router.store.expiry import MAX_POLICY_AGE


@pytest.mark.parametrize(
    "text, expected",
    [
        ("90s", timedelta(seconds=90)),
        ("3h", timedelta(hours=3)),
        ("2d", timedelta(days=2)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h 30m", timedelta(hours=1, minutes=30)),
        ("1.5h", timedelta(minutes=90)),
        ("250ms", timedelta(milliseconds=250)),
        ("1w", timedelta(weeks=1)),
        (" 5m ", timedelta(minutes=5)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text, says",
    [
        ("3y", "unknown unit 'y'"),
        ("3H", "unknown unit 'H'"),
        ("90", "without a unit: write e.g. '90s'"),
        ("", "cannot be empty"),
        ("   ", "cannot be empty"),
        ("-3h", "is negative: an age limit must be positive"),
        ("h", "expected a number and a unit"),
        ("3h!", "expected a number and a unit at '!'"),
    ],
)
def test_parse_duration_refuses_with_reason(text: str, says: str) -> None:
    with pytest.raises(InvalidPolicy, match=None) as info:
        parse_duration(text)
    assert says in str(info.value)


def test_invalid_policy_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        parse_duration("3y")
    with pytest.raises(ValueError):
        ExpiryPolicy(max_count=0)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"max_age": timedelta(0)}, "max_age must be positive"),
        ({"max_age": timedelta(seconds=-1)}, "max_age must be positive"),
        ({"max_age": MAX_POLICY_AGE + timedelta(days=1)}, "over the limit"),
        ({"max_age": 3600}, "max_age must be a timedelta"),
        ({"max_count": 0}, "max_count must be at least 1"),
        ({"max_count": -5}, "max_count must be at least 1"),
        ({"max_count": 2.0}, "max_count must be an int"),
        ({"max_count": True}, "max_count must be an int"),
    ],
)
def test_policy_refusals(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidPolicy) as info:
        ExpiryPolicy(**kwargs)  # type: ignore[arg-type]
    assert says in str(info.value)


def test_policy_parse_and_to_meta() -> None:
    p = ExpiryPolicy.parse(max_age="3h", max_count="5")
    assert p == ExpiryPolicy(max_age=timedelta(hours=3), max_count=5)
    assert ExpiryPolicy.parse(max_age=90).max_age == timedelta(seconds=90)
    assert ExpiryPolicy().unlimited and not p.unlimited
    assert p.to_meta() == {META_PERSIST: True, META_MAX_AGE: 10800.0, META_MAX_COUNT: 5}
    with pytest.raises(InvalidPolicy, match="whole number"):
        ExpiryPolicy.parse(max_count="five")
    with pytest.raises(InvalidPolicy, match="must be positive"):
        ExpiryPolicy.parse(max_age=0)


def _ev(meta: dict, type: str | None = "snow") -> Event:
    return Event(values={"depth": 80}, type=type, meta=meta, id="e1")


def test_persist_policy_from_meta() -> None:
    assert persist_policy(_ev({})) is None
    assert persist_policy(_ev({"persist": False})) is None
    assert persist_policy(_ev({"persist": True})) == ExpiryPolicy()
    assert persist_policy(_ev({"persist": True, "max_age": 10800, "max_count": 5})) == ExpiryPolicy(
        max_age=timedelta(hours=3), max_count=5
    )
    assert persist_policy(_ev({"persist": True, "max_age": 1.5})).max_age == timedelta(seconds=1.5)
    assert persist_policy(_ev({"persist": True, "max_age": "1h30m"})).max_age == timedelta(
        minutes=90
    )
    # the policy itself round-trips through meta
    p = ExpiryPolicy(max_age=timedelta(minutes=5), max_count=2)
    assert persist_policy(_ev(p.to_meta())) == p


@pytest.mark.parametrize(
    "meta, type, says",
    [
        ({"max_age": 60}, "snow", "add 'persist': True"),
        ({"max_count": 5}, "snow", "add 'persist': True"),
        ({"persist": "yes"}, "snow", "must be True or False"),
        ({"persist": True, "max_age": -1}, "snow", "must be positive"),
        ({"persist": True, "max_age": 0}, "snow", "must be positive"),
        ({"persist": True, "max_age": float("nan")}, "snow", "finite"),
        ({"persist": True, "max_age": "3y"}, "snow", "unknown unit"),
        ({"persist": True, "max_age": [1]}, "snow", "number of seconds or text"),
        ({"persist": True, "max_count": 0}, "snow", "at least 1"),
        ({"persist": True, "max_count": 2.5}, "snow", "must be an int"),
        ({"persist": True, "max_count": True}, "snow", "must be an int"),
        ({"persist": True, "max_count": 5}, None, "needs an event type"),
    ],
)
def test_persist_policy_refusals(meta: dict, type: str | None, says: str) -> None:
    with pytest.raises(InvalidPolicy) as info:
        persist_policy(_ev(meta, type))
    assert says in str(info.value)


def test_mesh_cache_opt_out() -> None:
    assert wants_mesh_cache(_ev({}))
    assert wants_mesh_cache(_ev({META_MESH_CACHE: True}))
    assert not wants_mesh_cache(_ev({META_MESH_CACHE: False}))
