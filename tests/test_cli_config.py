"""`aa router --config FILE`: a key for every flag, flags over the file, mistakes as one line
with the file and the line, `--print-config` read back to the same configuration, SIGHUP
applying what can change live (real router processes, real signals), JSON logs, and the
service unit that runs the router from a file."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from support.routerproc import AA
from support.wire import frame_bytes

from aa.client import AsyncClient
from aa.mesh import Connection
from aa.mesh.protocol import Hello
from aa.router.config import MAX_SESSION_BACKLOG, MAX_SUBSCRIPTIONS_PER_CLIENT
from aa.tools import defaults
from aa.tools.cli import main
from aa.tools.router_cmd import router_keys, router_parser
from aa.tools.router_config import SHORTHANDS, load

EXAMPLE = Path(__file__).parent.parent / "docs" / "aa-router.example.toml"


def aa_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_flag_has_a_key() -> None:
    keys = router_keys()
    dests = {k.dest for k in keys.values()}
    assert len(dests) == len(keys)  # one flag, one key
    for action in router_parser()._actions:
        if action.dest in ("help", "config", "print_config"):
            continue
        assert action.dest in dests or SHORTHANDS.get(action.dest) in keys, action.option_strings
    assert keys["http.port"].flag == "--http-port" and keys["http.enabled"].kind == "not"
    assert (defaults.MAX_SUBSCRIPTIONS_PER_CLIENT, defaults.MAX_SESSION_BACKLOG) == (
        MAX_SUBSCRIPTIONS_PER_CLIENT,
        MAX_SESSION_BACKLOG,
    )


def test_the_example_file_has_every_key_at_its_default(tmp_path: Path) -> None:
    keys = router_keys()
    parser = router_parser()
    loaded = load(EXAMPLE, keys)
    for dest, (value, _, name) in loaded.items():
        assert value == parser.get_default(dest), name  # the file says the true defaults
    # Its commented-out lines ('# key = example') name every other key, with a valid value.
    text = EXAMPLE.read_text()
    opened = re.sub(r"^# ([a-z-]+ = )", r"\1", text, flags=re.MULTILINE)
    (tmp_path / "all.toml").write_text(opened)
    assert set(load(tmp_path / "all.toml", keys)) == {k.dest for k in keys.values()}


def test_print_config_reads_back_to_the_same_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "first.toml"
    first.write_text(EXAMPLE.read_text().replace("# name = ", "name = "))
    code, out, err = aa_here(
        capsys, "router", "--config", str(first), "--peer", "10.0.0.1:7447", "--print-config"
    )
    assert code == 0, err
    again = tmp_path / "again.toml"
    again.write_text(out)
    code, out2, err = aa_here(capsys, "router", "--config", str(again), "--print-config")
    assert code == 0, err
    assert out2 == out
    printed = tomllib.loads(out)
    assert printed["name"] == "lab-1" and printed["mesh"]["peers"] == ["10.0.0.1:7447"]
    assert printed["http"]["enabled"] is True and "cert" not in printed["http"]  # not set


def test_flags_override_the_file_even_at_their_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "r.toml"
    f.write_text(
        'port = 8000\nname = "from-file"\n[mesh]\npeers = ["a:1", "b:2"]\ndiscovery = false\n'
        '[http]\nenabled = false\n[log]\nlevel = "warning"\n'
    )
    code, out, err = aa_here(
        capsys,
        "router",
        "--config",
        str(f),
        "--port",
        "7447",  # the default, given: it wins
        "--peer",
        "c:3",  # a list flag replaces the file's list
        "-v",  # -v is --log-level debug
        "--print-config",
    )
    assert code == 0, err
    printed = tomllib.loads(out)
    assert printed["port"] == 7447 and printed["name"] == "from-file"
    assert printed["mesh"]["peers"] == ["c:3"] and printed["mesh"]["discovery"] is False
    assert printed["http"]["enabled"] is False


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("port = 1\n[http]\nprot = 8080\n", 3, "unknown key http.prot; did you mean http.port?"),
        ("[htp]\nport = 8080\n", 1, "unknown table [htp]; did you mean http?"),
        ("[mesh]\nport = 1\n", 2, "unknown key mesh.port; did you mean"),
        ('\n\nport = "7447"\n', 3, 'port must be an integer, not "7447" (a string)'),
        ("[mesh]\ndiscovery = 0\n", 2, "mesh.discovery must be true or false, not 0"),
        ('[mesh]\npeers = "a:1"\n', 2, "mesh.peers must be a list"),
        ('[log]\nlevel = "verbose"\n', 2, "log.level must be one of debug, info, warning, error"),
        ('[log]\nformat = "jsno"\n', 2, "did you mean 'json'?"),
        ("http = 1\n", 1, "http is a table: write [http]"),
        ('data-dir = "${AA_NOT_SET_ANYWHERE}/x"\n', 1, "${AA_NOT_SET_ANYWHERE} is not set"),
        ("[http\n", 1, "not valid TOML"),
    ],
)
def test_a_mistake_in_the_file_is_one_line_with_the_file_and_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, reason: str
) -> None:
    f = tmp_path / "router.toml"
    f.write_text(text)
    code, out, err = aa_here(capsys, "router", "--config", str(f), "--print-config")
    assert code == 2 and out == ""
    assert err.startswith(f"aa router: {f}:{line}: ") and reason in err, err
    assert len(err.splitlines()) == 1


def test_a_bad_value_stops_the_router_before_it_binds(tmp_path: Path) -> None:
    f = tmp_path / "router.toml"
    f.write_text("port = 0\n[mesh]\ndiscovery = false\n[patterns]\nworkers = 0\n")
    done = subprocess.run(
        [AA, "router", "--config", str(f), "--no-http"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"aa router: {f}:5: patterns.workers: --pattern-workers must be 1..64, not 0"
    ]
    missing = subprocess.run(
        [AA, "router", "--config", str(tmp_path / "none.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        f"aa router: cannot read the configuration {tmp_path / 'none.toml'}: No such file or "
        "directory"
    ]


# -- a real router: SIGHUP and JSON logs ----------------------------------------------------


class _Log:
    """The JSON lines of a router's stderr, read as they come."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream
        self.seen: list[dict[str, Any]] = []

    async def next(self, match: Any, timeout: float = 30) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                raw = await self.stream.readline()
                assert raw, "the router exited"
                record = json.loads(raw)  # every line is one JSON object
                self.seen.append(record)
                if match(record):
                    return record


async def _start(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        AA, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        line = (await proc.stdout.readline()).decode()
    m = re.search(r"listening on (127\.0\.0\.1:\d+)", line)
    assert m, line
    return proc, m.group(1)


async def _subscriptions_allowed(endpoint: str, up_to: int) -> int:
    async with AsyncClient(endpoint) as c:
        for n in range(up_to):
            try:
                await c.subscribe(f"x == {n}")
            except Exception as exc:
                assert "subscriptions per client" in str(exc)
                return n
    return up_to


async def test_sighup_applies_what_can_change_live_and_keeps_a_bad_file_out(
    tmp_path: Path,
) -> None:
    f = tmp_path / "router.toml"
    base = "port = 0\n[mesh]\ndiscovery = false\n[http]\nenabled = false\n"
    f.write_text(base + '[log]\nformat = "json"\n')
    proc, endpoint = await _start("router", "--config", str(f))
    assert proc.stderr is not None
    log = _Log(proc.stderr)
    try:
        await log.next(lambda r: "listening on" in r["message"])
        assert await _subscriptions_allowed(endpoint, 4) == 4
        f.write_text(
            base.replace("discovery = false", "discovery = false\nbeacon-interval = 3.0")
            + '[log]\nformat = "json"\nlevel = "debug"\n[limits]\nmax-subscriptions = 2\n'
        )
        proc.send_signal(signal.SIGHUP)
        said = await log.next(lambda r: r["logger"] == "aa.router.config")
        assert said["level"] == "WARNING"  # something needs a restart
        assert said["reloaded"] == [
            "log.level (info → debug)",
            "limits.max-subscriptions (100 → 2)",
        ]
        assert said["not_reloaded"] == ["mesh.beacon-interval (10.0 → 3.0: needs a restart)"]
        assert await _subscriptions_allowed(endpoint, 4) == 2  # the new limit, at once
        f.write_text(base + "[limits]\nmax-subscriptions = 50\nmax-sessions = 1\n")
        proc.send_signal(signal.SIGHUP)
        said = await log.next(lambda r: r["logger"] == "aa.router.config")
        assert said["level"] == "ERROR" and said["reloaded"] == []
        assert said["not_reloaded"] == [
            f"the configuration (the old one stays): {f}:8: unknown key limits.max-sessions; "
            "did you mean limits.max-subscriptions?"
        ]
        assert await _subscriptions_allowed(endpoint, 4) == 2  # still the old limit
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await proc.wait()
    assert proc.returncode == 0


async def test_json_logs_name_the_client_the_line_is_about() -> None:
    proc, endpoint = await _start(
        "router", "--port", "0", "--no-discovery", "--no-http", "--log-format", "json"
    )
    assert proc.stderr is not None
    log = _Log(proc.stderr)
    try:
        started = await log.next(lambda r: "listening on" in r["message"])
        assert started["time"].endswith("Z") and started["level"] == "INFO"
        assert started["logger"] == "aa.router"
        host, port = endpoint.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(Connection().send(Hello(client_id="json-logged")))
        writer.write(frame_bytes(b"\xc1 not msgpack"))
        await writer.drain()
        said = await log.next(lambda r: r.get("client_id") == "json-logged")
        assert "closing json-logged" in said["message"]
        assert said["user"] == "anonymous" and said["address"].startswith("127.0.0.1:")
        writer.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await proc.wait()
    assert proc.returncode == 0


# -- the service unit ------------------------------------------------------------------------


def test_the_router_unit_runs_from_a_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    units = tmp_path / "units"
    args = ["service", "install", "router", "--unit-dir", str(units), "--program", "/usr/bin/aa"]
    code, out, err = aa_here(capsys, *args, "--dry-run", "--args=--log-format json")
    assert code == 0, err
    assert not units.exists()  # a dry run writes nothing
    config = units / "aa-router.toml"
    assert f"ExecStart=/usr/bin/aa router --config {config} --log-format json\n" in out
    unit_text, _, config_text = out.partition(f"# would write {config}\n")
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit_text
    settings = tomllib.loads(config_text)
    assert settings == {  # loopback, beacons too, unless --host (docs/operations.md)
        "host": "127.0.0.1",
        "data-dir": "${STATE_DIRECTORY}",
        "mesh": {"discovery-interfaces": "lo"},
    }
    # The file the unit names is one the router reads, with systemd's folder filled in.
    code, out, err = aa_here(capsys, *args)
    assert code == 0 and f"wrote {config}" in out, err
    (tmp_path / "state").mkdir()
    done = subprocess.run(
        [AA, "router", "--config", str(config), "--print-config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "STATE_DIRECTORY": str(tmp_path / "state")},
    )
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(done.stdout)["data-dir"] == str(tmp_path / "state")
    # An operator's edits survive a second install.
    config.write_text(config.read_text() + '\n[log]\nlevel = "debug"\n')
    code, out, err = aa_here(capsys, *args)
    assert code == 0 and f"kept {config} as it is" in out, err
    assert 'level = "debug"' in config.read_text()
