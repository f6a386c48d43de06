"""Persisting the peer table: round trip, time conversion, and bad files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from aa.mesh import TOPOLOGY_FILE, PeerState, PeerTable, Source, load_topology, save_topology

A, B, C = "10.0.0.2:7447", "10.0.0.3:7447", "10.0.0.4:7447"


def table() -> PeerTable:
    return PeerTable(jitter=0.0, retry_base=1.0, retry_max=300.0, stable_after=60.0)


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / TOPOLOGY_FILE
    t = table()
    t.add(A, source=Source.CONFIGURED, now=100.0, router_id="ra")
    t.add(B, source=Source.DISCOVERED, now=100.0)
    t.add(C, source=Source.TOLD, now=100.0, router_id="rc")
    for _ in range(3):
        t.record_failure(B, 100.0)  # next attempt at 104
    t.record_success(C, 100.0)
    # Saved at monotonic 100 = wall 1_000_000; loaded at monotonic 5 = wall 1_000_002.
    save_topology(path, t, now=100.0, wall_now=1_000_000.0)
    assert [p.name for p in tmp_path.iterdir()] == [TOPOLOGY_FILE]  # no temp file left

    t2 = table()
    assert load_topology(path, t2, now=5.0, wall_now=1_000_002.0) == 3
    a, b, c = t2.get(A), t2.get(B), t2.get(C)
    assert a is not None and b is not None and c is not None
    assert (a.router_id, a.source, a.state) == ("ra", Source.PERSISTED, PeerState.IDLE)
    assert (b.failures, b.state) == (3, PeerState.POISONED)
    assert b.next_attempt == pytest.approx(5.0 + 4.0 - 2.0)  # poison survives the restart
    assert c.state is PeerState.IDLE and c.next_attempt == pytest.approx(5.0)  # was connected
    assert t2.due(5.0) == [A, C]
    assert t2.due(7.0) == [A, C, B]


def test_saved_file_is_plain_json(tmp_path: Path) -> None:
    path = tmp_path / TOPOLOGY_FILE
    t = table()
    t.add(A, source=Source.DISCOVERED, now=0.0)
    save_topology(path, t, now=0.0, wall_now=1000.0)
    data = json.loads(path.read_text())
    assert data["format"] == 1 and data["routers"][0]["address"] == A


def test_load_does_not_override_what_is_known(tmp_path: Path) -> None:
    path = tmp_path / TOPOLOGY_FILE
    t = table()
    t.add(A, source=Source.DISCOVERED, now=0.0)
    t.record_failure(A, 0.0)
    save_topology(path, t, now=0.0, wall_now=0.0)
    t2 = table()
    t2.add(A, source=Source.CONFIGURED, now=0.0)
    assert load_topology(path, t2, now=0.0, wall_now=0.0) == 0
    assert t2.get(A).failures == 0  # type: ignore[union-attr]


def test_clock_set_back_does_not_poison_forever(tmp_path: Path) -> None:
    path = tmp_path / TOPOLOGY_FILE
    t = table()
    t.add(A, source=Source.DISCOVERED, now=0.0)
    t.record_failure(A, 0.0)
    save_topology(path, t, now=0.0, wall_now=10_000_000.0)
    t2 = table()
    load_topology(path, t2, now=0.0, wall_now=1000.0)  # the wall clock went back months
    assert t2.get(A).next_attempt <= 300.0  # type: ignore[union-attr]


def test_missing_file_starts_empty(tmp_path: Path) -> None:
    assert load_topology(tmp_path / "nothing.json", table(), now=0.0, wall_now=0.0) == 0


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"\xff\xfe\x00", b"[]", b'{"format": 99, "routers": []}', b'{"format": 1}', b""],
)
def test_corrupt_file_is_logged_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    path = tmp_path / TOPOLOGY_FILE
    path.write_bytes(content)
    t = table()
    with caplog.at_level(logging.WARNING, logger="aa.mesh.topology"):
        assert load_topology(path, t, now=0.0, wall_now=0.0) == 0
    assert len(t) == 0
    assert "topology file" in caplog.text


def test_bad_entries_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / TOPOLOGY_FILE
    routers = [
        {"address": A, "failures": 1, "next_attempt": 0.0},
        {"address": "not an endpoint"},
        {"address": B, "failures": -1},
        {"address": C, "router_id": 5},
        "junk",
        {"address": "10.0.0.9:1", "next_attempt": "soon"},
        {"address": "10.0.0.8:1", "source": "rumour"},
    ]
    path.write_text(json.dumps({"format": 1, "routers": routers}))
    t = table()
    with caplog.at_level(logging.WARNING, logger="aa.mesh.topology"):
        assert load_topology(path, t, now=0.0, wall_now=0.0) == 1
    assert [e.address for e in t] == [A]
    assert "6 bad entries" in caplog.text


def test_save_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / TOPOLOGY_FILE
    path.write_text("old")
    t = table()
    t.add(A, source=Source.DISCOVERED, now=0.0)
    save_topology(path, t, now=0.0, wall_now=0.0)
    assert json.loads(path.read_text())["routers"][0]["address"] == A


def test_save_failure_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / TOPOLOGY_FILE
    path.write_text("old")

    def broken(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("aa.mesh.topology.os.replace", broken)
    with pytest.raises(OSError):
        save_topology(path, table(), now=0.0, wall_now=0.0)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == [TOPOLOGY_FILE]
