"""The security room's rules without sockets: permissions files (and their errors), address
ranges, the handshake back-off, and `aa certs` on the command line."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from aa.mesh import PatternSpec, UsageError
from aa.router.security import ALLOW_ALL, AllowList, HandshakeGuard, Permissions, SecurityConfig
from aa.tools.cli import main

GOOD = """\
[anonymous]
subscribe = ["weather"]
patterns = "predicates"

[users.alice]
publish = ["reading", "sensor.*"]
subscribe = ["*"]
patterns = "scripts"
persist = true

[users."*"]
publish = [""]
"""


def test_permissions_by_user_with_defaults_denied() -> None:
    p = Permissions.parse(GOOD, Path("perms.toml"))
    alice, anon, other = p.rules_for("alice"), p.rules_for("anonymous"), p.rules_for("carol")
    assert alice is not None and anon is not None and other is not None
    assert alice.may_publish("sensor.kitchen") and alice.may_publish("reading")
    assert not alice.may_publish("alarm") and not alice.may_publish(None)
    assert other.may_publish(None) and not other.may_publish("reading")  # "" = untyped only
    assert (
        not anon.may_publish("weather")
        and anon.may_receive("weather")
        and not anon.may_receive("x")
    )
    assert anon.pattern_refusal(PatternSpec(source="x = 1", format="script"), "worker") == (
        "not allowed to register scripts, only predicate patterns "
        '(rule patterns = "predicates" in [anonymous] in perms.toml)'
    )
    assert anon.pattern_refusal(PatternSpec(source="True"), "predicate") is None
    assert (
        other.pattern_refusal(PatternSpec(source="True"), "predicate") is not None
    )  # subscribe = [] by default
    assert not alice.quench and alice.persist
    assert (
        Permissions.parse("[anonymous]\n").rules_for("bob") is None
    )  # no section: nothing allowed
    assert Permissions.open().rules_for("anyone") is ALLOW_ALL


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[users.bob]\npublish = 3\n", "line 2: publish in [users.bob] must be a list"),
        (
            '[users.bob]\nsubscribe = ["a"]\n\npersist = "yes"\n',
            "line 4: persist in [users.bob] must be true or false",
        ),
        ('[anonymous]\npatterns = "all"\n', "line 2: patterns in [anonymous] must be one of"),
        ("[anonymous]\npublihs = []\n", "line 2: unknown key 'publihs'"),
        ("[admins]\n", "line 1: unknown section 'admins'"),
        ("[users.bob\n", "line 1"),  # TOML syntax: tomllib's own position
    ],
)
def test_malformed_permissions_name_line_and_reason(text: str, error: str) -> None:
    with pytest.raises(UsageError, match=error.replace("[", r"\[").replace("]", r"\]")):
        Permissions.parse(text, Path("perms.toml"))


def test_reload_keeps_the_old_rules_when_the_file_breaks(tmp_path: Path) -> None:
    from aa.router.security import Gate

    path = tmp_path / "perms.toml"
    path.write_text(GOOD)
    gate = Gate(SecurityConfig(permissions=path))
    path.write_text(GOOD.replace('publish = [""]', 'publish = ["news"]'))
    assert "reloaded" in gate.reload()
    assert gate.permissions.rules_for("carol").may_publish("news")  # type: ignore[union-attr]
    path.write_text("[users.carol]\npublish = 1\n")
    message = gate.reload()
    assert "old rules stay" in message and "line 2" in message
    assert gate.permissions.rules_for("carol").may_publish("news")  # type: ignore[union-attr]


def test_allow_lists() -> None:
    a = AllowList(["192.168.0.0/16", "::1"])
    assert a.allows("192.168.4.2") and a.allows("::1") and a.allows("::ffff:192.168.0.9")
    assert not a.allows("10.0.0.1") and not a.allows("not an address")
    assert AllowList().allows("8.8.8.8")
    with pytest.raises(UsageError, match="not an address range"):
        SecurityConfig(allow_peers=("10.0.0.0/33",))


def test_guard_costs_one_handshake_per_backoff_interval() -> None:
    g = HandshakeGuard(base=30.0, maximum=120.0)
    assert g.admit("10.0.0.9:7447", 0.0)
    assert g.refused("10.0.0.9:7447", 0.0) == 30.0
    # However many beacons come meanwhile, no dial until the interval passed.
    assert not any(g.admit("10.0.0.9:7447", t) for t in range(0, 30))
    assert g.admit("10.0.0.9:7447", 30.0)
    assert g.refused("10.0.0.9:7447", 30.0) == 90.0  # doubled
    g.refused("10.0.0.9:7447", 90.0)
    assert g.refused("10.0.0.9:7447", 210.0) == 330.0  # capped at the maximum
    g.succeeded("10.0.0.9:7447")
    assert g.admit("10.0.0.9:7447", 211.0)
    small = HandshakeGuard(max_entries=3)
    for i in range(10):
        small.refused(f"h{i}:1", 0.0)
    assert len(small) == 3


def test_security_config_refuses_halves() -> None:
    with pytest.raises(UsageError, match="together"):
        SecurityConfig(cert=Path("a.pem"))
    with pytest.raises(UsageError, match="needs a CA"):
        SecurityConfig(anonymous=False)


def test_certs_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "init", str(tmp_path)]) == 0
    assert main(["certs", "router", str(tmp_path), "lab-1", "--days", "10"]) == 0
    assert main(["certs", "client", str(tmp_path), "alice"]) == 0
    for key in ("ca.key", "lab-1.key", "alice.key"):
        assert stat.S_IMODE((tmp_path / key).stat().st_mode) == 0o600
    assert main(["certs", "init", str(tmp_path)]) == 2  # never replaces a CA by accident
    assert main(["certs", "client", str(tmp_path), "no spaces"]) == 2
    assert main(["certs", "client", str(tmp_path / "nowhere"), "bob"]) == 2
    err = capsys.readouterr().err
    assert "exists already" in err and "not a usable name" in err and "does not exist" in err
    assert "Traceback" not in err
