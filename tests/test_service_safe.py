"""Safe services: `aa service install router` without certificates listens on loopback
(discovery too) unless told, warns in one line of a plaintext listener off loopback, and
writes a unit that works wherever the program lives (or refuses, saying why); a router says
once at start where its beacons go."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aa.mesh import Beacon, BroadcastDiscovery
from aa.mesh.testing import FakeLan
from aa.tools.cli import main
from aa.tools.service_cmd import listener_warning

AA = str(Path(sys.executable).with_name("aa"))


def install(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["service", "install", *args, "--dry-run"])
    out, err = capsys.readouterr()
    return code, out, err


def unit_lines(out: str) -> list[str]:
    return out.split("\n# would write ", 1)[0].splitlines()


def test_without_certs_the_router_listens_on_loopback_and_beacons_there(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = install(capsys, "router", "--program", "/usr/bin/aa")
    assert (code, err) == (0, "")
    assert 'host = "127.0.0.1"\n' in out
    assert '[mesh]\ndiscovery-interfaces = "lo"\n' in out  # a 127.0.0.1 beacon helps no one
    # The unit's own AA_DISCOVERY_INTERFACES decides when given.
    code, out, err = install(
        capsys, "router", "--program", "/usr/bin/aa", "--env", "AA_DISCOVERY_INTERFACES=eth0"
    )
    assert code == 0 and "discovery-interfaces" not in out


@pytest.mark.parametrize(
    "flags",
    [["--host", "0.0.0.0"], ["--host", "192.168.1.20"], ["--args", "--host 0.0.0.0"]],
)
def test_a_plaintext_listener_off_loopback_is_written_with_a_one_line_warning(
    capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    code, out, err = install(capsys, "router", "--program", "/usr/bin/aa", *flags)
    assert code == 0 and "[Service]" in out
    assert len(err.splitlines()) == 1
    assert err.startswith("aa service: warning: the router will listen on ")
    assert "in plaintext" in err and "--certs DIR" in err


def test_loopback_and_tls_listeners_are_not_warned_of(capsys: pytest.CaptureFixture[str]) -> None:
    for host in ("127.0.0.1", "::1", "localhost"):
        code, out, err = install(capsys, "router", "--program", "/usr/bin/aa", "--host", host)
        assert (code, err) == (0, ""), host
        assert f'host = "{host}"\n' in out
    assert listener_warning("0.0.0.0", tls=True) is None
    code, _, err = install(capsys, "container", "--host", "0.0.0.0")
    assert code == 2 and err == "aa service: --host is for a router\n"


def test_the_unit_hides_home_and_tmp_only_where_the_program_does_not_live(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The unit also reads the package itself (an editable install's source): put it where a
    # system install would, so that only the program's place varies (a clone may be in /tmp).
    from aa.tools import service_cmd

    monkeypatch.setattr(service_cmd, "__file__", "/usr/lib/python3/dist-packages/aa/tools/x.py")
    config = ["--config", "/etc/aa/r.toml"]
    code, out, _ = install(capsys, "router", "--program", "/usr/bin/aa", *config)
    lines = unit_lines(out)
    assert code == 0 and "ProtectHome=yes" in lines and "PrivateTmp=yes" in lines
    code, out, _ = install(capsys, "router", "--program", "/home/al/venv/bin/aa", *config)
    lines = unit_lines(out)
    assert code == 0 and "ProtectHome=yes" not in lines and "PrivateTmp=yes" in lines
    at = lines.index("ProtectHome=read-only")  # it may read its program, not write there
    assert lines[at - 1] == (
        "# ProtectHome=read-only, not yes: the service reads /home/al/venv/bin/aa (a home folder)"
    )
    code, out, _ = install(capsys, "container", "--program", "/tmp/venv/bin/aa")
    lines = unit_lines(out)
    assert code == 0 and "ProtectHome=yes" in lines
    assert not any(line.startswith("PrivateTmp") for line in lines)
    assert (
        "# No PrivateTmp: the service reads /tmp/venv/bin/aa, which a private /tmp would hide"
        in lines
    )


def test_a_program_other_users_cannot_reach_is_refused_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    closed = tmp_path / "closed"
    (closed / "venv" / "bin").mkdir(parents=True)
    closed.chmod(0o700)
    program = str(closed / "venv" / "bin" / "aa")
    code, out, err = install(capsys, "router", "--program", program, "--config", "/etc/aa/r.toml")
    assert code == 1 and out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith(f"aa service: the service would run {program}, but ")
    assert "is closed to other users" in err and "--run-as" in err
    # Run as a user who can reach it: written (a user unit runs as its user anyway).
    for flags in (["--run-as", "aa"], ["--user"]):
        code, out, err = install(
            capsys, "router", "--program", program, "--config", "/etc/aa/r.toml", *flags
        )
        assert code == 0 and "[Service]" in out and "closed" not in err


async def test_a_router_says_once_where_its_beacons_go(caplog: pytest.LogCaptureFixture) -> None:
    lan = FakeLan()
    beacon = Beacon(router_id="ra", name="ra", peer="0.0.0.0:7447", client="0.0.0.0:7447")
    with caplog.at_level(logging.INFO, logger="aa.mesh.discovery"):
        async with BroadcastDiscovery(
            port=47474, on_found=lambda info: None, beacon=beacon, network=lan.host("10.0.0.1")
        ):
            pass
        async with BroadcastDiscovery(
            port=47474,
            on_found=lambda info: None,
            beacon=beacon,
            selection=["lo"],
            network=lan.host("10.0.0.2"),
        ):
            pass
        async with BroadcastDiscovery(  # a client listening: it sends nothing, says nothing
            port=47474, on_found=lambda info: None, network=lan.host("10.0.0.3")
        ):
            pass
    said = [r.getMessage() for r in caplog.records if "beacons" in r.getMessage()]
    assert said == [
        "discovery: beacons on every interface: lo (127.255.255.255), eth0 (10.0.0.255); "
        "choose with --discovery-interfaces or $AA_DISCOVERY_INTERFACES (lo: this machine only)",
        "discovery: beacons on lo (127.255.255.255)",
    ]


async def test_aa_router_logs_its_beacon_interfaces_at_start(tmp_path: Path) -> None:
    env = {**os.environ, "AA_DISCOVERY_INTERFACES": "lo"}
    proc = await asyncio.create_subprocess_exec(
        AA,
        "router",
        "--port",
        "0",
        "--no-http",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        async with asyncio.timeout(20):
            while b"discovery: beacons" not in (said := await proc.stderr.readline()):
                assert said, "no 'discovery: beacons' line in the log"
        assert said.decode().rstrip().endswith("discovery: beacons on lo (127.255.255.255)")
    finally:
        proc.terminate()
        async with asyncio.timeout(20):
            await proc.communicate()
