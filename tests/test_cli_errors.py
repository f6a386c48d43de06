"""A user's mistakes on the command line, and what a mature tool does about them: one line on
stderr saying what is wrong and what to do, a non-zero status, never a traceback; quick
start-up; quiet broken pipes and Ctrl-C. Real `aa` processes against real routers."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
from support import ctrl_c_reaches, free_port_block, wait_for
from support.waits import patience

from aa.client import AsyncClient
from aa.mesh import StoreUnavailable
from aa.router import Router, RouterConfig, StoreConfig

AA = str(Path(sys.executable).with_name("aa"))


async def run_aa(
    *args: str, timeout: float = 30, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *prefix,
        AA,
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    async with asyncio.timeout(timeout):
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


def one_line(err: str, start: str) -> None:
    """*err* is exactly one line, starting with *start*, and no traceback."""
    assert "Traceback" not in err and "Task was destroyed" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(start), err


def listening() -> socket.socket:
    """A socket listening on a free loopback port (what another program holding it looks like)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def free_port_pair() -> int:
    """A port P with P and P + 1 both free just now (for a router and its derived HTTP port)."""
    return free_port_block(2)


# -- start-up -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["send", "--help"],
        ["subscribe", "--help"],
        ["mesh", "--help"],
        ["router", "--help"],
        ["container", "--help"],
    ],
)
def test_help_imports_nothing_heavy(argv):
    """`aa --help` and a simple command's --help import neither Aa's client, router, HTTP API
    nor asyncio: the subcommand's module is imported only when chosen, and lazily inside."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "aa.tools", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    heavy = {
        m
        for m in imported
        if m.split(".")[0] in ("asyncio", "fastapi", "msgpack", "sqlalchemy")
        or m.startswith(("aa.mesh", "aa.client", "aa.router", "aa.http_api", "aa.addins"))
    }
    assert not heavy, sorted(heavy)


def test_the_defaults_help_shows_are_the_librarys():
    """`aa router --help` shows defaults without importing the router (aa.tools.defaults)."""
    from dataclasses import fields

    from aa.addins import ContainerConfig
    from aa.http_api import DEFAULT_HTTP_PORT
    from aa.mesh import (
        ENV_INTERFACES,
        FORGET_AFTER,
        MAX_ROUTERS,
        RETRY_BASE,
        RETRY_MAX,
        DiscoveryConfig,
    )
    from aa.router import DEFAULT_PORT, CacheConfig, MeshConfig, StoreConfig
    from aa.tools import defaults

    def default(cls, name):
        return next(f.default for f in fields(cls) if f.name == name)

    assert (
        (defaults.DEFAULT_PORT, defaults.DEFAULT_HTTP_PORT)
        == (DEFAULT_PORT, DEFAULT_HTTP_PORT)
        == (7447, 7448)
    )
    assert default(DiscoveryConfig, "port") == defaults.DISCOVERY_PORT
    assert default(DiscoveryConfig, "broadcast_interval") == defaults.BROADCAST_INTERVAL
    assert defaults.ENV_INTERFACES == ENV_INTERFACES
    assert (defaults.RETRY_BASE, defaults.RETRY_MAX) == (RETRY_BASE, RETRY_MAX)
    assert defaults.FORGET_AFTER == FORGET_AFTER == default(MeshConfig, "forget_after")
    assert default(MeshConfig, "keepalive") == defaults.PEER_KEEPALIVE
    assert default(MeshConfig, "info_interval") == defaults.ROUTER_INFO_INTERVAL
    assert default(MeshConfig, "max_routers") == defaults.MAX_ROUTERS == MAX_ROUTERS
    assert default(CacheConfig, "mesh_cache_events") == defaults.MESH_CACHE_MAX_EVENTS
    assert default(CacheConfig, "sweep_interval") == defaults.CACHE_SWEEP_INTERVAL
    assert default(StoreConfig, "sync_interval") == defaults.STORE_SYNC_INTERVAL
    assert default(ContainerConfig, "poll_interval") == defaults.DEFAULT_POLL_INTERVAL


def test_help_starts_in_under_300_ms():
    """CPU time, not wall time: the machine running the tests may be busy with other jobs
    (wall ≈ CPU on an idle machine: `aa --help` has nothing to wait for)."""
    best = min(_cpu([AA, "--help"]) for _ in range(5))
    assert best < 0.3, f"aa --help took {best:.3f} s of CPU at best of 5"


def _cpu(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, capture_output=True, check=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


async def test_version():
    code, out, err = await run_aa("--version")
    assert (code, err) == (0, "")
    assert out in (
        f"aa {version('aa-mesh')} (compiled event path)\n",
        f"aa {version('aa-mesh')} (pure Python)\n",
    )


# -- aa router: ports ---------------------------------------------------------------------------


@pytest.mark.parametrize("verbose", [[], ["-v"]])
async def test_a_port_in_use_is_one_line(verbose: list[str]) -> None:
    # `make run` passes the router's -v (more log output): still one line, not a traceback
    with listening() as taken:
        port = taken.getsockname()[1]
        code, out, err = await run_aa("router", "--port", str(port), "--no-discovery", *verbose)
    assert code == 2 and out == ""
    one_line(err, f"aa router: port {port} is in use (")
    assert err.rstrip().endswith("pick another with --port")


async def test_the_http_port_is_the_next_one_and_in_use_is_one_line():
    with listening() as taken:
        http = taken.getsockname()[1]
        port = http - 1
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                pytest.skip(f"port {port} happens to be taken too")
        code, out, err = await run_aa("router", "--port", str(port), "--no-discovery")
    assert code == 2 and out == ""
    one_line(err, f"aa router: HTTP port {http} is in use (")
    assert "--http-port" in err and "--no-http" in err
    with socket.socket() as probe:  # nothing left bound by the router that gave up
        probe.bind(("127.0.0.1", port))


async def test_the_http_port_follows_the_routers_and_a_client_there_is_told_so_at_once():
    """Routers share a machine with the HTTP port after their own (7448 beside 7447). `aa
    send --router` with that HTTP port, an easy slip: the answer is HTTP, which read as a
    frame is 1.2 GB long. One line saying so, at once — not six warnings of a bad frame and,
    six seconds later, "is a router running there?". The router then stops cleanly on
    SIGTERM. (One router process for the three claims: its start is most of the time.)"""
    port = free_port_pair()
    proc = await asyncio.create_subprocess_exec(
        AA,
        "router",
        "--port",
        str(port),
        "--no-discovery",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(30):
            first = (await proc.stdout.readline()).decode()
            second = (await proc.stdout.readline()).decode()
        assert f"listening on 127.0.0.1:{port}" in first, first
        assert f"HTTP endpoint and monitor on http://127.0.0.1:{port + 1}/" in second, second
        started = time.monotonic()
        code, out, err = await run_aa("send", "--router", f"127.0.0.1:{port + 1}", "x=1")
        took = time.monotonic() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            _, router_err = await proc.communicate()
    assert code == 1 and out == ""
    one_line(err, "aa send: ")
    assert (
        "speaks HTTP" in err
        and "not its client port" in err
        and "is a router running there" not in err
    ), err
    assert took < 4, took
    assert proc.returncode == 0, router_err.decode()


async def test_a_host_not_of_this_machine_is_one_line():
    code, _, err = await run_aa("router", "--host", "192.0.2.1", "--port", "0", "--no-discovery")
    assert code == 2
    one_line(err, "aa router: cannot listen on 192.0.2.1 (not an address of this machine)")


@pytest.mark.parametrize(
    "flag, value, says",
    [
        ("--pattern-workers", "0", "aa router: --pattern-workers must be 1..64, not 0"),
        ("--probation-workers", "-1", "aa router: --probation-workers must be 0..64, not -1"),
        (
            "--store-sync-interval",
            "-1",
            "aa router: --store-sync-interval must be a number of seconds ≥ 0",
        ),
        (
            "--store-sync-interval",
            "nan",
            "aa router: --store-sync-interval must be a number of seconds ≥ 0",
        ),
    ],
)
async def test_a_number_out_of_range_is_one_line(flag, value, says):
    code, _, err = await run_aa("router", flag, value, "--port", "0", "--no-discovery")
    assert code == 2
    one_line(err, says)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to run as nobody"
)
async def test_a_data_folder_without_permission_is_one_line(tmp_path):
    tmp_path.chmod(0o755)
    folder = tmp_path / "data"  # nobody may not create it
    code, _, err = await run_aa(
        "router",
        "--port",
        "0",
        "--no-discovery",
        "--no-http",
        "--data-dir",
        str(folder),
        prefix=("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"),
    )
    assert code != 0
    one_line(err, "aa router: ")
    assert (
        str(folder) in err
        and "Permission denied" in err
        and "give a folder this user may write to" in err
    )


# -- clients: no router, bad input ---------------------------------------------------------------


async def test_send_to_no_router_is_one_line_at_once():
    """Nothing listens at the port: the command says so as soon as the connection is
    refused (it waited its whole 6 s connect timeout before, as if a router might start)."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"
        started = time.monotonic()
        code, out, err = await run_aa("send", "--router", endpoint, "Temperature=1")
        took = time.monotonic() - started
    assert code == 1 and out == ""
    one_line(
        err,
        f"aa send: {endpoint}: nothing listens there (connection refused); "
        "is a router running there?",
    )
    assert took < 4, took  # the interpreter's start and the imports; no connect timeout


async def test_a_bad_duration_is_one_line(router):
    code, _, err = await run_aa(
        "send", "--router", router.endpoint, "--persist", "--max-age", "3x", "--type", "t", "A=1"
    )
    assert code == 2
    one_line(err, "aa send: duration '3x' has an unknown unit 'x'")
    code, _, err = await run_aa(
        "subscribe", "--router", router.endpoint, "--since", "yesterday-ish"
    )
    assert code == 2
    one_line(err, "aa subscribe: cannot read time 'yesterday-ish': give ISO 8601")


async def test_a_script_file_that_is_not_there_is_one_line(router, tmp_path):
    code, _, err = await run_aa(
        "subscribe", "--router", router.endpoint, "--script", str(tmp_path / "nope.py")
    )
    assert code == 2
    one_line(
        err,
        f"aa subscribe: cannot read the script {tmp_path / 'nope.py'}: No such file or directory",
    )


@pytest.mark.skipif(
    any(os.path.exists(p) for p in ("/dev/log", "/var/run/syslog")),
    reason="this machine has a system log",
)
async def test_on_log_without_a_system_log_is_one_line(router):
    code, _, err = await run_aa("on", "--router", router.endpoint, "True", "--log")
    assert code == 2
    one_line(err, "aa on: no system log on this machine (no /dev/log")
    assert "--log-socket" in err


async def test_on_log_to_a_socket_that_is_not_there_is_one_line(router, tmp_path):
    code, _, err = await run_aa(
        "on", "--router", router.endpoint, "True", "--log", "--log-socket", str(tmp_path / "log")
    )
    assert code == 1
    one_line(
        err,
        f"aa on: cannot open the system log {tmp_path / 'log'}: No such file or directory; "
        "give another",
    )


# -- output: broken pipes, Ctrl-C ------------------------------------------------------------------


async def test_a_closed_pipe_is_quiet(router):
    """`aa mesh --json | head`: the reader went away before aa wrote."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = await asyncio.create_subprocess_exec(
            AA, "mesh", "--json", "--router", router.endpoint, stdout=w, stderr=subprocess.PIPE
        )
    finally:
        os.close(w)
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert err == b"", err.decode()
    assert proc.returncode == 141


async def test_ctrl_c_is_quiet(router):
    proc = await asyncio.create_subprocess_exec(
        AA,
        "subscribe",
        "--router",
        router.endpoint,
        "Go == 1",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=ctrl_c_reaches,
    )
    async with AsyncClient(router.endpoint) as pub:
        async with asyncio.timeout(30):  # it is subscribed once it printed an event
            line = b""
            while not line:
                await pub.publish({"Go": 1})
                try:
                    line = await asyncio.wait_for(proc.stdout.readline(), 0.2)
                except TimeoutError:
                    pass
    assert line == b"Go=1\n"
    proc.send_signal(signal.SIGINT)
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert err == b"", err.decode()
    assert proc.returncode == 130


# -- aa cache policy, aa send --persist ------------------------------------------------------------


async def test_cache_policy_changes_only_what_is_given(router):
    env = {"AA_CLIENT_ID": "policy-test"}
    code, _, err = await run_aa(
        "cache",
        "register",
        "--router",
        router.endpoint,
        "--max-age",
        "3h",
        "--max-count",
        "5",
        "A == 1",
        env=env,
    )
    assert code == 0, err
    code, out, err = await run_aa(
        "cache", "policy", "--router", router.endpoint, "--max-count", "10", env=env
    )
    assert code == 0, err
    info = json.loads(out)
    assert (info["max_age"], info["max_count"]) == (3 * 3600, 10)
    code, out, err = await run_aa(
        "cache", "policy", "--router", router.endpoint, "--max-age", "none", env=env
    )
    assert code == 0, err
    info = json.loads(out)
    assert (info["max_age"], info["max_count"]) == (None, 10)
    code, _, err = await run_aa("cache", "policy", "--router", router.endpoint, env=env)
    assert code == 2
    one_line(err, "aa cache: give --max-age, --max-count or both")


async def test_send_persist_reports_an_event_the_router_did_not_keep(tmp_path):
    """A store that cannot write (its SQLite file opened read-only) and has room for one event
    waiting: a second persisted event is refused. The router delivers it and says it did not
    keep it; `aa send` must not return 0, nor wait for an acknowledgement stuck behind the
    first event."""
    async with Router(RouterConfig(port=0, data_dir=tmp_path)):
        pass  # makes the database and its tables
    url = f"sqlite:///file:{tmp_path / 'events.db'}?mode=ro&uri=true"
    router = Router(RouterConfig(port=0, store=StoreConfig(url=url, max_pending=1, retry_max=0.1)))
    await router.start()
    try:
        first = await AsyncClient(router.endpoint).connect()
        try:
            first.publish_nowait({"A": 0}, type="t", meta={"persist": True})  # waits, never written
            store = router.storage.store
            assert store is not None
            await wait_for(lambda: store.stats().pending >= 1)
            code, out, err = await run_aa(
                "send",
                "--router",
                router.endpoint,
                "--persist",
                "--type",
                "t",
                "A=1",
                timeout=patience(8),  # a stuck acknowledgement would hold it far longer
            )
        finally:
            await first.aclose(timeout=0)
    finally:
        if router.storage.store is not None:  # it would wait 30 s for the write that cannot be
            with pytest.raises(StoreUnavailable):
                await router.storage.store.aclose(timeout=0.1)
        await router.aclose()
    assert code == 1 and out == ""
    one_line(err, "aa send: the router did not keep event ")
    assert "the store refused 1 event(s)" in err


async def test_send_persist_to_a_router_without_a_store_is_not_silent(router):
    code, out, err = await run_aa(
        "send", "--router", router.endpoint, "--persist", "--type", "t", "A=1"
    )
    assert code == 1 and out == ""
    one_line(err, "aa send: the router did not keep event ")
    assert "no store" in err


# -- an error nobody foresaw -----------------------------------------------------------------------


def test_an_error_no_command_handled_is_one_line(capsys):
    """What `aa` says for an exception that escaped its command (the traceback is for -v)."""
    from aa.mesh import AaTimeout, UsageError
    from aa.tools import common

    common.set_program("aa demo")
    try:
        cases = [
            (
                RuntimeError("boom"),
                1,
                "aa demo: unexpected error: RuntimeError: boom "
                "(run 'aa -v demo …' for the traceback)",
            ),
            (UsageError("--limit must be positive"), 2, "aa demo: --limit must be positive"),
            (
                AaTimeout("no router answered within 6.0 s (tried 127.0.0.1:1)"),
                1,
                "aa demo: no router answered within 6.0 s (tried 127.0.0.1:1); "
                "is a router running there? ('aa router' "
                "starts one; --router H:P or $AA_ROUTER names another)",
            ),
            (
                PermissionError(13, "Permission denied", "/srv/aa"),
                1,
                "aa demo: permission denied on /srv/aa: "
                "give a folder you may write to, or fix its permissions",
            ),
        ]
        for exc, code, line in cases:
            assert common.report(exc) == code
            assert capsys.readouterr().err == line + "\n"
    finally:
        common.set_program("aa")
